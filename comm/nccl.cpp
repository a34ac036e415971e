// NCCL: the CUDA backend, compiled only when torch has CUDA (see comm/CMakeLists.txt).
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>

#include "comm/backend.hpp"

namespace zero::comm {

// The communication stream: ProcessGroupNCCL runs every collective on its own per-device NCCL
// stream, and before launching records an event on the caller's current (compute) stream and
// makes the NCCL stream wait on it, so a bucket's reduce-scatter starts only after the kernels
// that filled the bucket, with no host synchronisation. Work::wait() (comm/group.cpp) makes
// the compute stream wait on the collective's end event in turn, again without blocking the
// host (blocking wait stays off). That is exactly the stream/event protocol ZeRO overlap needs,
// so the engine adds no stream of its own; the bucket buffers stay alive in the engine's
// pipeline until their work is waited on, which is what record_stream would otherwise ensure.
c10::intrusive_ptr<c10d::Backend> make_nccl(const c10::intrusive_ptr<c10d::Store>& store, int rank,
                                            int size, const GroupOptions& opts) {
  auto o = c10d::ProcessGroupNCCL::Options::create();
  o->timeout = opts.timeout;
  return c10::make_intrusive<c10d::ProcessGroupNCCL>(store, rank, size, o);
}

bool nccl_available() { return true; }

}  // namespace zero::comm
