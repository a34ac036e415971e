// Copies between device memory and pinned host memory on one dedicated stream per device, so
// that they overlap the kernels of the compute stream. Written against c10's device-generic
// interface (c10::Stream, c10::Event and the device type's guard implementation, which CUDA and
// every registered backend provide), so the same code serves CUDA on a GPU and the tests' fake
// accelerator in CI: the stream and event logic of the GPU path runs without a GPU.
#include <ATen/ATen.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/Event.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/VirtualGuardImpl.h>

#include "device/copy_engine.hpp"
#include "device/event_wait.hpp"

namespace zero::device {
namespace {

using Event = c10::Event;

Event* as_event(const Ticket& ticket) { return static_cast<Event*>(ticket.get()); }

class StreamCopyEngine final : public CopyEngine {
 public:
  explicit StreamCopyEngine(c10::Device device)
      : device_(device),
        impl_(device.type()),
        copy_stream_(impl_.getStreamFromGlobalPool(device, /*isHighPriority=*/false)) {}

  Copy to_host_async(const at::Tensor& src) override {
    const c10::DeviceGuard guard(device_);
    // `src` may still be being written by kernels queued on the compute stream.
    copy_stream_waits_for_compute();
    // Pinned, or the copy below would be synchronous. Freeing this buffer early is safe: for
    // non-blocking copies the CUDA copy kernel records an event with the caching host
    // allocator, which then delays reusing the block until the copy finished.
    at::Tensor host = at::empty(
        src.sizes(),
        at::TensorOptions().dtype(src.scalar_type()).device(at::kCPU).pinned_memory(true));
    auto done = std::make_shared<Event>(device_.type());
    {
      const c10::StreamGuard on_copy_stream(copy_stream_);
      host.copy_(src, /*non_blocking=*/true);
      done->record(copy_stream_);
    }
    // The caller keeps `src` until `done` has fired (CopyEngine::ready): `src` belongs to the
    // compute stream's pool, and once freed the caching allocator would hand it to the next
    // compute kernel immediately, which could overwrite it while this stream is still reading.
    return {host, done};
  }

  Ticket copy_into_host(const at::Tensor& dst, const at::Tensor& src) override {
    // `src` is written by work on the current stream (or by a collective the current stream
    // was made to wait for): the copy stream starts reading only after that. The host waits on
    // the ticket before reading `dst` (synchronize); the current stream waits on it (wait)
    // before anything overwrites `src`. Asynchronous only into page-locked memory.
    return ordered_copy(dst, src);
  }

  Copy to_device_async(const at::Tensor& host) override {
    const c10::DeviceGuard guard(device_);
    // Allocated on the compute stream, which consumes it. That pool may return memory whose
    // last kernels on the compute stream have not run yet, so the copy waits for them.
    at::Tensor dst = at::empty(host.sizes(), host.options().device(device_));
    copy_stream_waits_for_compute();
    auto done = std::make_shared<Event>(device_.type());
    {
      const c10::StreamGuard on_copy_stream(copy_stream_);
      dst.copy_(host, /*non_blocking=*/true);
      done->record(copy_stream_);
    }
    // If `dst` is dropped unconsumed (reset() with a prefetch in flight), its memory must not go
    // back to the compute stream while this stream may still be writing it (record_stream).
    impl_.recordDataPtrOnStream(dst.storage().data_ptr(), copy_stream_);
    return {dst, done};
  }

  Ticket copy_to_device(const at::Tensor& dst, const at::Tensor& src) override {
    // `dst` may still be read by kernels queued on the current stream (the parameters that the
    // last backward used): the copy stream writes it only after them. The reader of `dst` waits
    // on the ticket (wait); the host before rewriting `src` (synchronize). `dst` needs no
    // record_stream: it is long-lived, and its reader's stream waits on the ticket, so memory
    // freed later on that stream is reused only after this copy. Asynchronous only from
    // page-locked memory.
    return ordered_copy(dst, src);
  }

  void wait(const Ticket& ticket) override {
    if (ticket) as_event(ticket)->block(impl_.getStream(device_));
  }
  bool ready(const Ticket& ticket) override { return !ticket || as_event(ticket)->query(); }
  void synchronize(const Ticket& ticket) override {
    if (ticket) wait_for_event(*as_event(ticket));
  }

 private:
  // Copies `src` into the existing `dst` on the copy stream, after the work queued so far on
  // the current stream; the ticket fires when the copy is done. From or into pageable memory
  // CUDA stages the copy and the host waits: correct, but it does not overlap.
  Ticket ordered_copy(const at::Tensor& dst, const at::Tensor& src) {
    const c10::DeviceGuard guard(device_);
    copy_stream_waits_for_compute();
    auto done = std::make_shared<Event>(device_.type());
    const c10::StreamGuard on_copy_stream(copy_stream_);
    dst.copy_(src, /*non_blocking=*/true);
    done->record(copy_stream_);
    return done;
  }

  void copy_stream_waits_for_compute() {
    // Destroying a recorded event right away is fine: the wait it queued stays in effect.
    Event produced(device_.type());
    produced.record(impl_.getStream(device_));
    produced.block(copy_stream_);
  }

  c10::Device device_;
  c10::impl::VirtualGuardImpl impl_;
  c10::Stream copy_stream_;
};

}  // namespace

std::unique_ptr<CopyEngine> make_copy_engine(c10::Device device) {
  if (device.is_cpu()) return make_host_copy_engine();
  TORCH_CHECK(c10::impl::hasDeviceGuardImpl(device.type()),
              "ActivationOffloader: cannot offload tensors on ", device,
              ": this LibTorch has no such device (a CUDA tensor needs a CUDA build of torch). "
              "Rebuild against a wheel with that device, or checkpoint without "
              "CheckpointOptions::offload.");
  if (!device.has_index()) {
    device =
        c10::Device(device.type(), c10::impl::VirtualGuardImpl(device.type()).getDevice().index());
  }
  return std::make_unique<StreamCopyEngine>(device);
}

}  // namespace zero::device
