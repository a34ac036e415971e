// Built when torch has no CUDA: asking for NCCL is a clear error, not a link failure.
#include <c10/util/Exception.h>

#include "comm/backend.hpp"

namespace zero::comm {

c10::intrusive_ptr<c10d::Backend> make_nccl(const c10::intrusive_ptr<c10d::Store>&, int, int,
                                            const GroupOptions&, int,
                                            const c10::intrusive_ptr<c10d::Backend>&, int) {
  TORCH_CHECK(false,
              "zero: CUDA tensors need the NCCL backend, but this build of zero was compiled "
              "against a CPU-only torch. Rebuild with a CUDA build of torch.");
}

void nccl_wait(c10d::Work&) {
  TORCH_CHECK(false, "zero: an NCCL wait in a build without NCCL; this is a bug in zero");
}

bool nccl_available() { return false; }

int nccl_bound_device(const c10d::Backend&) { return -1; }

void nccl_use_bound_device(const c10d::Backend&) {}

void nccl_close(c10d::Backend&, bool) {}

void nccl_split_without_color(c10d::Backend&) {}

uint64_t nccl_split_counter(c10d::Backend&) { return 0; }

bool nccl_has_communicator(c10d::Backend&) { return false; }

}  // namespace zero::comm
