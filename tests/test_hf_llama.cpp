// Hugging Face LLaMA interop of the example GPT without transformers (the e2e test
// hf_llama_roundtrip.sh checks against transformers itself): grouped-query attention equals
// multi-head attention with the key/value heads repeated, export -> load reproduces the model,
// and what the GPT cannot take fails naming the key or the tensor.
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include "zero/checkpoint_io.hpp"
#include "zero/config.hpp"
#include "zero/models/gpt.hpp"
#include "zero/models/hf_llama.hpp"
#include "zero/models/rope.hpp"
#include "zero/safetensors.hpp"

namespace zero::examples {
namespace {

namespace fs = std::filesystem;

models::GptConfig gqa_config() {
  models::GptConfig c;
  c.vocab = 40, c.dim = 32, c.layers = 2, c.heads = 4, c.kv_heads = 2, c.ffn = 48, c.max_seq = 16;
  c.tied = false, c.norm_eps = 1e-6, c.rope_theta = 50000.0;
  return c;
}

std::vector<std::pair<std::string, at::Tensor>> named(models::GptImpl& m) {
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
  const models::GptConfig gqa = gqa_config();
  models::GptConfig mha = gqa;
  mha.kv_heads = 0;
  at::manual_seed(1);
  models::Gpt a(gqa), b(mha);
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
  const models::GptConfig c = gqa_config();
  at::manual_seed(2);
  models::Gpt src(c);
  models::HfExportOptions opts;
  opts.max_shard_bytes = 20'000;  // several shards
  const auto files = models::save_hf_llama(c, named(*src), dir.str(), opts);
  EXPECT_GT(files.size(), 3u);
  EXPECT_TRUE(fs::exists(dir.str("model.safetensors.index.json")));
  // Tensor names are HF's.
  zero::SafetensorsFile first(dir.str(files.front()));
  EXPECT_TRUE(first.contains("model.embed_tokens.weight"));

  const models::GptConfig back = models::hf_llama_config(dir.str());
  EXPECT_EQ(back.num_params(), c.num_params());
  EXPECT_EQ(back.kv_heads_count(), 2);
  EXPECT_EQ(back.norm_eps, 1e-6);
  EXPECT_EQ(back.rope_theta, 50000.0);
  EXPECT_FALSE(back.tied);
  at::manual_seed(3);
  models::Gpt dst(back);
  models::load_hf_llama(*dst, dir.str());
  auto dp = dst->named_parameters();
  for (const auto& [name, t] : named(*src)) EXPECT_TRUE(at::equal(dp[name], t)) << name;
}

TEST(HfLlama, WhatTheGptCannotTakeFailsNamingIt) {
  TempDir dir;
  const models::GptConfig c = gqa_config();
  models::Gpt src(c);
  models::save_hf_llama(c, named(*src), dir.str(), {});
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
      models::hf_llama_config(dir.str());
      ADD_FAILURE() << "accepted " << to;
    } catch (const zero::ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find(key), std::string::npos) << e.what();
    }
  };
  expect_config_error("\"model_type\": \"llama\"", "\"model_type\": \"gemma\"", "model_type");
  expect_config_error("\"mlp_bias\": false", "\"mlp_bias\": true", "mlp_bias");
  expect_config_error("\"rope_scaling\": null", "\"rope_scaling\": {\"rope_type\": \"longrope\"}",
                      "rope_scaling");
  expect_config_error("\"num_key_value_heads\": 2", "\"num_key_value_heads\": 3",
                      "num_key_value_heads");
  std::ofstream(cfg_path) << good;

  // One file without the last layer's down projection.
  auto tensors = named(*src);
  std::vector<std::pair<std::string, at::Tensor>> hf;
  for (const auto& [name, t] : tensors) {
    if (name != "blocks.1.w_down.weight") hf.emplace_back(models::hf_llama_name(name), t);
  }
  zero::write_safetensors(dir.str("model.safetensors"), hf, at::kFloat, {});
  models::Gpt dst(c);
  try {
    models::load_hf_llama(*dst, dir.str());
    ADD_FAILURE() << "loaded a model without model.layers.1.mlp.down_proj.weight";
  } catch (const zero::CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find("missing tensor 'model.layers.1.mlp.down_proj.weight'"),
              std::string::npos)
        << e.what();
  }
}

