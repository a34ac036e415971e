// An exact count of CPU tensor memory: a wrapper around c10's CPU allocator that counts the bytes
// of every storage it hands out and their peak since the last reset, the CPU counterpart of
// CUDA's memory_allocated / max_memory_allocated. mallinfo2 (host_allocated_bytes) gives only the
// bytes in use now, and a phase's transient is gone by the time one could read it. Opt-in: the
// trainer installs it on CPU runs (the summary's phase peaks), the tests and bench/phase-peaks
// wherever they measure; the library never does.
//
// Tags say what a peak is made of: each storage is counted under the tag current on the thread
// that allocated it (HostTag::kOther unless a HostCountingAllocator::Tag guard set another), a
// live storage can be moved under another tag (retag), and the split by tag at the moment of
// the peak is kept beside it. The engine tags what it allocates (gathered units, gradient
// shard, bucket buffers, gradients it holds); the caller tags its phases.
#pragma once

#include <array>
#include <cstdint>

namespace zero {

enum class HostTag : int {
  kOther = 0,    // untagged: the model states, the data, RoPE tables, gloo's temporaries
  kGathered,     // stage 3: units' gathered parameter buffers
  kUnitGrads,    // full-size parameter gradients the engine holds, awaiting their reduction
  kGradShard,    // the reduced gradient shard
  kBuckets,      // the gradient bucket buffers (reduce-scatter input and output)
  kActivations,  // what forward allocated (the caller's tag)
  kLogits,       // the model's output and the loss over it (the caller's tag)
  kBackward,     // what backward allocated otherwise: activation gradients, autograd buffers
  kStep,         // what the optimizer step allocated
  kCount
};
constexpr int kHostTags = static_cast<int>(HostTag::kCount);
const char* host_tag_name(HostTag t);
using HostTagBytes = std::array<int64_t, kHostTags>;

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

  // Sets the calling thread's tag for its scope (cheap: a thread-local; works whether or not
  // the counter is installed).
  class Tag {
   public:
    explicit Tag(HostTag t);
    ~Tag();
    Tag(const Tag&) = delete;
    Tag& operator=(const Tag&) = delete;

   private:
    HostTag prev_;
  };
  // Moves the storage starting at `data` under tag `t` (nothing if the counter does not know it:
  // not installed, not a CPU storage, allocated before installation).
  static void retag(const void* data, HostTag t);
  HostTagBytes in_use_by_tag() const;
  // The split by tag when peak() was reached.
  HostTagBytes peak_by_tag() const;

 private:
  HostCountingAllocator();
};

}  // namespace zero
