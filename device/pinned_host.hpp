// Host buffers of optimizer offload (master shard, moments, gradient shard, compute-dtype copy,
// the gradient ring), page-locked where an accelerator can copy from them asynchronously, and
// sized exactly.
//
// Why not at::empty(..., pinned_memory(true)) for everything: the accelerator's caching host
// allocator (CUDA's CachingHostAllocator) rounds each request up to a power of two and keeps the
// block when its tensor dies. That suits the many short-lived staging copies it was written for;
// for offload's long-lived multi-GB shards it wastes up to half of each block (an H200 run held
// 36.4 GiB pinned for 23.15 GiB of host tensors). So blocks from kExactPinnedMinBytes up are
// page-locked at their own size, rounded to a page, through the device family's page locker
// (cudaHostAlloc on CUDA), and given back when the tensor dies; smaller ones still come from the
// caching allocator, where rounding costs less than kExactPinnedMinBytes a block and reuse pays.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/DeviceType.h>
#include <c10/core/ScalarType.h>

#include <cstddef>
#include <cstdint>

namespace zero::device {

constexpr int64_t kExactPinnedMinBytes = int64_t{1} << 20;
constexpr int64_t kHostPageBytes = 4096;

// How a device family page-locks host memory at an exact size.
struct PageLocker {
  // Page-locked host memory of `bytes` (a multiple of kHostPageBytes) that the device type's
  // is_pinned() recognises; throws when it cannot.
  void* (*allocate)(size_t bytes) = nullptr;
  void (*release)(void* p) = nullptr;
};
// The page locker for `type`: an out-of-tree backend's (the tests' fake accelerator registers
// one). CUDA's is built in on CUDA builds (page_lock_cuda.cpp). Device types without one get
// the caching allocator's rounded blocks.
void register_page_locker(c10::DeviceType type, PageLocker locker);

// A zero-filled host tensor, page-locked when `pin` and this process can reach an accelerator.
at::Tensor host_zeros(int64_t numel, bool pin, at::ScalarType dtype = at::kFloat);
// The host bytes `t` really holds: its size; a page-rounded exact block's page-rounded size; a
// block from the caching host allocator its power of two (CachingHostAllocator's rounding, below
// pinned_max_round_threshold_mb on torch >= 2.13).
int64_t host_bytes(const at::Tensor& t);
// Bytes in exact-size page-locked blocks alive now, in this process.
int64_t exact_pinned_bytes();

}  // namespace zero::device
