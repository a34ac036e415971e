// A fake accelerator for tests: PyTorch's open registration (the PrivateUse1 device type, named
// "fake"), as PyTorch's own test/cpp_extensions/open_registration_extension.cpp does it. Its
// memory is host memory behind a counting allocator; its kernels are the CPU's, reached through
// at::native::cpu_fallback; streams and events exist and complete at once (or after a delay).
//
// What it is for: the engine runs with parameters that are *not* CPU tensors, so every path that
// differs between host and device (pinned staging, copy streams, events, the device read-back,
// collectives staged through the host) runs in CI, and a host/device mix-up throws as it would on
// a GPU ("Expected all tensors to be on the same device"). Its allocator counts exactly, per
// device index, like CUDA's memory_allocated / max_memory_allocated, and is reached the generic
// way (c10::getDeviceAllocator(PrivateUse1)->getDeviceStats), as zero::allocated_bytes does.
//
// What it cannot catch: host code that reads a device tensor's data_ptr() directly works here
// (the memory is host memory) where it would fault on a GPU.
#pragma once

#include <c10/core/Device.h>

#include <chrono>
#include <cstdint>

namespace zero::testing::fake {

// Registers the backend (once per process) and returns fake:`index`. Ranks that run as threads
// take one index each, as ranks on a GPU machine take one GPU each: the autograd engine runs one
// thread per device, so two ranks on one index would share it (and deadlock on a collective).
c10::Device device(int index = 0);
constexpr int kDevices = 8;

// The allocator's figures for fake:`index`, exact to the byte: live tensor bytes now, and the
// most since the last reset_peak(index).
int64_t allocated_bytes(int index);
int64_t peak_bytes(int index);
void reset_peak(int index);
// Allocations on fake:`index` so far (take differences): all of them, or (bytes >= 0) those of
// exactly `bytes` bytes. What a CUDA run would ask the caching allocator for, block by block.
int64_t allocations(int index, int64_t bytes = -1);
// The fake never frees a cache and retries (nothing is cached), so its num_alloc_retries
// (DeviceStats, CUDA's "cudaMalloc retries") is whatever a test adds here: to check that the
// engine reports the allocator's figure.
void add_alloc_retries(int index, int64_t n);
// Page-locked host memory, modelled on CUDA's: the caching allocator behind
// at::empty(..., pinned_memory(true)) (PrivateUse1HooksInterface::getPinnedMemoryAllocator)
// rounds each block up to a power of two and keeps it when freed, as CachingHostAllocator does;
// exact-size blocks come from the page locker the backend registers (device::PageLocker, as
// cudaHostAlloc). pinned_bytes: what both hold from the system now (cached free blocks
// included); pinned_in_use_bytes: the blocks of live tensors, rounded as held.
int64_t pinned_bytes();
int64_t pinned_in_use_bytes();
// Page-locked blocks handed out so far (a cached block handed out again counts again).
int64_t pinned_allocations();

// Host reads of fake:`index` so far (since the process started; take differences): what would
// make the host wait for a GPU. The copies to the host a program makes (tensor.cpu(),
// .to(kCPU), copy_ into a host tensor), item() and the operators whose result or output size the
// host needs (equal, nonzero, masked_select, unique). Not counted: a non_blocking copy into
// page-locked memory (queued on a GPU; counted by async_host_copies), the fallback's own copies
// (how the fake runs a kernel on the host), and a staged group's copies (comm/staging.hpp: what
// NCCL moves device to device). Host code reading a fake tensor's data_ptr() is not seen.
int64_t host_reads(int index);
int64_t async_host_copies(int index);

// From now on, an allocation of `bytes` or more on fake:`index` throws c10::OutOfMemoryError,
// as a GPU's allocator does when it cannot serve one (0: no limit).
void fail_allocations_from(int index, int64_t bytes);
// From now on, fake:`index` serves `count` more allocations, then every one throws
// c10::OutOfMemoryError, whatever its size (a device that fills up at a given point; -1: off).
void fail_allocations_after(int index, int64_t count);
// From now on, on the calling thread, a page-locked host allocation (either kind above) of
// `bytes` or more throws c10::Error, as cudaHostAlloc fails when the host cannot lock that much
// (0: no limit). Per thread: one rank of ranks run as threads fails alone.
void fail_pinned_from(int64_t bytes);

// Events recorded from now on complete `delay` after they were recorded (zero: at once). A
// delay widens the window between "queued" and "done" that the host side must respect.
void set_event_delay(std::chrono::microseconds delay);

}  // namespace zero::testing::fake
