// Hugging Face LLaMA interop for zero::models::Gpt: a LlamaForCausalLM (or Qwen2ForCausalLM)
// directory (config.json and model.safetensors, or model-0000i-of-0000n.safetensors shards with
// model.safetensors.index.json) in and out.
//
// Shapes: LLaMA with grouped-query attention, tied or untied head, attention_bias (q/k/v/o
// biases), and the RoPE types transformers ships for it (rope_parameters or rope_scaling:
// default, linear, dynamic, llama3 as in Llama 3.1/3.2, yarn; rope.hpp); Qwen2/2.5 (q/k/v
// biases, no sliding window); Mistral (LLaMA's weights and names, no biases, with
// sliding_window null or at least max_position_embeddings, where it masks nothing). Exports
// write MistralForCausalLM for a model loaded from one (its sliding_window kept),
// Qwen2ForCausalLM for q/k/v-only biases, else LlamaForCausalLM.
//
// The GPT is LLaMA's architecture, so the mapping is names only:
//   model.embed_tokens.weight                      embed.weight
//   model.layers.{i}.input_layernorm.weight        blocks.{i}.attn_norm.weight
//   model.layers.{i}.self_attn.{q,k,v,o}_proj.weight blocks.{i}.w{q,k,v,o}.weight
//   model.layers.{i}.self_attn.{q,k,v,o}_proj.bias   blocks.{i}.w{q,k,v,o}.bias (when present)
//   model.layers.{i}.post_attention_layernorm.weight blocks.{i}.mlp_norm.weight
//   model.layers.{i}.mlp.{gate,up,down}_proj.weight  blocks.{i}.w_{gate,up,down}.weight
//   model.norm.weight                              norm.weight
//   lm_head.weight                                 head.weight (absent when tied)
// Rotary layout: Meta's original checkpoints rotate interleaved channel pairs (2i, 2i+1); HF's
// converter permutes the rows of q_proj/k_proj so that its rotate_half() (pairs (i, i + d/2))
// computes the same thing. The GPT's apply_rope is rotate_half with HF's frequencies
// (theta^(-2i/d), cos/sin duplicated over both halves), so HF's q/k rows load unpermuted.
// Loading Meta's own consolidated.*.pth layout would need that permutation; zero does not read it.
#pragma once

#include <ATen/core/Tensor.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "zero/models/gpt.hpp"

namespace zero::models {

// The GPT shape DIR/config.json describes. Throws zero::ConfigError naming the key for a model
// the GPT cannot express (another architecture, MLP biases, longrope, a sliding window, ...).
GptConfig hf_llama_config(const std::string& dir);

// The HF name of a GPT parameter, e.g. "blocks.3.wq.weight" -> "model.layers.3.self_attn.q_proj
// .weight". Throws std::invalid_argument for a name outside the mapping.
std::string hf_llama_name(const std::string& gpt_name);

// Copies DIR's weights (any float dtype, converted to the parameter's) into `model`, whose shape
// must be hf_llama_config(DIR). Each tensor's bytes are read alone, from the one shard file the
// index names for it. Throws zero::CheckpointError naming the tensor for a missing tensor, a
// shape mismatch, or a tensor the GPT has no place for.
void load_hf_llama(GptImpl& model, const std::string& dir);

// DIR's weights as the source of a deferred model's values (zero/deferred_init.hpp): checks
// DIR against `model` as load_hf_llama does (before anything is read, on every rank alike),
// then zero::initialize takes from each tensor only the elements the rank keeps, copied out of
// a read-only memory map (SafetensorsFile::read_range): a stage-3 rank reads its shard and the
// root unit, not the model. Bit for bit load_hf_llama's values. `bytes_read`, when given, counts
// the bytes the source copies out of the files.
zero::InitialValues hf_llama_values(const GptImpl& model, const std::string& dir,
                                    std::shared_ptr<std::atomic<int64_t>> bytes_read = nullptr);

struct HfExportOptions {
  at::ScalarType dtype = at::kFloat;          // at::kFloat or at::kBFloat16
  int64_t max_shard_bytes = 5'000'000'000LL;  // HF's default; one file when everything fits
  std::string base_dir;  // optional: the HF model training started from (its token ids are kept)
};

// Writes `tensors` (GPT names, e.g. from zero::read_consolidated) to OUT as a LlamaForCausalLM
// directory: config.json, and model.safetensors or model-0000i-of-0000n.safetensors with
// model.safetensors.index.json. Returns the files written.
std::vector<std::string> save_hf_llama(
    const GptConfig& c, const std::vector<std::pair<std::string, at::Tensor>>& tensors,
    const std::string& out_dir, const HfExportOptions& opts);

}  // namespace zero::models
