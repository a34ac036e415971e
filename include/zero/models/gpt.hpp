// zero::models (installed with zero: find_package(zero), link zero::models).
// A LLaMA-style decoder in LibTorch: token embedding, RMSNorm, rotary positions, causal
// attention through scaled_dot_product_attention, SwiGLU MLP, tied or untied head.
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>

#include <memory>
#include <string>
#include <vector>

#include <ATen/core/Generator.h>

#include "zero/activation_checkpointing.hpp"
#include "zero/deferred_init.hpp"
#include "zero/models/gpt_config.hpp"
#include "zero/sharding.hpp"

namespace zero::models {

struct RMSNormImpl : torch::nn::Module {
  explicit RMSNormImpl(int64_t dim, double eps = 1e-5);
  at::Tensor forward(const at::Tensor& x);
  at::Tensor weight;
  double eps;
};
TORCH_MODULE(RMSNorm);

// Causal self-attention on projected q [B, T, heads * head_dim] and k, v [B, T, kv_heads *
// head_dim] (RoPE applied, grouped-query heads repeated): [B, T, heads * head_dim], before the
// output projection. The plain block's and the tensor-parallel one's (on this rank's heads).
at::Tensor causal_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                            int64_t heads, int64_t kv_heads, int64_t head_dim,
                            const at::Tensor& cos, const at::Tensor& sin);

struct BlockImpl : torch::nn::Module {
  BlockImpl(const GptConfig& c);
  at::Tensor forward(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin);
  int64_t heads, kv_heads;
  RMSNorm attn_norm{nullptr}, mlp_norm{nullptr};
  torch::nn::Linear wq{nullptr}, wk{nullptr}, wv{nullptr}, wo{nullptr};
  torch::nn::Linear w_gate{nullptr}, w_up{nullptr}, w_down{nullptr};
};
TORCH_MODULE(Block);

// Which blocks recompute in backward instead of keeping their activations, and whether the
// block inputs that checkpointing keeps go to host memory (DeepSpeed's cpu_checkpointing).
struct CheckpointPolicy {
  bool enabled = false;
  bool cpu_offload = false;
  int64_t every = 1;  // checkpoint blocks 0, every, 2*every, ...
};

// The blocks in order, every policy.every-th one recomputed in backward (zero::checkpoint): the
// plain model's and the tensor-parallel one's forward (a recomputed tensor-parallel block runs its
// collectives again, on every rank alike). Each block runs as a unit (zero::run_unit): gathered
// and released around its forward at stage 3 when marked, the block itself otherwise; a
// checkpoint wraps the unit, so its recomputation gathers it again. The closure outlives the
// call (backward re-runs it), so it captures by value.
template <class Block>
at::Tensor run_blocks(torch::nn::ModuleList& blocks, at::Tensor x, const at::Tensor& cos,
                      const at::Tensor& sin, const CheckpointPolicy& policy,
                      const zero::CheckpointOptions& opts) {
  for (size_t i = 0; i < blocks->size(); ++i) {
    auto* block = (*blocks)[i]->template as<Block>();
    auto unit = [block, cos, sin](const at::Tensor& in) {
      return zero::run_unit(
          *block, [block, cos, sin](const at::Tensor& t) { return block->forward(t, cos, sin); },
          in);
    };
    if (policy.enabled && static_cast<int64_t>(i) % policy.every == 0) {
      x = zero::checkpoint(unit, x, opts);
    } else {
      x = unit(x);
    }
  }
  return x;
}

struct GptImpl : torch::nn::Module {
  explicit GptImpl(const GptConfig& c);
  // Deferred (zero/deferred_init.hpp): each child is built as above, its parameters replaced by
  // placeholders right after, so construction holds one block at a time; the weights come from
  // initial_values() in zero::initialize. Draws what the eager constructor draws, in the same
  // order, from the same generator: an engine started from it holds bit for bit the weights an
  // eager build from the same seed gives, and the global generator ends where the eager build
  // leaves it.
  GptImpl(const GptConfig& c, const zero::Deferred& deferred);
  // A deferred model's source of initial values (the GPT-2 style init below, from the
  // generator as the constructor left it), for zero::initialize. One per initialize: it keeps
  // its place in the draws. Throws for a model built eagerly.
  zero::InitialValues initial_values() const;
  // tokens [batch, seq] int64 -> logits [batch, seq, vocab]
  at::Tensor forward(const at::Tensor& tokens);
  // Mean next-token cross-entropy of `tokens` predicting `targets`.
  at::Tensor loss(const at::Tensor& tokens, const at::Tensor& targets);

  GptConfig cfg;
  torch::nn::Embedding embed{nullptr};
  torch::nn::ModuleList blocks;
  RMSNorm norm{nullptr};
  torch::nn::Linear head{nullptr};  // null when tied to the embedding
  at::Tensor rope_cos, rope_sin;    // buffers [max_seq, head_dim]
  CheckpointPolicy checkpointing;
  std::unique_ptr<zero::ActivationOffloader> offloader;  // set when checkpointing.cpu_offload

 private:
  GptImpl(const GptConfig& c, const zero::Deferred* deferred);
  at::Generator init_generator_;  // deferred: the CPU generator before the init draws
};
TORCH_MODULE(Gpt);

// Turns activation checkpointing (and CPU offload of the kept inputs) on for the model's blocks.
void apply_activation_checkpointing(Gpt& model, const CheckpointPolicy& policy);

}  // namespace zero::models
