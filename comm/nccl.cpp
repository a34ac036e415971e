// NCCL: the CUDA backend, compiled only when torch has CUDA (see comm/CMakeLists.txt).
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>

#include "comm/backend.hpp"

namespace zero::comm {

c10::intrusive_ptr<c10d::Backend> make_nccl(const c10::intrusive_ptr<c10d::Store>& store, int rank,
                                            int size, const GroupOptions& opts) {
  auto o = c10d::ProcessGroupNCCL::Options::create();
  o->timeout = opts.timeout;
  return c10::make_intrusive<c10d::ProcessGroupNCCL>(store, rank, size, o);
}

bool nccl_available() { return true; }

}  // namespace zero::comm
