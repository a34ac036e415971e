// Activation checkpointing (recompute blocks in backward instead of keeping their activations) and
// CPU offload of the few tensors checkpointing still keeps (DeepSpeed's `cpu_checkpointing`).
//
// LibTorch C++ has no checkpoint API and saved-tensor hooks exist only in Python, so a checkpoint
// is a custom autograd Function: forward runs the block without recording a graph and keeps only
// its inputs; backward re-runs it with grad enabled and backpropagates through the fresh graph.
// That inner backward accumulates into the block's parameters like any other backward, so the
// engine's post-accumulate-grad hooks (ZeRO-2 gradient buckets) fire as usual.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

namespace zero {

// A checkpointed piece of the model. Captured non-tensor state (modules, flags) lives in the
// closure; the closure is kept until the graph is destroyed, because backward calls it again.
// It must compute the same thing from the same inputs twice: same number of outputs, and random
// numbers only from the default generators (whose state checkpoint() replays).
using Block = std::function<std::vector<at::Tensor>(const std::vector<at::Tensor>&)>;

// Byte and event counts of an ActivationOffloader since construction or the last reset().
struct OffloadStats {
  int64_t device_bytes_kept = 0;  // device memory still held: copies in flight, prefetched blocks
  int64_t host_bytes = 0;         // host memory holding offloaded block inputs now
  int64_t peak_host_bytes = 0;
  int64_t offloaded = 0;   // blocks whose inputs went to host memory
  int64_t fetched = 0;     // blocks handed back to backward
  int64_t prefetched = 0;  // blocks whose copy back started before backward asked for them
  int64_t freed = 0;       // blocks whose host copy was released (fetched, or graph destroyed)
};

// Keeps checkpointed blocks' saved inputs in host memory between forward and backward, so device
// memory holds no activations at all between the two passes. With CUDA tensors, copies run on a
// dedicated stream into pinned memory and overlap compute; while backward recomputes block i,
// block i-1's input is already being copied back. Tensors on the CPU take the same path with
// plain copies, which keeps the bookkeeping (and its tests) identical on CPU-only builds.
//
// A handle: copies share one store, and each checkpoint's graph node holds one, so the store
// lives as long as any graph that needs it. Thread-safe. Each offloaded block is single-use:
// fetching frees its host copy, so a second backward through the same graph is an error (run
// without an offloader if you need retain_graph). Destroying a graph without backward frees its
// blocks too.
class ActivationOffloader {
 public:
  ActivationOffloader();

  // Starts copying `inputs` to host memory and returns the block's id (ids only grow, also
  // across reset()). The device tensors are released once their copies finished.
  int64_t offload(const std::vector<at::Tensor>& inputs);
  // Returns block `id`'s tensors on their original devices, ready for the current stream, and
  // frees its host copy; then starts prefetching the block before it, the next one a backward
  // pass will ask for. A block not prefetched is copied now.
  std::vector<at::Tensor> fetch(int64_t id);
  // Frees block `id` without fetching it (its graph died). No-op if it is no longer held.
  void release(int64_t id);

  // Blocks until every copy in flight has finished, so stats() no longer counts their sources.
  void synchronize();
  OffloadStats stats() const;
  // Between steps: drops every block still held (forwards that never ran backward) and zeroes
  // the stats. A backward that later asks for a dropped block fails with an explanation.
  void reset();

 private:
  struct Impl;
  std::shared_ptr<Impl> impl_;
};

struct CheckpointOptions {
  // Replays the default CPU (and, for inputs on an accelerator, its) generator state in the
  // recomputation, so dropout masks match forward's. Costs a state copy per call; turn off for
  // deterministic blocks.
  bool preserve_rng_state = true;
  // Not owned; copied (a handle) into each checkpoint's graph node.
  ActivationOffloader* offload = nullptr;
};

// Runs `fn(inputs)` without keeping its activations; backward recomputes them, replaying the
// RNG (see CheckpointOptions) and the CPU/CUDA autocast state of forward. Grad mode off (eval,
// NoGradGuard): just `fn(inputs)`. Inputs that don't require grad get no gradient; the block's
// parameters still do, even if no input requires grad. Works any number of times per forward
// and across gradient accumulation.
// Caveats, as with PyTorch's reentrant checkpoint: the recomputation's backward is a separate
// pass, so a parameter used by two checkpointed blocks (tied weights) accumulates once per block
// in one outer backward (the engine counts these arrivals in its first step and waits for all of
// them afterwards); torch::autograd::grad restricted to some inputs still accumulates into the
// block's parameters; create_graph is not supported.
std::vector<at::Tensor> checkpoint(const Block& fn, const std::vector<at::Tensor>& inputs,
                                   const CheckpointOptions& options = {});
at::Tensor checkpoint(const std::function<at::Tensor(const at::Tensor&)>& fn, const at::Tensor& x,
                      const CheckpointOptions& options = {});

}  // namespace zero
