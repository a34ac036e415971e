// The device-specific half of host <-> device copies, behind one small interface so that the
// bookkeeping (activation_offloader.cpp, and the gradient shard's trip to the host under optimizer
// offload, zero/grads/grad_to_host.cpp) is the same code on CPU-only and CUDA builds. host_copy.cpp
// serves CPU tensors; device_copy.cpp every other device type through c10's generic streams and
// events (CUDA on a GPU, the tests' fake accelerator in CI).
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <memory>

namespace zero::device {

// An opaque handle on one copy in flight; null means the copy has already finished.
using Ticket = std::shared_ptr<void>;

struct Copy {
  at::Tensor dst;  // contiguous; not to be read before wait()/ready() says the copy finished
  Ticket ticket;
};

class CopyEngine {
 public:
  virtual ~CopyEngine() = default;
  // Copies `src` (on this engine's device) into a fresh host buffer. The caller keeps `src` alive
  // until ready(ticket): device memory freed earlier could be reused while still being read.
  virtual Copy to_host_async(const at::Tensor& src) = 0;
  // Copies `src` (on this engine's device) into the existing host buffer `dst` (same numel and
  // dtype; page-locked, or the copy cannot overlap anything), after the work queued so far on the
  // current stream: a collective whose wait() ordered the current stream after it is included.
  // Until the copy finished (synchronize/ready), `dst` must not be read and `src` must not be
  // written: the caller orders the next writer of `src` after it with wait(ticket).
  virtual Ticket copy_into_host(const at::Tensor& dst, const at::Tensor& src) = 0;
  // Copies a buffer from to_host_async back to this engine's device.
  virtual Copy to_device_async(const at::Tensor& host) = 0;
  // Copies the host buffer `src` (page-locked, or the copy cannot overlap anything) into the
  // existing buffer `dst` on this engine's device (same numel and dtype), after the work queued so
  // far on the current stream (which may still read `dst`). Until the copy finished, `src` must
  // not be written (synchronize/ready) and `dst` must not be read: the caller orders the reader
  // after it with wait(ticket).
  virtual Ticket copy_to_device(const at::Tensor& dst, const at::Tensor& src) = 0;
  // Orders the current stream after the copy: work enqueued from now on may use its dst.
  virtual void wait(const Ticket& ticket) = 0;
  // Host-side poll: has the copy finished (so its source may be released)?
  virtual bool ready(const Ticket& ticket) = 0;
  // Blocks the calling thread until the copy has finished.
  virtual void synchronize(const Ticket& ticket) = 0;
};

// Host "device": copies are synchronous clones into separate buffers. Used for CPU tensors on
// every build, so CPU-only builds exercise the whole offload path.
std::unique_ptr<CopyEngine> make_host_copy_engine();

// The engine for tensors on `device`; errors for devices this build cannot copy from.
std::unique_ptr<CopyEngine> make_copy_engine(c10::Device device);

}  // namespace zero::device
