// A temporary handed to a collective by pointer, so that it is freed when its owner is done with
// it. c10d may keep a finished gloo collective's tensors after wait() returned: measured here, on
// some runs under load, a bucket's 1 MiB fp32 start-up staging was still allocated after
// initialize, for over 60 ms, until the next collective ran (which threads run what, and when,
// decides). A view without ownership leaves nothing to keep. Host tensors only: other devices'
// backends (NCCL) order frees by streams and are handed the tensor itself.
#pragma once

#include <ATen/core/Tensor.h>

namespace zero::comm {

class LentTensor {
 public:
  explicit LentTensor(at::Tensor owner);
  LentTensor(const LentTensor&) = delete;
  LentTensor& operator=(const LentTensor&) = delete;
  // Destroyed while an exception unwinds (a collective on it failed or timed out), the owner is
  // kept for the process's life: the collective may still write into it.
  ~LentTensor();

  // What the collective gets: the owner's memory, without a reference to it on the host.
  at::Tensor& lent() { return lent_; }
  const at::Tensor& owner() const { return owner_; }

 private:
  at::Tensor owner_;
  at::Tensor lent_;
  int exceptions_at_start_;
};

}  // namespace zero::comm
