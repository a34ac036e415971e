// A deep MLP of checkpointable blocks (Linear + GELU + Dropout + LayerNorm: every kind of saved
// activation, and randomness) for the checkpointing, offload and stage-3 unit tests. Each block
// is a module of its own ("block3.fc.weight"), run through zero::run_unit: a unit at stage 3
// when marked with zero::shard, plainly otherwise.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/dropout.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>

#include <vector>

#include "zero/activation_checkpointing.hpp"

namespace zero::testing {

struct MlpBlockImpl : torch::nn::Module {
  MlpBlockImpl(int64_t width, double dropout);
  at::Tensor forward(const at::Tensor& x);
  torch::nn::Linear fc{nullptr};
  torch::nn::GELU act{nullptr};
  torch::nn::Dropout drop{nullptr};
  torch::nn::LayerNorm norm{nullptr};
};
TORCH_MODULE(MlpBlock);

class BlockMlp : public torch::nn::Module {
 public:
  BlockMlp(int blocks, int64_t width, double dropout);
  // Block i through zero::run_unit.
  at::Tensor block(size_t i, const at::Tensor& x);
  // One checkpoint per block when `ckpt` is given (around the block's run_unit).
  at::Tensor forward(const at::Tensor& x, const CheckpointOptions* ckpt = nullptr);
  size_t size() const { return blocks_.size(); }
  MlpBlockImpl& block_module(size_t i) { return *blocks_.at(i); }

 private:
  std::vector<MlpBlock> blocks_;
};

}  // namespace zero::testing
