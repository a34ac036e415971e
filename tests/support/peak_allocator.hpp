// An exact count of CPU tensor memory: a wrapper around c10's CPU allocator that counts the bytes
// of every storage it hands out and their peak since the last reset, the CPU counterpart of
// CUDA's memory_allocated / max_memory_allocated. mallinfo2 (host_allocated_bytes) gives only the
// bytes in use now, and a phase's transient is gone by the time one could read it.
#pragma once

#include <cstdint>

namespace zero::testing {

class PeakCpuAllocator {
 public:
  // Installs the counter as c10's CPU allocator on first use; it stays for the process (tensors
  // it allocated may outlive any scope). Storages allocated before it are not counted.
  static PeakCpuAllocator& get();

  int64_t in_use() const;
  int64_t peak() const;
  // The peak restarts from what is in use now.
  void reset_peak();

 private:
  PeakCpuAllocator();
};

}  // namespace zero::testing