// Meta's reference for Llama 3.1's frequencies (llama/model.py, apply_scaling), in double: an
// independent statement of the formula rope.cpp mirrors from transformers in float32.
std::vector<double> meta_llama3(const models::GptConfig& c) {
  const models::RopeScaling& r = c.rope;
  const double old = static_cast<double>(r.original_max_seq);
  std::vector<double> out;
  for (int64_t i = 0; i < c.head_dim(); i += 2) {
    const double freq = 1.0 / std::pow(c.rope_theta, static_cast<double>(i) / c.head_dim());
    const double wavelen = 2 * M_PI / freq;
    if (wavelen < old / r.high_freq_factor) {
      out.push_back(freq);
    } else if (wavelen > old / r.low_freq_factor) {
      out.push_back(freq / r.factor);
    } else {
      const double smooth =
          (old / wavelen - r.low_freq_factor) / (r.high_freq_factor - r.low_freq_factor);
      out.push_back((1 - smooth) * freq / r.factor + smooth * freq);
    }
  }
  return out;
}

TEST(HfLlama, Llama3FrequenciesFollowMetasReference) {
  models::GptConfig c = gqa_config();
  c.dim = 64, c.heads = 4;  // head_dim 16: 8 frequencies
  c.rope_theta = 500000.0;
  c.rope.type = "llama3";
  c.rope.factor = 8.0, c.rope.low_freq_factor = 1.0, c.rope.high_freq_factor = 4.0;
  c.rope.original_max_seq = 64;
  const at::Tensor got = models::rope_frequencies(c).inv_freq;
  const auto want = meta_llama3(c);
  ASSERT_EQ(got.numel(), static_cast<int64_t>(want.size()));
  int kept = 0, divided = 0, smoothed = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_NEAR(got[i].item<double>(), want[i], 1e-6 * want[i]) << i;
    const double plain = 1.0 / std::pow(c.rope_theta, 2.0 * i / c.head_dim());
    if (std::abs(want[i] - plain) < 1e-12 * plain)
      ++kept;
    else if (std::abs(want[i] - plain / 8) < 1e-12 * plain)
      ++divided;
    else
      ++smoothed;
  }
  // The shape chosen exercises all three bands.
  EXPECT_GT(kept, 0);
  EXPECT_GT(divided, 0);
  EXPECT_GT(smoothed, 0);
}

TEST(HfLlama, YarnFrequenciesAndScaleFollowThePaper) {
  models::GptConfig c = gqa_config();
  c.dim = 64, c.heads = 4, c.max_seq = 128, c.rope_theta = 10000.0;
  c.rope.type = "yarn", c.rope.factor = 4.0, c.rope.original_max_seq = 32;
  const models::RopeFrequencies f = models::rope_frequencies(c);
  // YaRN (Peng et al. 2023), eq. 17-21: ramp over the dims whose wavelength r = L / lambda lies
  // between beta_slow and beta_fast rotations, mscale 0.1 ln(s) + 1.
  const double d = 16, L = 32, s = 4;
  auto dim_of = [&](double rot) {
    return d * std::log(L / (rot * 2 * M_PI)) / (2 * std::log(1e4));
  };
  const double lo = std::max(std::floor(dim_of(32)), 0.0),
               hi = std::min(std::ceil(dim_of(1)), d - 1);
  for (int64_t i = 0; i < 8; ++i) {
    const double theta = std::pow(1e4, -2.0 * i / d);
    const double ramp = std::clamp((i - lo) / (hi - lo), 0.0, 1.0);
    const double want = theta / s * ramp + theta * (1 - ramp);
    EXPECT_NEAR(f.inv_freq[i].item<double>(), want, 1e-6 * want) << i;
  }
  EXPECT_NEAR(f.attention_scaling, 0.1 * std::log(4.0) + 1.0, 1e-12);
  // The tables carry the scale: cos at position 0 is the scale itself.
  const auto [cos, sin] = models::rope_tables(c);
  EXPECT_NEAR(cos[0][0].item<double>(), f.attention_scaling, 1e-6);
}

