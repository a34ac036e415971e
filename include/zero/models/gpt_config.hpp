// zero::models::Gpt's shape: sizes, named presets and the exact parameter count. Torch-free, so
// the planner's command line (tools/zero-memory) can name a preset without linking LibTorch.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace zero::models {

// Hugging Face's RoPE variants for LLaMA (transformers' rope_parameters / rope_scaling), each
// computed op for op as transformers' modeling_rope_utils.py does (models/rope.cpp).
struct RopeScaling {
  std::string type = "default";               // default, linear, dynamic, llama3 or yarn
  double factor = 1.0;                        // linear, dynamic, llama3, yarn
  double low_freq_factor = 1.0;               // llama3
  double high_freq_factor = 4.0;              // llama3
  int64_t original_max_seq = 0;               // llama3, yarn: original_max_position_embeddings
  double attention_factor = 0.0;              // yarn: 0 derives it from factor (and mscale)
  double beta_fast = 32.0, beta_slow = 1.0;   // yarn
  double mscale = 0.0, mscale_all_dim = 0.0;  // yarn
  bool truncate = true;                       // yarn
};

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
  RopeScaling rope;
  bool qkv_bias = false;  // biases on the q/k/v projections (Qwen2; LLaMA's attention_bias)
  bool o_bias = false;    // a bias on the output projection (LLaMA's attention_bias)
  // What a Hugging Face config.json said beyond the shape, kept for the export to write back
  // (zero/models/hf_llama.hpp): "mistral" for a Mistral checkpoint ("": LLaMA or Qwen2, chosen by
  // the biases), and its sliding_window (0: null). The GPT attends over the full causal window;
  // it loads only a window of at least max_seq, which no sequence it runs can reach.
  std::string hf_model_type;
  int64_t hf_sliding_window = 0;

  int64_t ffn_dim() const;
  int64_t kv_heads_count() const { return kv_heads > 0 ? kv_heads : heads; }
  int64_t head_dim() const { return dim / heads; }
  int64_t num_params() const;  // exact, without building anything
};

// Named sizes, from a few million parameters to LLaMA-7B's exact shapes.
GptConfig gpt_preset(const std::string& name);
std::vector<std::string> gpt_preset_names();

}  // namespace zero::models
