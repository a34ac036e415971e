#include "zero/grad_to_host.hpp"

#include <ATen/ATen.h>

#include "optim/cpu_adamw.hpp"
#include "zero/grad_sync.hpp"

namespace zero {
namespace {

// One more slot than the two bucket buffers (partitioned_grads.cpp's pool): the host then waits
// for a copy only once two newer ones were queued behind it, by when it has usually finished.
constexpr int kSlots = 3;

}  // namespace

GradToHost::GradToHost(at::Device device, int64_t slot_numel, at::ScalarType comm_dtype,
                       at::ScalarType accum_dtype)
    : engine_(offload_detail::make_copy_engine(device)), accum_dtype_(accum_dtype) {
  for (int i = 0; i < kSlots; ++i) {
    // Page-locked whatever offload_optimizer.pin_memory says (it is about the shard and the
    // optimizer state): a device-to-host copy into pageable memory makes the host wait for it.
    // host_zeros pins only where an accelerator is reachable.
    slots_.push_back(optim::host_zeros(slot_numel, /*pin=*/true, comm_dtype));
    free_.push_back(kSlots - 1 - i);
  }
}

GradToHost::Ticket GradToHost::send(const at::Tensor& reduced, const at::Tensor& dst, bool add) {
  TORCH_INTERNAL_ASSERT(reduced.numel() == dst.numel() && reduced.numel() <= slots_[0].numel());
  if (free_.empty()) land_oldest();
  const int slot = free_.back();
  free_.pop_back();
  const int64_t n = reduced.numel();
  Ticket t = engine_->copy_into_host(slots_[slot].narrow(0, 0, n), reduced);
  pending_.push_back({slot, n, dst, add, t});
  return t;
}

void GradToHost::land_oldest() {
  Pending p = std::move(pending_.front());
  pending_.pop_front();
  // The one host sync of this path: the slot's data is needed now.
  engine_->synchronize(p.ticket);
  const at::Tensor got = slots_[p.slot].narrow(0, 0, p.numel);
  if (p.add) {
    accumulate(p.dst, got, accum_dtype_);
  } else {
    p.dst.copy_(got);
  }
  free_.push_back(p.slot);
}

void GradToHost::finish() {
  while (!pending_.empty()) land_oldest();
}

void GradToHost::abort() {
  for (const Pending& p : pending_) {
    engine_->synchronize(p.ticket);
    free_.push_back(p.slot);
  }
  pending_.clear();
}

int64_t GradToHost::pinned_bytes() const {
  int64_t n = 0;
  for (const auto& s : slots_) n += optim::host_bytes(s);
  return n;
}

int64_t GradToHost::bytes() const {
  int64_t n = 0;
  for (const auto& s : slots_) n += s.nbytes();
  return n;
}

}  // namespace zero
