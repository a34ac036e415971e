// Optimizers for ZeRO-Offload: AdamW and SGD over a host-memory fp32 shard, written for the
// host's memory bandwidth.
//
// An offloaded step is bound by how fast the host streams the shard through memory: AdamW reads
// the parameter, the gradient and both moments and writes the parameter and the moments back
// (28 bytes an element), and then the new weights must reach the device in the compute dtype.
// These kernels make that one pass: decay, moments, update and the rounded compute-dtype copy
// (2 bytes more for bf16/fp16) are written while the element is in a register, vectorized
// (the loops are plain enough for the compiler; AVX2/AVX-512 clones on x86) and split over the
// threads given to the rank. ATen's _fused_adamw_ does the update in one pass too, but the copy
// in the compute dtype would be a second pass over the shard.
//
// The arithmetic is torch::optim::AdamW's and torch::optim::SGD's in fp32, rounded where ATen's
// fused CPU kernels (the engine's optimizers without offload) round: bit for bit theirs
// (optim/host_kernels.hpp, tests/test_cpu_optim.cpp). optim/cpu_adamw.cpp and optim/cpu_sgd.cpp
// hold the kernels, optim/host_optimizer.cpp what they share.
#pragma once

#include <c10/core/ScalarType.h>
#include <c10/core/TensorOptions.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "device/pinned_host.hpp"
#include "optim/adamw.hpp"
#include "optim/sgd.hpp"
#include "optim/shard_optimizer.hpp"

namespace zero::optim {

// A ShardOptimizer whose shard and state are host memory and whose update can also write the
// new values in the compute dtype.
class HostShardOptimizer : public ShardOptimizer {
 public:
  // update() over `window`, plus the new values rounded into `out` (window-sized, contiguous,
  // fp32/bf16/fp16, host; undefined: none) in the same pass. When found_inf is set the master
  // and the state stay untouched and `out` receives the unchanged values.
  virtual void update_to(at::Tensor& param, const at::Tensor& grad, double lr,
                         const Scalars& scalars, Range window, const at::Tensor& out) = 0;
  void update(at::Tensor& param, const at::Tensor& grad, double lr, const Scalars& scalars,
              Range window) override {
    update_to(param, grad, lr, scalars, window, at::Tensor());
  }
  // The squared L2 norm of `grad` (the host fp32 shard) over `pieces`, as a one-element fp32 host
  // tensor, reduced in parallel on this optimizer's threads (torchrun's OMP_NUM_THREADS=1 would
  // leave a host reduction on one core, as it would the step), in fixed chunks summed in double:
  // the result does not depend on the thread count.
  virtual at::Tensor squared_norm(const at::Tensor& grad, const std::vector<Range>& pieces) = 0;

 protected:
  HostShardOptimizer(int64_t numel, std::vector<ParamGroup> groups, const at::TensorOptions& opts,
                     int threads)
      : ShardOptimizer(numel, std::move(groups), opts), threads_(threads) {}
  int threads_;  // 0: torch's intra-op threads
};

struct HostOptimizerOptions {
  // This many threads run one update (the calling thread and a pool the optimizer owns), whatever
  // torch's intra-op thread count (OMP_NUM_THREADS) is; 0: torch's intra-op threads.
  int threads = 0;
  // Page-locked state buffers, for asynchronous copies to and from a GPU; ignored without CUDA.
  bool pin_memory = false;
};

// `opts`: fp32 on the CPU. State: "exp_avg", "exp_avg_sq", as make_adamw's.
std::unique_ptr<HostShardOptimizer> make_cpu_adamw(const AdamWOptions& options, int64_t numel,
                                                   std::vector<Range> decay_ranges,
                                                   const at::TensorOptions& opts,
                                                   const HostOptimizerOptions& host = {});
// The same with parameter groups (lr scale, weight decay), as make_grouped_adamw's.
std::unique_ptr<HostShardOptimizer> make_grouped_cpu_adamw(const AdamWOptions& options,
                                                           int64_t numel,
                                                           std::vector<ParamGroup> groups,
                                                           const at::TensorOptions& opts,
                                                           const HostOptimizerOptions& host = {});
// State: "momentum_buffer" with momentum, none without, as make_sgd's.
std::unique_ptr<HostShardOptimizer> make_cpu_sgd(const SgdOptions& options, int64_t numel,
                                                 std::vector<Range> decay_ranges,
                                                 const at::TensorOptions& opts,
                                                 const HostOptimizerOptions& host = {});

std::unique_ptr<HostShardOptimizer> make_grouped_cpu_sgd(const SgdOptions& options, int64_t numel,
                                                         std::vector<ParamGroup> groups,
                                                         const at::TensorOptions& opts,
                                                         const HostOptimizerOptions& host = {});

}  // namespace zero::optim
