#include "zero/models/gpt_config.hpp"

#include <stdexcept>

namespace zero::models {

int64_t GptConfig::ffn_dim() const {
  if (ffn > 0) return ffn;
  const int64_t h = 2 * 4 * dim / 3;
  return (h + 255) / 256 * 256;
}

int64_t GptConfig::num_params() const {
  const int64_t kv_dim = kv_heads_count() * head_dim();
  const int64_t biases = (qkv_bias ? dim + 2 * kv_dim : 0) + (o_bias ? dim : 0);
  const int64_t per_layer =
      2 * dim * dim + 2 * dim * kv_dim + 3 * dim * ffn_dim() + 2 * dim + biases;
  return vocab * dim * (tied ? 1 : 2) + layers * per_layer + dim;
}

GptConfig gpt_preset(const std::string& name) {
  GptConfig c;
  if (name == "tiny") {  // ~0.15 M: unit tests, seconds on a CPU
    c.dim = 64, c.layers = 2, c.heads = 4, c.max_seq = 128;
  } else if (name == "small") {  // ~2.7 M: the README demo, a loss curve within a minute on CPU
    c.dim = 192, c.layers = 6, c.heads = 6, c.max_seq = 256;
  } else if (name == "gpt-25m") {
    c.vocab = 8192, c.dim = 384, c.layers = 12, c.heads = 6, c.max_seq = 512;
  } else if (name == "gpt-50m") {
    c.vocab = 8192, c.dim = 512, c.layers = 12, c.heads = 8, c.max_seq = 512;
  } else if (name == "gpt-100m") {
    c.vocab = 32000, c.dim = 640, c.layers = 12, c.heads = 10, c.max_seq = 1024, c.tied = false;
  } else if (name == "gpt-1.3b") {
    c.vocab = 32000, c.dim = 2048, c.layers = 24, c.heads = 16, c.max_seq = 2048, c.tied = false;
  } else if (name == "llama-3b") {
    // LLaMA-3.2-3B's shapes (3,212,749,824 parameters, tied embedding and head, grouped-query
    // attention): the flat buffer holds more than 2^31 elements, which the GPU check needs.
    c.vocab = 128256, c.dim = 3072, c.layers = 28, c.heads = 24, c.kv_heads = 8, c.ffn = 8192;
    c.max_seq = 2048, c.rope_theta = 500000.0, c.tied = true;
  } else if (name == "llama-7b") {  // LLaMA-7B: 6,738,415,616 parameters
    c.vocab = 32000, c.dim = 4096, c.layers = 32, c.heads = 32, c.ffn = 11008, c.max_seq = 2048;
    c.tied = false;
  } else {
    std::string all;
    for (const auto& n : gpt_preset_names()) all += (all.empty() ? "" : ", ") + n;
    throw std::invalid_argument("unknown model preset '" + name + "'; known: " + all);
  }
  return c;
}

std::vector<std::string> gpt_preset_names() {
  return {"tiny", "small", "gpt-25m", "gpt-50m", "gpt-100m", "gpt-1.3b", "llama-3b", "llama-7b"};
}

}  // namespace zero::models
