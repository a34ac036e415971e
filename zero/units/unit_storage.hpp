// A stage-3 unit's gathered parameters: one buffer whose bytes come and go while its tensor
// objects stay (design sharded-units.md §3.2).
//
// Autograd keeps what a unit's forward saved for backward: the parameters themselves (leaves:
// SavedVariable holds the very TensorImpl) and views of them (`weight.t()`, sharing the buffer's
// StorageImpl). Recomputing is what checkpointing does; ZeRO-3 instead frees only the *bytes*
// after forward and allocates fresh ones, through the storage's own allocator, before backward:
// the StorageImpl, and so every saved view, survives and sees whatever the gather wrote there.
// Parameters are pointed back at the buffer with set_data, which keeps each one its own version
// counter, so refilling never trips autograd's saved-tensor version check.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

namespace zero::units {

class UnitStorage {
 public:
  struct Param {
    at::Tensor tensor;   // the module's parameter (its TensorImpl is what autograd saved)
    int64_t offset = 0;  // where it starts in the buffer, in elements
  };
  // `buffer`: one contiguous 1-D tensor, allocated, holding every parameter at its offset (the
  // caller filled it); the parameters become views of it. A buffer whose storage holds no bytes
  // (given back by a deferred start-up) starts released; the parameters' shapes are read off
  // their tensors either way. Padding between or after them is
  // allowed (a sharded layout pads each bucket).
  UnitStorage(at::Tensor buffer, std::vector<Param> params);
  UnitStorage(const UnitStorage&) = delete;
  UnitStorage& operator=(const UnitStorage&) = delete;
  UnitStorage(UnitStorage&&) = default;
  UnitStorage& operator=(UnitStorage&&) = default;

  // Frees the buffer's bytes; each parameter becomes a 0-element tensor of its dtype and device,
  // so a module run outside its unit fails in its first op instead of reading freed memory.
  // No-op when already released. The caller makes sure nothing in flight still uses the bytes.
  // On a GPU the caching allocator hands a freed block back to the stream it was *allocated*
  // on, whatever stream is current at the free: so allocate() on the compute stream (an
  // all-gather on a side stream writes into it after an event; the compute stream waits before
  // use), wait for any gather still writing before release() (DeepSpeed's
  // release_and_reset_all), and record any other stream that read the bytes on them first
  // (c10::cuda::CUDACachingAllocator::recordStream, as DeepSpeed's free_param does;
  // device/device_copy.cpp does the same for its copies). ProcessGroupNCCL's own stash keeps the
  // StorageImpl alive, not these bytes, so it does not protect them.
  void release();
  // Fresh bytes for the buffer from the storage's allocator, under a guard for the buffer's
  // device, on the current stream (see release(): make that the compute stream). Contents are
  // undefined until written through buffer(). No-op when allocated.
  void allocate();
  // Points every parameter at its slice of the buffer again (after allocate() and the writes).
  void view_params();

  bool allocated() const { return allocated_; }
  // The gather destination; all writes go through it, never through a parameter.
  const at::Tensor& buffer() const { return buffer_; }
  int64_t nbytes() const { return nbytes_; }
  const std::vector<Param>& params() const { return params_; }

 private:
  at::Tensor buffer_;
  std::vector<Param> params_;
  std::vector<std::vector<int64_t>> shapes_;
  int64_t nbytes_ = 0;
  bool allocated_ = true;
};

}  // namespace zero::units
