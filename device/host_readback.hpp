// A few device values copied to the host without stalling the device's queue.
//
// start() queues a copy into pinned host memory on the current stream and records an event
// after it; get() waits for that event only, i.e. for the work queued up to the copy, not for
// whatever the host queued since. Read one step late (as the engine does), that work has long
// finished and get() does not wait at all. On CPU the values are already there: ready() is true
// at once, so the engine reports a step's outcome immediately.
#pragma once

#include <ATen/core/Tensor.h>

#include <memory>

namespace c10 {
class Event;
}

namespace zero {

class HostReadback {
 public:
  HostReadback();
  ~HostReadback();
  HostReadback(HostReadback&&) noexcept;
  HostReadback& operator=(HostReadback&&) noexcept;

  void start(const at::Tensor& values);
  bool pending() const { return pending_; }
  // True when get() would not wait on the device (CPU tensors).
  bool ready() const { return pending_ && !event_; }
  // The values as a CPU tensor (valid until the next start()); clears pending().
  at::Tensor get();

 private:
  // Reused by every start() (get() has waited for the previous copy by then): allocating pinned
  // memory each time could synchronise the device.
  at::Tensor host_;
  std::unique_ptr<c10::Event> event_;
  bool pending_ = false;
};

}  // namespace zero
