#include <c10/cuda/CUDAException.h>
#include <cuda_runtime_api.h>

#include "device/page_lock.hpp"

namespace zero::device::detail {
namespace {

// cudaHostAlloc at the size asked, as CachingHostAllocator does for each block it makes, minus
// its power-of-two rounding. Page-locked memory is usable by every device of the process
// (unified addressing), and is_pinned() recognises it (cudaPointerGetAttributes).
void* cuda_allocate(size_t bytes) {
  void* p = nullptr;
  C10_CUDA_CHECK(cudaHostAlloc(&p, bytes, cudaHostAllocDefault));
  return p;
}

// Warns rather than throws: this runs in a tensor's deleter, possibly at exit.
void cuda_release(void* p) { C10_CUDA_CHECK_WARN(cudaFreeHost(p)); }

}  // namespace

std::optional<PageLocker> builtin_page_locker(c10::DeviceType type) {
  if (type != c10::DeviceType::CUDA) return std::nullopt;
  return PageLocker{&cuda_allocate, &cuda_release};
}

}  // namespace zero::device::detail
