#include "device/host_readback.hpp"

#include <ATen/ATen.h>
#include <c10/core/Event.h>
#include <c10/core/impl/VirtualGuardImpl.h>

#include "device/event_wait.hpp"

namespace zero {

HostReadback::HostReadback() = default;
HostReadback::~HostReadback() = default;
HostReadback::HostReadback(HostReadback&&) noexcept = default;
HostReadback& HostReadback::operator=(HostReadback&&) noexcept = default;

void HostReadback::start(const at::Tensor& values) {
  TORCH_CHECK(!pending_, "zero: HostReadback::start before the previous get(); this is a bug");
  pending_ = true;
  event_.reset();
  if (values.is_cpu()) {
    host_ = values.clone();
    return;
  }
  if (!host_.defined() || !host_.sizes().equals(values.sizes()) ||
      host_.scalar_type() != values.scalar_type()) {
    host_ = at::empty(values.sizes(), values.options().device(at::kCPU).pinned_memory(true));
  }
  host_.copy_(values, /*non_blocking=*/true);
  // Device-generic (c10::Event over the device's guard implementation): no CUDA header here.
  const c10::impl::VirtualGuardImpl guard(values.device().type());
  event_ = std::make_unique<c10::Event>(values.device().type());
  event_->record(guard.getStream(values.device()));
}

at::Tensor HostReadback::get() {
  TORCH_CHECK(pending_, "zero: HostReadback::get without start(); this is a bug");
  if (event_) {
    device::wait_for_event(*event_);
    event_.reset();
  }
  pending_ = false;
  return host_;
}

}  // namespace zero
