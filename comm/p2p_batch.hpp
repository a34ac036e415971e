// Batched point-to-point: torch.distributed.batch_isend_irecv. A group that can coalesce its
// sends and receives (C10dGroup over NCCL: c10d's startCoalescing / endCoalescing, one
// ncclGroupStart/End) implements P2PBatching; the free functions below take any group and post
// one by one where it cannot (gloo has no point-to-point coalescing).
//
// NCCL runs a coalesced batch on the group's own communicator and stream (c10d selects it for any
// point-to-point op inside a group, since other ranks may join the batch), while a lone send or
// recv gets a communicator of its own per pair of ranks. A message posted batched on one side
// must therefore be batched on the other: a caller batches every message of a group or none (the
// pipeline runtime decides once per run, the same on every rank).
#pragma once

#include <ATen/core/Tensor.h>

#include <string>
#include <vector>

#include "comm/group.hpp"

namespace zero::comm {

struct P2POp {
  bool send = true;  // false: receive into `tensor`
  at::Tensor tensor;
  int peer = -1;
  std::string what;
  int tag = 0;
};

class P2PBatching {
 public:
  virtual ~P2PBatching() = default;
  virtual bool coalesces_p2p() const = 0;
  // The ops in order, as one coalesced batch where coalesces_p2p() (every returned Work shares
  // its one Work), else one by one. One Work per op, in op order. A throw may leave part of the
  // batch posted (the error says how much): the group's point-to-point traffic then no longer
  // pairs up between the ranks, and the caller must not go on with it.
  virtual std::vector<Work> batch_p2p(std::vector<P2POp>& ops) = 0;
  // connect_peer for messages that will travel batched: where the group coalesces, the pair's
  // channel on the group's own communicator (the probe message batched).
  virtual void connect_peer_batched(int peer, bool sender, const std::string& what) = 0;
};

// Whether `g` coalesces point-to-point operations.
bool coalesces_p2p(const Group& g);
// `g`'s batch_p2p where it implements P2PBatching, else each op through send() / recv().
std::vector<Work> batch_p2p(Group& g, std::vector<P2POp>& ops);
// `g`'s connect_peer_batched where it implements P2PBatching, else connect_peer.
void connect_peer_batched(Group& g, int peer, bool sender, const std::string& what);

}  // namespace zero::comm
