// NCCL: the CUDA backend, compiled only when torch has CUDA (see comm/CMakeLists.txt).
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>

#include "comm/backend.hpp"

namespace zero::comm {

// The communication stream: ProcessGroupNCCL runs every collective on its own per-device NCCL
// stream, and before launching records an event on the caller's current (compute) stream and
// makes the NCCL stream wait on it, so a bucket's reduce-scatter starts only after the kernels
// that filled the bucket, with no host synchronisation. nccl_wait() below makes the compute
// stream wait on the collective's end event in turn. That is the stream/event protocol ZeRO
// overlap needs, so the engine adds no stream of its own; the bucket buffers stay alive in the
// engine's pipeline until their work is waited on, which is what record_stream would otherwise
// ensure.
//
// Bounding the wait: c10d's WorkNCCL::wait(timeout) with a timeout busy-waits the *host* (1 ms
// sleeps until the GPU finished), which would stall backward mid-pass every time a bucket
// buffer is reused. So the timeout goes into Options::timeout instead: the process group's
// watchdog thread checks every collective against it and, on expiry, aborts the communicator
// and ends the process (TORCH_NCCL_ASYNC_ERROR_HANDLING's default), so a dead peer still ends
// the run with c10d's message naming the collective, never a hang.
c10::intrusive_ptr<c10d::Backend> make_nccl(const c10::intrusive_ptr<c10d::Store>& store, int rank,
                                            int size, const GroupOptions& opts) {
  auto o = c10d::ProcessGroupNCCL::Options::create();
  o->timeout = opts.timeout;
  return c10::make_intrusive<c10d::ProcessGroupNCCL>(store, rank, size, o);
}

// No timeout argument: WorkNCCL::wait() then only orders the current stream after the
// collective (synchronize()) and returns; it rethrows an error the watchdog already recorded.
void nccl_wait(c10d::Work& work) { work.wait(); }

bool nccl_available() { return true; }

}  // namespace zero::comm
