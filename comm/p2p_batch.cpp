#include "comm/p2p_batch.hpp"

namespace zero::comm {

bool coalesces_p2p(const Group& g) {
  const auto* b = dynamic_cast<const P2PBatching*>(&g);
  return b && b->coalesces_p2p();
}

std::vector<Work> batch_p2p(Group& g, std::vector<P2POp>& ops) {
  if (auto* b = dynamic_cast<P2PBatching*>(&g)) return b->batch_p2p(ops);
  std::vector<Work> works;
  works.reserve(ops.size());
  for (auto& op : ops)
    works.push_back(op.send ? g.send(op.tensor, op.peer, op.what, op.tag)
                            : g.recv(op.tensor, op.peer, op.what, op.tag));
  return works;
}

void connect_peer_batched(Group& g, int peer, bool sender, const std::string& what) {
  if (auto* b = dynamic_cast<P2PBatching*>(&g)) return b->connect_peer_batched(peer, sender, what);
  g.connect_peer(peer, sender, what);
}

}  // namespace zero::comm
