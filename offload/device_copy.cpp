// Built when LibTorch has CUDA: copies between device memory and pinned host memory on one
// dedicated stream per device, so that they overlap the kernels of the compute stream.
#include <ATen/ATen.h>
#include <c10/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "offload/copy_engine.hpp"

namespace zero::offload_detail {
namespace {

using Event = c10::cuda::CUDAEvent;

Event* as_event(const Ticket& ticket) { return static_cast<Event*>(ticket.get()); }

class CudaCopyEngine final : public CopyEngine {
 public:
  explicit CudaCopyEngine(c10::Device device)
      : device_(device),
        copy_stream_(c10::cuda::getStreamFromPool(/*isHighPriority=*/false, device.index())) {}

  Copy to_host_async(const at::Tensor& src) override {
    c10::cuda::CUDAGuard guard(device_);
    // `src` may still be being written by kernels queued on the compute stream.
    copy_stream_waits_for_compute();
    // Pinned, or the copy below would be synchronous. Freeing this buffer early is safe: for
    // non-blocking copies the CUDA copy kernel records an event with the caching host
    // allocator, which then delays reusing the block until the copy finished.
    at::Tensor host = at::empty(
        src.sizes(),
        at::TensorOptions().dtype(src.scalar_type()).device(at::kCPU).pinned_memory(true));
    auto done = std::make_shared<Event>();
    {
      c10::cuda::CUDAStreamGuard on_copy_stream(copy_stream_);
      host.copy_(src, /*non_blocking=*/true);
      done->record(copy_stream_);
    }
    // The caller keeps `src` until `done` has fired (CopyEngine::ready): `src` belongs to the
    // compute stream's pool, and once freed the caching allocator would hand it to the next
    // compute kernel immediately, which could overwrite it while this stream is still reading.
    return {host, done};
  }

  Ticket copy_into_host(const at::Tensor& dst, const at::Tensor& src) override {
    c10::cuda::CUDAGuard guard(device_);
    // `src` is written by work on the current stream (or by a collective the current stream
    // was made to wait for): the copy stream starts reading only after that.
    copy_stream_waits_for_compute();
    auto done = std::make_shared<Event>();
    {
      c10::cuda::CUDAStreamGuard on_copy_stream(copy_stream_);
      // Asynchronous only into page-locked memory; into pageable memory CUDA stages it and the
      // host waits, which is correct but does not overlap.
      dst.copy_(src, /*non_blocking=*/true);
      // The host waits on this before reading `dst` (synchronize); the current stream waits on
      // it (wait) before anything overwrites `src`.
      done->record(copy_stream_);
    }
    return done;
  }

  Copy to_device_async(const at::Tensor& host) override {
    c10::cuda::CUDAGuard guard(device_);
    // Allocated on the compute stream, which consumes it. That pool may return memory whose
    // last kernels on the compute stream have not run yet, so the copy waits for them.
    at::Tensor dst = at::empty(host.sizes(), host.options().device(device_));
    copy_stream_waits_for_compute();
    auto done = std::make_shared<Event>();
    {
      c10::cuda::CUDAStreamGuard on_copy_stream(copy_stream_);
      dst.copy_(host, /*non_blocking=*/true);
      done->record(copy_stream_);
    }
    // If `dst` is dropped unconsumed (reset() with a prefetch in flight), its memory must not go
    // back to the compute stream while this stream may still be writing it.
    dst.record_stream(copy_stream_);
    return {dst, done};
  }

  void wait(const Ticket& ticket) override {
    if (ticket) as_event(ticket)->block(c10::cuda::getCurrentCUDAStream(device_.index()));
  }
  bool ready(const Ticket& ticket) override { return !ticket || as_event(ticket)->query(); }
  void synchronize(const Ticket& ticket) override {
    if (ticket) as_event(ticket)->synchronize();
  }

 private:
  void copy_stream_waits_for_compute() {
    // Destroying a recorded event right away is fine: the wait it queued stays in effect.
    Event produced;
    produced.record(c10::cuda::getCurrentCUDAStream(device_.index()));
    produced.block(copy_stream_);
  }

  c10::Device device_;
  c10::cuda::CUDAStream copy_stream_;
};

}  // namespace

std::unique_ptr<CopyEngine> make_copy_engine(c10::Device device) {
  if (device.is_cpu()) return make_host_copy_engine();
  TORCH_CHECK(device.is_cuda(), "ActivationOffloader: cannot offload tensors on ", device,
              "; only CUDA and CPU tensors are supported.");
  if (!device.has_index()) device = c10::Device(c10::kCUDA, c10::cuda::current_device());
  return std::make_unique<CudaCopyEngine>(device);
}

}  // namespace zero::offload_detail
