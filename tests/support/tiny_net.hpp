// A small model and a single-process reference trainer (plain LibTorch: torch::optim::AdamW /
// SGD and clip_grad_norm_) for equivalence tests.
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>

#include <functional>
#include <memory>
#include <vector>

#include "zero/config.hpp"

namespace zero::testing {

// Linear -> LayerNorm -> tanh -> Linear -> tanh -> Linear: biases and a norm (no weight decay),
// parameters of several sizes so small buckets split and straddle them.
struct TinyNetImpl : torch::nn::Module {
  TinyNetImpl(int in = 12, int hidden = 24, int out = 5);
  at::Tensor forward(const at::Tensor& x);
  torch::nn::Linear fc1{nullptr}, fc2{nullptr}, head{nullptr};
  torch::nn::LayerNorm norm{nullptr};
};

// A fresh TinyNet whose parameters depend only on `seed` (thread-safe: no global generator).
std::shared_ptr<TinyNetImpl> make_tiny_net(uint64_t seed);

// Deterministic regression data: the global batch of optimizer step `step`.
struct Batch {
  at::Tensor x, y;
};
Batch global_batch(int64_t step, int64_t rows, uint64_t seed = 7);

// The rows of the global batch that `rank` uses in micro-step `micro` (of `accumulation`).
Batch rank_micro_batch(const Batch& global, int rank, int world, int micro, int accumulation);

at::Tensor mse(const at::Tensor& pred, const at::Tensor& target);

// Trains a TinyNet on one process over the whole global batches for `steps` optimizer steps,
// with the optimizer, clipping and weight-decay exclusions of `cfg`; returns the parameters
// flattened in named_parameters() order, and the grad norms before clipping.
struct ReferenceResult {
  at::Tensor params;
  std::vector<double> grad_norms;
  std::vector<double> losses;  // each step's loss on the global batch, before its update
};
ReferenceResult train_reference(const Config& cfg, int steps, int64_t global_rows, uint64_t seed);
// The same for any model mapping global_batch's x (12 features) to its y (5): `forward` runs
// `net` on a batch.
ReferenceResult train_reference(const Config& cfg, int steps, int64_t global_rows,
                                torch::nn::Module& net,
                                const std::function<at::Tensor(const at::Tensor&)>& forward);

// The same for any model and loss: `loss(step)` is step's loss over the whole global batch.
ReferenceResult train_reference(const Config& cfg, int steps, torch::nn::Module& net,
                                const std::function<at::Tensor(int)>& loss);

// Parameters flattened in named_parameters() order, fp32.
at::Tensor flatten(torch::nn::Module& m);

// A config for equivalence tests (fp32, AdamW).
Config test_config(int stage, int64_t micro, int accumulation, double clip, int64_t bucket = 200);

}  // namespace zero::testing
