#include "zero/grads/grad_to_host.hpp"

#include <ATen/ATen.h>

#include <algorithm>

#include "optim/cpu_adamw.hpp"
#include "zero/grads/grad_sync.hpp"

namespace zero {
namespace {

// One more slot than the two bucket buffers (partitioned_grads.cpp's pool): the host then waits
// for a copy only once two newer ones were queued behind it, by when it has usually finished.
constexpr int kSlots = 3;

}  // namespace

GradToHost::GradToHost(at::Device device, int64_t slot_numel, at::ScalarType comm_dtype,
                       at::ScalarType accum_dtype)
    : engine_(device::make_copy_engine(device)), accum_dtype_(accum_dtype) {
  for (int i = 0; i < kSlots; ++i) {
    // Page-locked whatever offload_optimizer.pin_memory says (it is about the shard and the
    // optimizer state): a device-to-host copy into pageable memory makes the host wait for it.
    // host_zeros pins only where an accelerator is reachable.
    slots_.push_back(device::host_zeros(slot_numel, /*pin=*/true, comm_dtype));
    free_.push_back(kSlots - 1 - i);
  }
}

GradToHost::Ticket GradToHost::send(const at::Tensor& reduced, const at::Tensor& dst, bool add) {
  TORCH_INTERNAL_ASSERT(reduced.numel() == dst.numel() && reduced.numel() <= slots_[0].numel());
  const int64_t n = reduced.numel();
  const auto [range, first] = written_.emplace(dst.storage_offset(), n);
  TORCH_INTERNAL_ASSERT(range->second == n, "zero: a gradient piece overlaps another");
  if (!add || first) return send_direct(reduced, dst, add);
  norm_complete_ = false;  // the range's value is summed on the host
  // The oldest copy in flight may be a direct one, which frees no slot: land until one is free
  // (every slot not free is in pending_, so this ends).
  while (free_.empty()) land_oldest();
  const int slot = free_.back();
  free_.pop_back();
  Ticket t = engine_->copy_into_host(slots_[slot].narrow(0, 0, n), reduced);
  pending_.push_back({slot, n, dst, add, t, at::Tensor()});
  return t;
}

GradToHost::Ticket GradToHost::send_direct(const at::Tensor& reduced, const at::Tensor& dst,
                                           bool add) {
  // The values the slot path gives: accumulate() into a zero fp32 range computes 0 + x in fp32
  // (which turns -0 into +0) and rounds to grad_accum_dtype; a copy converts exactly.
  const auto as_first_sum = [this](at::Tensor& v) {
    v.add_(0.0);
    if (accum_dtype_ != v.scalar_type()) v.copy_(v.to(accum_dtype_));
  };
  if (reduced.is_cpu()) {  // the host is the device: no copy to overlap, no temporary
    at::Tensor d = dst;
    d.copy_(reduced);
    if (add) as_first_sum(d);
    norm_complete_ = false;  // a CPU run: the step's host norm, as before
    return nullptr;
  }
  // fp32 on the device (bf16 -> fp32 is exact), so the host only receives. The temporary is
  // kept until its copy ran; at most kSlots of them are in flight.
  at::Tensor src = reduced;
  if (add || reduced.scalar_type() != at::kFloat) {
    src = reduced.to(at::kFloat, /*non_blocking=*/false, /*copy=*/true);
    if (add) as_first_sum(src);
  }
  const at::Tensor part =
      at::linalg_vector_norm(src, 2, {}, false, at::kFloat).square().reshape({1});
  squared_norm_ = squared_norm_.defined() ? squared_norm_.add_(part) : part;
  const auto direct = [this] {
    return std::count_if(pending_.begin(), pending_.end(),
                         [](const Pending& p) { return p.slot < 0; });
  };
  while (direct() >= kSlots) land_oldest();
  Ticket t = engine_->copy_into_host(dst, src);
  pending_.push_back({-1, reduced.numel(), dst, add, t, src});
  return t;
}

void GradToHost::land_oldest() {
  Pending p = std::move(pending_.front());
  pending_.pop_front();
  // The one host sync of this path: the slot's data is needed now (or, for a direct copy, its
  // device temporary may go).
  engine_->synchronize(p.ticket);
  if (p.slot < 0) return;
  const at::Tensor got = slots_[p.slot].narrow(0, 0, p.numel);
  if (p.add) {
    accumulate(p.dst, got, accum_dtype_);
  } else {
    p.dst.copy_(got);
  }
  free_.push_back(p.slot);
}

void GradToHost::finish(const at::Tensor& shard) {
  while (!pending_.empty()) land_oldest();
  // What no piece wrote in this window (padding; every bucket is reduced every window) is zero.
  int64_t covered = 0;
  const int64_t base = shard.storage_offset();
  for (const auto& [offset, numel] : written_) {
    const int64_t begin = offset - base;
    if (begin > covered) shard.narrow(0, covered, begin - covered).zero_();
    covered = std::max(covered, begin + numel);
  }
  if (covered < shard.numel()) shard.narrow(0, covered, shard.numel() - covered).zero_();
}

void GradToHost::abort() {
  for (const Pending& p : pending_) {
    engine_->synchronize(p.ticket);
    if (p.slot >= 0) free_.push_back(p.slot);
  }
  pending_.clear();
  new_window();
}

int64_t GradToHost::pinned_bytes() const {
  int64_t n = 0;
  for (const auto& s : slots_) n += device::host_bytes(s);
  return n;
}

int64_t GradToHost::ring_bytes(int64_t slot_numel, at::ScalarType comm_dtype) {
  return kSlots * slot_numel * static_cast<int64_t>(c10::elementSize(comm_dtype));
}

int64_t GradToHost::bytes() const {
  int64_t n = 0;
  for (const auto& s : slots_) n += s.nbytes();
  return n;
}

}  // namespace zero
