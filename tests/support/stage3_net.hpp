// The stage-3 tests' model: an input Linear (root unit), kStage3Blocks MLP blocks that
// zero::shard marks (one unit each), a head Linear (root). No dropout: every rank and the
// single-process reference compute the same function.
#pragma once

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/linear.h>

#include <memory>

#include "support/block_mlp.hpp"
#include "zero/sharding.hpp"

namespace zero::testing {

inline constexpr int64_t kStage3Width = 32;
inline constexpr int kStage3Blocks = 3;

struct Stage3NetImpl : torch::nn::Module {
  Stage3NetImpl() {
    inp = register_module("inp", torch::nn::Linear(12, kStage3Width));
    body = register_module("body", std::make_shared<BlockMlp>(kStage3Blocks, kStage3Width, 0.0));
    head = register_module("head", torch::nn::Linear(kStage3Width, 5));
  }
  at::Tensor forward(const at::Tensor& x) { return head(body->forward(at::tanh(inp(x)))); }
  torch::nn::Linear inp{nullptr}, head{nullptr};
  std::shared_ptr<BlockMlp> body;
};

// Parameters from `seed` alone (thread-safe); `mark`: every block zero::shard-marked (`skip`:
// except that one).
inline std::shared_ptr<Stage3NetImpl> make_stage3_net(uint64_t seed, bool mark, int skip = -1) {
  auto net = std::make_shared<Stage3NetImpl>();
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  at::NoGradGuard g;
  for (auto& p : net->parameters()) p.copy_(at::randn(p.sizes(), gen) * 0.3);
  for (size_t i = 0; mark && i < net->body->size(); ++i) {
    if (static_cast<int>(i) != skip) zero::shard(net->body->block_module(i));
  }
  return net;
}

// The memory tests' model: kStage3DeepBlocks wide marked blocks (one unit each, large next to
// the root) and a head Linear (the root unit).
inline constexpr int64_t kStage3DeepWidth = 256;
inline constexpr int kStage3DeepBlocks = 6;

struct Stage3DeepNetImpl : torch::nn::Module {
  Stage3DeepNetImpl() {
    body = register_module("body",
                           std::make_shared<BlockMlp>(kStage3DeepBlocks, kStage3DeepWidth, 0.0));
    head = register_module("head", torch::nn::Linear(kStage3DeepWidth, 5));
  }
  at::Tensor forward(const at::Tensor& x) { return head(body->forward(x)); }
  std::shared_ptr<BlockMlp> body;
  torch::nn::Linear head{nullptr};
};

// The deep net (default initialisation) with every block marked, moved to `d`.
inline std::shared_ptr<Stage3DeepNetImpl> make_marked_deep_net(const c10::Device& d) {
  auto net = std::make_shared<Stage3DeepNetImpl>();
  for (size_t i = 0; i < net->body->size(); ++i) zero::shard(net->body->block_module(i));
  net->to(d);
  return net;
}

// A batch's features (global_batch's 12 columns) as the deep net's input: zero-padded to
// kStage3DeepWidth columns, on the host.
inline at::Tensor deep_input(const at::Tensor& x) {
  at::Tensor padded = at::zeros({x.size(0), kStage3DeepWidth});
  padded.narrow(1, 0, x.size(1)).copy_(x);
  return padded;
}

}  // namespace zero::testing
