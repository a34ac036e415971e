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

#include "zero/checkpoint.hpp"

namespace zero::examples {

struct GptConfig {
  int64_t vocab = 256;
  int64_t dim = 256;
  int64_t layers = 4;
  int64_t heads = 4;
  int64_t kv_heads = 0;  // 0: as many as `heads`; fewer: grouped-query attention (LLaMA-2 70B, 3)
  int64_t ffn = 0;       // 0: LLaMA's rule, 2/3 * 4 * dim rounded up to a multiple of 256
  int64_t max_seq = 256;
  bool tied = true;
  double rope_theta = 10000.0;
  double norm_eps = 1e-5;  // RMSNorm's epsilon (Hugging Face: rms_norm_eps)

  int64_t ffn_dim() const;
  int64_t kv_heads_count() const { return kv_heads > 0 ? kv_heads : heads; }
  int64_t head_dim() const { return dim / heads; }
  int64_t num_params() const;  // exact, without building anything
};

// Named sizes, from a few million parameters to LLaMA-7B's exact shapes.
GptConfig gpt_preset(const std::string& name);
std::vector<std::string> gpt_preset_names();

struct RMSNormImpl : torch::nn::Module {
  explicit RMSNormImpl(int64_t dim, double eps = 1e-5);
  at::Tensor forward(const at::Tensor& x);
  at::Tensor weight;
  double eps;
};
TORCH_MODULE(RMSNorm);

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

struct GptImpl : torch::nn::Module {
  explicit GptImpl(const GptConfig& c);
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
};
TORCH_MODULE(Gpt);

// Turns activation checkpointing (and CPU offload of the kept inputs) on for the model's blocks.
void apply_activation_checkpointing(Gpt& model, const CheckpointPolicy& policy);

}  // namespace zero::examples
