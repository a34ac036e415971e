#include "zero/pipeline/runtime/p2p_queue.hpp"

#include <algorithm>
#include <utility>

namespace zero::pipeline {

void P2PQueue::issue(comm::Group& g, bool send, const at::Tensor& t, int peer,
                     const std::string& what, comm::Work* out) {
  if (!batched_) {
    at::Tensor handle = t;
    *out = send ? g.send(handle, peer, what) : g.recv(handle, peer, what);
    return;
  }
  queued_.push_back({&g, comm::P2POp{send, t, peer, what, 0}, out});
}

void P2PQueue::flush() {
  if (queued_.empty()) return;
  std::vector<Queued> q = std::move(queued_);
  queued_.clear();
  std::vector<comm::Group*> groups;  // in the order of their first operation
  for (const auto& e : q)
    if (std::find(groups.begin(), groups.end(), e.group) == groups.end()) groups.push_back(e.group);
  for (comm::Group* g : groups) {
    std::vector<comm::P2POp> ops;
    std::vector<comm::Work*> outs;
    for (auto& e : q) {
      if (e.group != g) continue;
      ops.push_back(std::move(e.op));
      outs.push_back(e.out);
    }
    std::vector<comm::Work> works = comm::batch_p2p(*g, ops);
    for (size_t i = 0; i < outs.size(); ++i) *outs[i] = std::move(works[i]);
  }
}

}  // namespace zero::pipeline