TEST(HfLlama, LinearDividesAndDynamicKeepsTheFrequenciesWithinTheContext) {
  models::GptConfig c = gqa_config();
  const at::Tensor plain = models::rope_frequencies(c).inv_freq;
  c.rope.type = "linear", c.rope.factor = 2.0;
  EXPECT_TRUE(at::allclose(models::rope_frequencies(c).inv_freq, plain / 2.0, 0, 0));
  // transformers recomputes dynamic NTK frequencies only past max_position_embeddings, which the
  // GPT never reaches: within it they are the default ones.
  c.rope.type = "dynamic";
  EXPECT_TRUE(at::equal(models::rope_frequencies(c).inv_freq, plain));
}

TEST(HfLlama, BiasesAndRopeVariantsSurviveExportAndLoad) {
  for (const bool qwen2 : {true, false}) {
    TempDir dir;
    models::GptConfig c = gqa_config();
    c.qkv_bias = true, c.o_bias = !qwen2;  // Qwen2: q/k/v; LLaMA's attention_bias: all four
    c.rope.type = qwen2 ? "yarn" : "llama3";
    c.rope.factor = 4.0, c.rope.original_max_seq = 8, c.rope.attention_factor = 1.25;
    at::manual_seed(4);
    models::Gpt src(c);
    int64_t n = 0;
    for (const auto& p : src->parameters()) n += p.numel();
    EXPECT_EQ(n, c.num_params());
    {
      at::NoGradGuard g;
      for (auto& p : src->parameters()) {
        if (p.dim() == 1) p.uniform_(-1, 1);  // biases start at 0
      }
    }
    models::save_hf_llama(c, named(*src), dir.str(), {});
    std::ifstream in(dir.str("config.json"));
    const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    EXPECT_NE(text.find(qwen2 ? "Qwen2ForCausalLM" : "\"attention_bias\": true"), std::string::npos)
        << text;
    const models::GptConfig back = models::hf_llama_config(dir.str());
    EXPECT_EQ(back.qkv_bias, true);
    EXPECT_EQ(back.o_bias, !qwen2);
    EXPECT_EQ(back.rope.type, c.rope.type);
    EXPECT_EQ(back.rope.factor, 4.0);
    EXPECT_EQ(back.rope.original_max_seq, 8);
    models::Gpt dst(back);
    models::load_hf_llama(*dst, dir.str());
    EXPECT_TRUE(at::equal(dst->rope_cos, src->rope_cos));
    const at::Tensor tokens = at::randint(0, c.vocab, {1, 12}, at::kLong);
    EXPECT_TRUE(at::equal(dst->forward(tokens), src->forward(tokens)));
    const zero::SafetensorsFile f(dir.str("model.safetensors"));
    EXPECT_TRUE(f.contains("model.layers.1.self_attn.k_proj.bias"));
    EXPECT_EQ(f.contains("model.layers.1.self_attn.o_proj.bias"), !qwen2);
  }
}

