// How the pipeline runtime posts its sends and receives: at once, one by one (gloo, and any run
// that does not batch), or queued and posted by flush() as one coalesced batch per group, each
// group's operations in the order they were queued (comm::batch_p2p; which operations go
// together and why: p2p_batches.hpp).
//
// A batch that throws may have gone out in part (on NCCL the group ends with the operations
// posted so far: review 2026-12-07b L1), and the groups queued after it are not posted (L2).
// Neither is silent: every operation the failed flush did not post for sure gets a Work that
// throws when waited on, naming the failure, and the queue stays failed (failure()), refusing
// every later issue and flush, since the peers' operations no longer pair with this rank's.
#pragma once

#include <ATen/core/Tensor.h>

#include <string>
#include <vector>

#include "comm/group.hpp"
#include "comm/p2p_batch.hpp"

namespace zero::pipeline {

class P2PQueue {
 public:
  explicit P2PQueue(bool batched = false) : batched_(batched) {}
  bool batched() const { return batched_; }
  // Posts a send (or a receive into `t`) on `g` and puts its Work into *out: now, or (batched)
  // at the next flush(). *out must stay where it is until then.
  void issue(comm::Group& g, bool send, const at::Tensor& t, int peer, const std::string& what,
             comm::Work* out);
  // Posts what is queued. Called before anything waits or computes.
  void flush();
  // Forgets what is queued (a step that failed before posting it). A failure stays.
  void clear() { queued_.clear(); }
  // Receives queued and not yet posted.
  size_t queued_receives() const;
  // Why a flush failed (what was lost with it); empty while none did.
  const std::string& failure() const { return failure_; }

 private:
  struct Queued {
    comm::Group* group;
    comm::P2POp op;
    comm::Work* out;
  };
  bool batched_;
  std::vector<Queued> queued_;
  std::string failure_;
};

}  // namespace zero::pipeline
