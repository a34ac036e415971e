// An exact count of CPU tensor memory: a wrapper around c10's CPU allocator that counts the bytes
// of every storage it hands out and their peak since the last reset, the CPU counterpart of
// CUDA's memory_allocated / max_memory_allocated. mallinfo2 (host_allocated_bytes) gives only the
// bytes in use now, and a phase's transient is gone by the time one could read it. Opt-in: the
// trainer installs it on CPU runs (the summary's phase peaks), the tests and bench/phase-peaks
// wherever they measure; the library never does.
#pragma once

#include <cstdint>

namespace zero {

class HostCountingAllocator {
 public:
  // Installs the counter as c10's CPU allocator on first use; it stays for the process (tensors
  // it allocated may outlive any scope). Storages allocated before it are not counted.
  static HostCountingAllocator& get();
  // Whether get() has installed it (without installing it).
  static bool installed();

  int64_t in_use() const;
  int64_t peak() const;
  // The peak restarts from what is in use now.
  void reset_peak();

 private:
  HostCountingAllocator();
};

}  // namespace zero
