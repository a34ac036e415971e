// The rotary tables of zero::models::Gpt for each RoPE variant transformers ships for LLaMA
// (default, linear, dynamic, llama3, yarn): the same float32 ops in the same order as
// transformers' modeling_rope_utils.py, so that a model loaded from Hugging Face weights gives
// transformers' logits bit for bit.
#pragma once

#include <ATen/core/Tensor.h>

#include "zero/models/gpt_config.hpp"

namespace zero::models {

// Inverse frequencies [head_dim / 2] and the factor cos/sin are multiplied by (yarn's
// attention_factor; 1 otherwise).
struct RopeFrequencies {
  at::Tensor inv_freq;
  double attention_scaling = 1.0;
};
RopeFrequencies rope_frequencies(const GptConfig& c);

// cos and sin tables [max_seq, head_dim] ("rotate half" layout: the angles twice).
std::pair<at::Tensor, at::Tensor> rope_tables(const GptConfig& c);

// The rope types rope_frequencies knows.
bool rope_type_known(const std::string& type);

}  // namespace zero::models
