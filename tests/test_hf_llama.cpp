// Hugging Face LLaMA interop of the example GPT without transformers (the e2e test
// hf_llama_roundtrip.sh checks against transformers itself): grouped-query attention equals
// multi-head attention with the key/value heads repeated, export -> load reproduces the model,
// and what the GPT cannot take fails naming the key or the tensor.
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "gpt.hpp"
#include "hf_llama.hpp"
#include "zero/checkpoint_io.hpp"
#include "zero/config.hpp"
#include "zero/safetensors.hpp"

namespace zero::examples {
namespace {

namespace fs = std::filesystem;

GptConfig gqa_config() {
  GptConfig c;
  c.vocab = 40, c.dim = 32, c.layers = 2, c.heads = 4, c.kv_heads = 2, c.ffn = 48, c.max_seq = 16;
  c.tied = false, c.norm_eps = 1e-6, c.rope_theta = 50000.0;
  return c;
}

std::vector<std::pair<std::string, at::Tensor>> named(GptImpl& m) {
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (const auto& item : m.named_parameters()) out.emplace_back(item.key(), item.value());
  return out;
}

struct TempDir {
  fs::path path = fs::temp_directory_path() /
                  ("zero_hf_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
  TempDir() { fs::create_directories(path); }
  ~TempDir() { fs::remove_all(path); }
  std::string str(const std::string& sub = "") const { return (path / sub).string(); }
  static inline int counter = 0;
};

TEST(HfLlama, GroupedQueryAttentionIsMultiHeadWithRepeatedKeyValueHeads) {
  const GptConfig gqa = gqa_config();
  GptConfig mha = gqa;
  mha.kv_heads = 0;
  at::manual_seed(1);
  Gpt a(gqa), b(mha);
  int64_t n = 0;
  for (const auto& p : a->parameters()) n += p.numel();
  EXPECT_EQ(n, gqa.num_params());
  {
    at::NoGradGuard g;
    auto pb = b->named_parameters();
    const int64_t hd = gqa.head_dim(), group = gqa.heads / gqa.kv_heads;
    for (const auto& [name, t] : named(*a)) {
      if (name.find(".wk.") != std::string::npos || name.find(".wv.") != std::string::npos) {
        // Query head h reads key/value head h / group: rows of kv head j, `group` times each.
        pb[name].copy_(t.view({gqa.kv_heads, hd, gqa.dim})
                           .repeat_interleave(group, 0)
                           .reshape({gqa.dim, gqa.dim}));
      } else {
        pb[name].copy_(t);
      }
    }
  }
  const at::Tensor tokens = at::randint(0, gqa.vocab, {2, 12}, at::kLong);
  const double diff = (a->forward(tokens) - b->forward(tokens)).abs().max().item<double>();
  EXPECT_LT(diff, 1e-5);
}

TEST(HfLlama, ShardedExportLoadsBackExactly) {
  TempDir dir;
  const GptConfig c = gqa_config();
  at::manual_seed(2);
  Gpt src(c);
  HfExportOptions opts;
  opts.max_shard_bytes = 20'000;  // several shards
  const auto files = save_hf_llama(c, named(*src), dir.str(), opts);
  EXPECT_GT(files.size(), 3u);
  EXPECT_TRUE(fs::exists(dir.str("model.safetensors.index.json")));
  // Tensor names are HF's.
  zero::SafetensorsFile first(dir.str(files.front()));
  EXPECT_TRUE(first.contains("model.embed_tokens.weight"));

  const GptConfig back = hf_llama_config(dir.str());
  EXPECT_EQ(back.num_params(), c.num_params());
  EXPECT_EQ(back.kv_heads_count(), 2);
  EXPECT_EQ(back.norm_eps, 1e-6);
  EXPECT_EQ(back.rope_theta, 50000.0);
  EXPECT_FALSE(back.tied);
  at::manual_seed(3);
  Gpt dst(back);
  load_hf_llama(*dst, dir.str());
  auto dp = dst->named_parameters();
  for (const auto& [name, t] : named(*src)) EXPECT_TRUE(at::equal(dp[name], t)) << name;
}

TEST(HfLlama, WhatTheGptCannotTakeFailsNamingIt) {
  TempDir dir;
  const GptConfig c = gqa_config();
  Gpt src(c);
  save_hf_llama(c, named(*src), dir.str(), {});
  const std::string cfg_path = dir.str("config.json");
  std::ifstream in(cfg_path);
  const std::string good((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  auto expect_config_error = [&](const std::string& from, const std::string& to,
                                 const std::string& key) {
    std::string text = good;
    const size_t at = text.find(from);
    ASSERT_NE(at, std::string::npos) << from;
    text.replace(at, from.size(), to);
    std::ofstream(cfg_path) << text;
    try {
      hf_llama_config(dir.str());
      ADD_FAILURE() << "accepted " << to;
    } catch (const zero::ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find(key), std::string::npos) << e.what();
    }
  };
  expect_config_error("\"model_type\": \"llama\"", "\"model_type\": \"gemma\"", "model_type");
  expect_config_error("\"mlp_bias\": false", "\"mlp_bias\": true", "mlp_bias");
  expect_config_error("\"rope_scaling\": null", "\"rope_scaling\": {\"rope_type\": \"yarn\"}",
                      "rope_scaling");
  expect_config_error("\"num_key_value_heads\": 2", "\"num_key_value_heads\": 3",
                      "num_key_value_heads");
  std::ofstream(cfg_path) << good;

  // One file without the last layer's down projection.
  auto tensors = named(*src);
  std::vector<std::pair<std::string, at::Tensor>> hf;
  for (const auto& [name, t] : tensors) {
    if (name != "blocks.1.w_down.weight") hf.emplace_back(hf_llama_name(name), t);
  }
  zero::write_safetensors(dir.str("model.safetensors"), hf, at::kFloat, {});
  Gpt dst(c);
  try {
    load_hf_llama(*dst, dir.str());
    ADD_FAILURE() << "loaded a model without model.layers.1.mlp.down_proj.weight";
  } catch (const zero::CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find("missing tensor 'model.layers.1.mlp.down_proj.weight'"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace zero::examples