TEST(HfLlama, ShapesTheGptCannotExpressFailNamingTheKey) {
  TempDir dir;
  models::GptConfig c = gqa_config();
  c.qkv_bias = true;  // exported as Qwen2
  models::Gpt src(c);
  models::save_hf_llama(c, named(*src), dir.str(), {});
  std::ifstream in(dir.str("config.json"));
  const std::string good((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  auto expect = [&](const std::string& from, const std::string& to, const std::string& key) {
    std::string text = good;
    const size_t at = text.find(from);
    ASSERT_NE(at, std::string::npos) << from;
    text.replace(at, from.size(), to);
    std::ofstream(dir.str("config.json")) << text;
    try {
      models::hf_llama_config(dir.str());
      ADD_FAILURE() << "accepted " << to;
    } catch (const zero::ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find(key), std::string::npos) << e.what();
    }
  };
  expect("\"rope_scaling\": null", "\"rope_scaling\": {\"rope_type\": \"longrope\"}",
         "rope_scaling.rope_type is 'longrope'");
  expect("\"rope_scaling\": null", "\"rope_scaling\": {\"type\": \"linear\"}",
         "rope_scaling.factor is missing");
  expect("\"rope_scaling\": null",
         "\"rope_scaling\": {\"rope_type\": \"llama3\", \"factor\": 8, \"low_freq_factor\": 1}",
         "rope_scaling.high_freq_factor is missing");
  expect("\"use_sliding_window\": false", "\"use_sliding_window\": true", "use_sliding_window");
  expect("\"rope_theta\"", "\"partial_rotary_factor\": 0.5, \"rope_theta\"",
         "partial_rotary_factor");
}

// Mistral: LLaMA's weights and names under model_type mistral. A sliding window that no sequence
// the GPT runs can reach (null, or at least max_position_embeddings) loads and is written back
// on export; a shorter one, or MistralConfig's default 4096 when the key is absent and the
// positions go further, is refused by name. (Against transformers itself: hf_variants.sh.)
TEST(HfLlama, MistralLoadsWhenItsWindowMasksNothing) {
  TempDir dir;
  models::GptConfig c = gqa_config();  // max_seq 16
  c.hf_model_type = "mistral";
  at::manual_seed(5);
  models::Gpt src(c);
  models::save_hf_llama(c, named(*src), dir.str(), {});
  const std::string cfg_path = dir.str("config.json");
  auto text = [&] {
    std::ifstream in(cfg_path);
    return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  };
  const std::string exported = text();
  EXPECT_NE(exported.find("\"architectures\": [\"MistralForCausalLM\"]"), std::string::npos);
  EXPECT_NE(exported.find("\"model_type\": \"mistral\""), std::string::npos);
  EXPECT_NE(exported.find("\"sliding_window\": null"), std::string::npos) << exported;
  EXPECT_EQ(exported.find("attention_bias"), std::string::npos) << "Mistral has no such key";
  models::GptConfig back = models::hf_llama_config(dir.str());
  EXPECT_EQ(back.hf_model_type, "mistral");
  EXPECT_EQ(back.hf_sliding_window, 0);
  EXPECT_EQ(back.num_params(), c.num_params());
  models::Gpt dst(back);
  models::load_hf_llama(*dst, dir.str());
  auto dp = dst->named_parameters();
  for (const auto& [name, t] : named(*src)) EXPECT_TRUE(at::equal(dp[name], t)) << name;

  // The export's config.json with each `from` replaced by its `to`.
  auto with = [&](const std::vector<std::pair<std::string, std::string>>& edits) {
    std::string t = exported;
    for (const auto& [from, to] : edits) {
      const size_t at = t.find(from);
      EXPECT_NE(at, std::string::npos) << from;
      if (at != std::string::npos) t.replace(at, from.size(), to);
    }
    std::ofstream(cfg_path) << t;
  };
  auto refused = [&](const std::string& want) {
    try {
      models::hf_llama_config(dir.str());
      ADD_FAILURE() << "accepted: " << text();
    } catch (const zero::ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
    }
  };
  // A window as long as the positions: loaded, and kept for the export.
  with({{"\"sliding_window\": null", "\"sliding_window\": 16"}});
  back = models::hf_llama_config(dir.str());
  EXPECT_EQ(back.hf_sliding_window, 16);
  TempDir again;
  models::save_hf_llama(back, named(*src), again.str(), {});
  EXPECT_EQ(models::hf_llama_config(again.str()).hf_sliding_window, 16);
  // Shorter: sequences of 16 tokens would see a window of 15.
  with({{"\"sliding_window\": null", "\"sliding_window\": 15"}});
  refused("sliding_window is 15, below max_position_embeddings 16");
  with({{"\"sliding_window\": null", "\"sliding_window\": 0"}});
  refused("sliding_window is not positive");
  // Absent: MistralConfig's default 4096, longer than these 16 positions (loads) ...
  with({{"  \"sliding_window\": null,\n", ""}});
  EXPECT_EQ(models::hf_llama_config(dir.str()).hf_sliding_window, 4096);
  // ... but not than 8192.
  with({{"  \"sliding_window\": null,\n", ""},
        {"\"max_position_embeddings\": 16,", "\"max_position_embeddings\": 8192,"}});
  refused("sliding_window is 4096 (MistralConfig's default), below max_position_embeddings 8192");
  // Another architecture under model_type mistral is refused as for llama.
  with({{"\"MistralForCausalLM\"", "\"LlamaForCausalLM\""}});
  refused("for model_type 'mistral' zero's GPT loads MistralForCausalLM only");
}

}  // namespace
}  // namespace zero::examples
