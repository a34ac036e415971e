// Megatron's two halves of a parallel matrix product (Y = X A^T + b, A of shape [out, in]):
//
//   ColumnParallelLinear  A split by rows (output features): rank r computes Y_r = X A_r^T + b_r,
//                         its part of the output features. The input is copied into the region
//                         (backward all-reduces its gradient), or under sequence parallelism
//                         all-gathered along the sequence (backward reduce-scatters; only
//                         the sequence shard is kept for backward, re-gathered there). With
//                         gather_output the parts are all-gathered into the full Y.
//   RowParallelLinear     A split by columns (input features): rank r computes X_r A_r^T, a
//                         partial sum, all-reduced over the group (under sequence parallelism
//                         reduce-scattered along the sequence); the bias is added once, after.
//
// Column(gather_output = false) -> elementwise -> Row(input_is_parallel = true) is the MLP with
// one all-reduce forward and one backward. Parameters are named "weight" and "bias" like
// nn::Linear's; each rank holds its shard, made from a full initial weight (init_full_linear of
// options.seed, or load_full). Created on the CPU in fp32; move with ->to() like any module.
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "zero/tensor_parallel/init.hpp"
#include "zero/tensor_parallel/mappings.hpp"
#include "zero/tensor_parallel/placement.hpp"

namespace zero::tensor_parallel {

struct ColumnParallelLinearOptions {
  ColumnParallelLinearOptions(int64_t in_features, int64_t out_features)
      : in_features_(in_features), out_features_(out_features) {}
  TORCH_ARG(int64_t, in_features);
  TORCH_ARG(int64_t, out_features);  // divisible by the tensor-parallel size
  TORCH_ARG(bool, bias) = true;
  // All-gather the output's feature parts so every rank holds the full Y (as Megatron's default).
  TORCH_ARG(bool, gather_output) = true;
  // The input is this rank's part of the sequence (Megatron-SP): all-gathered before the product.
  TORCH_ARG(bool, sequence_parallel) = false;
  TORCH_ARG(int64_t, sequence_dim) = 1;  // [batch, sequence, hidden]
  TORCH_ARG(uint64_t, seed) = 0;         // of the full initial weight (init_full_linear)
  // Backward starts the input gradient's all-reduce (reduce-scatter under sequence parallelism)
  // and computes the weight's gradient meanwhile, as Megatron-LM does; false waits for each
  // collective at once (the same values; for measuring what the overlap hides).
  TORCH_ARG(bool, overlap_comm) = true;
};

class ColumnParallelLinearImpl : public torch::nn::Module, public TensorParallelLayer {
 public:
  ColumnParallelLinearImpl(GroupPtr group, ColumnParallelLinearOptions options);
  ColumnParallelLinearImpl(GroupPtr group, int64_t in_features, int64_t out_features,
                           bool bias = true, bool gather_output = true)
      : ColumnParallelLinearImpl(std::move(group),
                                 ColumnParallelLinearOptions(in_features, out_features)
                                     .bias(bias)
                                     .gather_output(gather_output)) {}

  at::Tensor forward(const at::Tensor& x);

  // Keeps this rank's rows of the full weight [out, in] and bias [out] (undefined when the
  // layer has none); the tensors are the same on every rank. Copies into the existing
  // parameters, keeping their device and dtype.
  void load_full(const at::Tensor& weight, const at::Tensor& bias = {});
  // The full weight and bias from every rank's shard: a collective, every rank calls it.
  FullLinear gather_full() const;

  Placement placement(const std::string& param_name) const override;

  const ColumnParallelLinearOptions& options() const { return options_; }
  // Benchmarks switch the backward overlap off and on (the values are the same either way).
  void set_overlap_comm(bool on) { options_.overlap_comm(on); }
  const GroupPtr& group() const { return group_; }

  at::Tensor weight;  // [out / T, in]
  at::Tensor bias;    // [out / T]

 private:
  ColumnParallelLinearOptions options_;
  GroupPtr group_;
};
TORCH_MODULE(ColumnParallelLinear);

// Column-parallel layers reading one input, which enters the tensor-parallel region once for
// all of them, as Megatron's fused linear_qkv and linear_fc1 do: copied (backward: one
// all-reduce of the summed gradient instead of one per layer) or, under sequence parallelism,
// all-gathered inside the products (backward: one reduce-scatter, one re-gather; only the
// sequence shard is kept). The layers share the group and sequence_parallel / sequence_dim and
// must not gather_output. Returns each layer's output, in the order given.
std::vector<at::Tensor> column_parallel_products(const at::Tensor& x,
                                                 const std::vector<ColumnParallelLinear>& layers);

struct RowParallelLinearOptions {
  RowParallelLinearOptions(int64_t in_features, int64_t out_features)
      : in_features_(in_features), out_features_(out_features) {}
  TORCH_ARG(int64_t, in_features);  // divisible by the tensor-parallel size
  TORCH_ARG(int64_t, out_features);
  TORCH_ARG(bool, bias) = true;
  // The input is already split by features (a ColumnParallelLinear without gather_output);
  // false: the full input is split here.
  TORCH_ARG(bool, input_is_parallel) = false;
  // Reduce-scatter the output along the sequence instead of all-reducing it (Megatron-SP);
  // needs input_is_parallel.
  TORCH_ARG(bool, sequence_parallel) = false;
  TORCH_ARG(int64_t, sequence_dim) = 1;
  TORCH_ARG(uint64_t, seed) = 0;
};

class RowParallelLinearImpl : public torch::nn::Module, public TensorParallelLayer {
 public:
  RowParallelLinearImpl(GroupPtr group, RowParallelLinearOptions options);
  RowParallelLinearImpl(GroupPtr group, int64_t in_features, int64_t out_features, bool bias = true,
                        bool input_is_parallel = false)
      : RowParallelLinearImpl(std::move(group), RowParallelLinearOptions(in_features, out_features)
                                                    .bias(bias)
                                                    .input_is_parallel(input_is_parallel)) {}

  at::Tensor forward(const at::Tensor& x);

  // Keeps this rank's columns of the full weight [out, in]; the bias [out] is kept whole.
  void load_full(const at::Tensor& weight, const at::Tensor& bias = {});
  FullLinear gather_full() const;

  Placement placement(const std::string& param_name) const override;

  const RowParallelLinearOptions& options() const { return options_; }
  const GroupPtr& group() const { return group_; }

  at::Tensor weight;  // [out, in / T]
  at::Tensor bias;    // [out], replicated

 private:
  RowParallelLinearOptions options_;
  GroupPtr group_;
};
TORCH_MODULE(RowParallelLinear);

}  // namespace zero::tensor_parallel
