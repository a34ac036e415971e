// A deep MLP of checkpointable blocks (Linear + GELU + Dropout + LayerNorm: every kind of saved
// activation, and randomness) for the checkpointing and offload tests.
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

class BlockMlp : public torch::nn::Module {
 public:
  BlockMlp(int blocks, int64_t width, double dropout);
  at::Tensor block(size_t i, const at::Tensor& x);
  // One checkpoint per block when `ckpt` is given.
  at::Tensor forward(const at::Tensor& x, const CheckpointOptions* ckpt = nullptr);

 private:
  std::vector<torch::nn::Linear> fc_;
  std::vector<torch::nn::GELU> act_;
  std::vector<torch::nn::Dropout> drop_;
  std::vector<torch::nn::LayerNorm> norm_;
};

}  // namespace zero::testing
