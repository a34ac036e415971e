#include "zero/models/hf_llama.hpp"

#include <ATen/ATen.h>
#include <yaml-cpp/yaml.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <stdexcept>

#include "models/hf_json.hpp"
#include "zero/checkpoint_io.hpp"
#include "zero/config.hpp"
#include "zero/models/rope.hpp"
#include "zero/safetensors.hpp"

namespace zero::models {
namespace fs = std::filesystem;
namespace {

constexpr const char* kIndexFile = "model.safetensors.index.json";
constexpr const char* kSingleFile = "model.safetensors";

std::string layer_name(const std::string& rest, int64_t layer, const std::string& gpt_name) {
  static const std::map<std::string, std::string> kBlock = {
      {"attn_norm.weight", "input_layernorm.weight"},
      {"wq.weight", "self_attn.q_proj.weight"},
      {"wk.weight", "self_attn.k_proj.weight"},
      {"wv.weight", "self_attn.v_proj.weight"},
      {"wo.weight", "self_attn.o_proj.weight"},
      {"wq.bias", "self_attn.q_proj.bias"},
      {"wk.bias", "self_attn.k_proj.bias"},
      {"wv.bias", "self_attn.v_proj.bias"},
      {"wo.bias", "self_attn.o_proj.bias"},
      {"mlp_norm.weight", "post_attention_layernorm.weight"},
      {"w_gate.weight", "mlp.gate_proj.weight"},
      {"w_up.weight", "mlp.up_proj.weight"},
      {"w_down.weight", "mlp.down_proj.weight"},
  };
  const auto it = kBlock.find(rest);
  if (it == kBlock.end()) {
    throw std::invalid_argument("GPT parameter '" + gpt_name + "' has no Hugging Face LLaMA name");
  }
  return "model.layers." + std::to_string(layer) + "." + it->second;
}

// Every parameter's shape in a GPT of `c`, in named_parameters() order, without building it.
std::vector<std::pair<std::string, std::vector<int64_t>>> gpt_shapes(const GptConfig& c) {
  const int64_t kv = c.kv_heads_count() * c.head_dim(), f = c.ffn_dim();
  std::vector<std::pair<std::string, std::vector<int64_t>>> out = {
      {"embed.weight", {c.vocab, c.dim}}};
  for (int64_t i = 0; i < c.layers; ++i) {
    const std::string b = "blocks." + std::to_string(i) + ".";
    out.push_back({b + "attn_norm.weight", {c.dim}});
    out.push_back({b + "wq.weight", {c.dim, c.dim}});
    if (c.qkv_bias) out.push_back({b + "wq.bias", {c.dim}});
    out.push_back({b + "wk.weight", {kv, c.dim}});
    if (c.qkv_bias) out.push_back({b + "wk.bias", {kv}});
    out.push_back({b + "wv.weight", {kv, c.dim}});
    if (c.qkv_bias) out.push_back({b + "wv.bias", {kv}});
    out.push_back({b + "wo.weight", {c.dim, c.dim}});
    if (c.o_bias) out.push_back({b + "wo.bias", {c.dim}});
    out.push_back({b + "mlp_norm.weight", {c.dim}});
    out.push_back({b + "w_gate.weight", {f, c.dim}});
    out.push_back({b + "w_up.weight", {f, c.dim}});
    out.push_back({b + "w_down.weight", {c.dim, f}});
  }
  out.push_back({"norm.weight", {c.dim}});
  if (!c.tied) out.push_back({"head.weight", {c.vocab, c.dim}});
  return out;
}

std::string shape_text(at::IntArrayRef s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

// The shortest decimal that reads back as `v` (1e-06, not 9.9999999999999995e-07).
std::string number(double v) {
  char buf[32];
  for (int p = 6; p <= 17; ++p) {
    std::snprintf(buf, sizeof buf, "%.*g", p, v);
    if (std::stod(buf) == v) break;
  }
  std::string s = buf;
  if (s.find_first_of(".eE") == std::string::npos) s += ".0";
  return s;
}

// A token id key of the base config (an int, a list of ints, or absent), as JSON.
std::optional<std::string> token_ids(const YAML::Node& base, const char* key) {
  const YAML::Node n = base[key];
  if (!n.IsDefined() || n.IsNull()) return std::nullopt;
  try {
    if (n.IsScalar()) return std::to_string(n.as<int64_t>());
    std::string out = "[";
    for (size_t i = 0; i < n.size(); ++i)
      out += (i ? ", " : "") + std::to_string(n[i].as<int64_t>());
    return out + "]";
  } catch (const YAML::Exception&) {
    return std::nullopt;
  }
}

// rope_scaling in the form transformers 4.x writes and 5.x still reads (it moves the dict and the
// top-level rope_theta into rope_parameters).
std::string rope_json(const RopeScaling& r) {
  if (r.type == "default") return "null";
  std::string j = "{\"rope_type\": \"" + r.type + "\", \"factor\": " + number(r.factor);
  if (r.type == "llama3") {
    j += ", \"low_freq_factor\": " + number(r.low_freq_factor) +
         ", \"high_freq_factor\": " + number(r.high_freq_factor);
  }
  if (r.type == "llama3" || r.type == "yarn") {
    j += ", \"original_max_position_embeddings\": " + std::to_string(r.original_max_seq);
  }
  if (r.type == "yarn") {
    if (r.attention_factor > 0) j += ", \"attention_factor\": " + number(r.attention_factor);
    j += ", \"beta_fast\": " + number(r.beta_fast) + ", \"beta_slow\": " + number(r.beta_slow);
    if (r.mscale != 0) j += ", \"mscale\": " + number(r.mscale);
    if (r.mscale_all_dim != 0) j += ", \"mscale_all_dim\": " + number(r.mscale_all_dim);
    j += std::string(", \"truncate\": ") + (r.truncate ? "true" : "false");
  }
  return j + "}";
}

std::string config_json(const GptConfig& c, const HfExportOptions& opts) {
  // Biases on q/k/v only are Qwen2's attention; LLaMA's attention_bias puts one on o_proj too.
  const bool mistral = c.hf_model_type == "mistral" && !c.qkv_bias && !c.o_bias;
  const bool qwen2 = !mistral && c.qkv_bias && !c.o_bias;
  const std::string type = mistral ? "mistral" : (qwen2 ? "qwen2" : "llama");
  const std::string arch =
      mistral ? "MistralForCausalLM" : (qwen2 ? "Qwen2ForCausalLM" : "LlamaForCausalLM");
  std::string j =
      "{\n  \"architectures\": [\"" + arch + "\"],\n  \"model_type\": \"" + type + "\",\n";
  auto add = [&](const char* key, const std::string& value) {
    j += std::string("  \"") + key + "\": " + value + ",\n";
  };
  add("vocab_size", std::to_string(c.vocab));
  add("hidden_size", std::to_string(c.dim));
  add("intermediate_size", std::to_string(c.ffn_dim()));
  add("num_hidden_layers", std::to_string(c.layers));
  add("num_attention_heads", std::to_string(c.heads));
  add("num_key_value_heads", std::to_string(c.kv_heads_count()));
  if (!qwen2) add("head_dim", std::to_string(c.head_dim()));
  add("hidden_act", "\"silu\"");
  add("max_position_embeddings", std::to_string(c.max_seq));
  add("rms_norm_eps", number(c.norm_eps));
  add("rope_theta", number(c.rope_theta));
  add("rope_scaling", rope_json(c.rope));
  if (qwen2) {
    add("use_sliding_window", "false");
    add("sliding_window", "null");
    add("max_window_layers", std::to_string(c.layers));
  } else if (mistral) {
    add("sliding_window",
        c.hf_sliding_window > 0 ? std::to_string(c.hf_sliding_window) : std::string("null"));
  } else {
    add("attention_bias", c.qkv_bias ? "true" : "false");
    add("mlp_bias", "false");
  }
  add("attention_dropout", "0.0");
  add("tie_word_embeddings", c.tied ? "true" : "false");
  if (!opts.base_dir.empty()) {
    const YAML::Node base = load_json(opts.base_dir + "/config.json", "the base model's config");
    for (const char* key : {"bos_token_id", "eos_token_id", "pad_token_id"}) {
      if (auto v = token_ids(base, key)) add(key, *v);
    }
  }
  j += std::string("  \"torch_dtype\": \"") +
       (opts.dtype == at::kBFloat16 ? "bfloat16" : "float32") + "\"\n}\n";
  return j;
}

void write_text(const std::string& path, const std::string& text) {
  std::ofstream f(path, std::ios::trunc);
  f << text;
  f.close();
  if (!f) ckpt_fail(path + ": cannot write");
}

}  // namespace

std::string hf_llama_name(const std::string& gpt_name) {
  if (gpt_name == "embed.weight") return "model.embed_tokens.weight";
  if (gpt_name == "norm.weight") return "model.norm.weight";
  if (gpt_name == "head.weight") return "lm_head.weight";
  const std::string prefix = "blocks.";
  if (gpt_name.rfind(prefix, 0) == 0) {
    const size_t dot = gpt_name.find('.', prefix.size());
    if (dot != std::string::npos) {
      const std::string idx = gpt_name.substr(prefix.size(), dot - prefix.size());
      if (!idx.empty() && idx.find_first_not_of("0123456789") == std::string::npos) {
        return layer_name(gpt_name.substr(dot + 1), std::stoll(idx), gpt_name);
      }
    }
  }
  throw std::invalid_argument("GPT parameter '" + gpt_name + "' has no Hugging Face LLaMA name");
}

namespace {

// Where each of the GPT's parameters is in DIR (file and HF name), checked against the model
// before any weight is read: a missing tensor, a shape or dtype the GPT cannot take, a tensor
// the GPT has no place for. Only the headers are read.
struct HfTensors {
  struct Source {
    const SafetensorsFile* file = nullptr;
    std::string name;
  };
  std::map<std::string, SafetensorsFile> files;
  std::map<std::string, Source> of_param;  // GPT name -> where
};

std::shared_ptr<HfTensors> open_hf_tensors(const GptImpl& model, const std::string& dir) {
  auto out = std::make_shared<HfTensors>();
  // Where each tensor is: the index's weight_map, or the one file's header.
  std::map<std::string, std::string> where;
  const std::string index_path = (fs::path(dir) / kIndexFile).string();
  const std::string single_path = (fs::path(dir) / kSingleFile).string();
  std::map<std::string, SafetensorsFile>& files = out->files;
  if (fs::exists(index_path)) {
    const YAML::Node map = load_json(index_path, "")["weight_map"];
    if (!map.IsMap()) ckpt_fail(index_path + ": no weight_map object");
    for (const auto& kv : map) where[kv.first.as<std::string>()] = kv.second.as<std::string>();
  } else if (fs::exists(single_path)) {
    SafetensorsFile f(single_path);
    for (const auto& n : f.names()) where[n] = kSingleFile;
    files.emplace(kSingleFile, std::move(f));
  } else {
    ckpt_fail(dir + ": neither " + kSingleFile + " nor " + kIndexFile +
              " (zero reads safetensors only; save with save_pretrained(safe_serialization=True))");
  }

  std::set<std::string> used;
  for (const auto& item : model.named_parameters()) {
    const std::string hf = hf_llama_name(item.key());
    const auto it = where.find(hf);
    if (it == where.end()) {
      ckpt_fail(dir + ": missing tensor '" + hf + "' (the GPT's " + item.key() + ")");
    }
    auto f = files.find(it->second);
    if (f == files.end()) {
      const std::string shard = (fs::path(dir) / it->second).string();
      f = files.emplace(it->second, SafetensorsFile(shard)).first;
    }
    const auto& e = f->second.entry(hf);
    const at::Tensor& p = item.value();
    if (at::IntArrayRef(e.shape) != p.sizes()) {
      ckpt_fail(f->second.path() + ": tensor '" + hf + "' has shape " + shape_text(e.shape) +
                "; config.json makes the GPT's " + item.key() + " " + shape_text(p.sizes()));
    }
    if (e.dtype != "F32" && e.dtype != "BF16" && e.dtype != "F16" && e.dtype != "F64") {
      ckpt_fail(f->second.path() + ": tensor '" + hf + "' is " + e.dtype + ", not a float type");
    }
    out->of_param[item.key()] = {&f->second, hf};
    used.insert(hf);
  }
  for (const auto& [name, file] : where) {
    if (used.count(name)) continue;
    // Older checkpoints store the rotary frequencies (recomputed here from rope_theta) and, for
    // tied models, a copy of the embedding as lm_head.
    if (name.find("rotary_emb.inv_freq") != std::string::npos) continue;
    if (name == "lm_head.weight" && model.cfg.tied) continue;
    ckpt_fail(dir + "/" + file + ": tensor '" + name +
              "' has no place in the GPT (an architecture beyond LLaMA's?)");
  }
  return out;
}

}  // namespace

void load_hf_llama(GptImpl& model, const std::string& dir) {
  for (const auto& p : model.parameters()) {
    if (zero::is_deferred(p)) {
      throw std::invalid_argument(
          "load_hf_llama: the model is deferred (built with zero::Deferred); pass "
          "hf_llama_values(model, \"" + dir + "\") to zero::initialize instead");
    }
  }
  const std::shared_ptr<HfTensors> t = open_hf_tensors(model, dir);
  at::NoGradGuard no_grad;
  for (auto& item : model.named_parameters()) {
    const HfTensors::Source& src = t->of_param.at(item.key());
    // Each tensor's bytes read alone.
    item.value().copy_(src.file->read(src.name));
  }
}

zero::InitialValues hf_llama_values(const GptImpl& model, const std::string& dir,
                                    std::shared_ptr<std::atomic<int64_t>> bytes_read) {
  std::shared_ptr<HfTensors> t = open_hf_tensors(model, dir);
  return [t, bytes_read](const std::string& name, at::IntArrayRef /*shape*/,
                         const std::vector<zero::ParamPiece>& pieces) {
    const auto it = t->of_param.find(name);
    TORCH_CHECK(it != t->of_param.end(), "hf_llama_values: '", name,
                "' is not a parameter of the model the source was made for");
    for (const zero::ParamPiece& piece : pieces) {
      // Converted as load_hf_llama's copy_ into an fp32 parameter converts.
      const at::Tensor bytes =
          it->second.file->read_range(it->second.name, piece.begin, piece.out.numel());
      if (bytes_read) *bytes_read += static_cast<int64_t>(bytes.nbytes());
      piece.out.copy_(bytes);
    }
  };
}

std::vector<std::string> save_hf_llama(
    const GptConfig& c, const std::vector<std::pair<std::string, at::Tensor>>& tensors,
    const std::string& out_dir, const HfExportOptions& opts) {
  if (opts.dtype != at::kFloat && opts.dtype != at::kBFloat16) {
    throw std::invalid_argument("Hugging Face export writes fp32 or bf16");
  }
  // The tensors must be exactly the GPT of `c`: a mismatch here would only surface in the
  // consumer as a shape error far from its cause.
  std::map<std::string, at::Tensor> by_name(tensors.begin(), tensors.end());
  std::vector<std::pair<std::string, at::Tensor>> ordered;
  for (const auto& [name, shape] : gpt_shapes(c)) {
    const auto it = by_name.find(name);
    if (it == by_name.end()) ckpt_fail("Hugging Face export: the checkpoint has no '" + name + "'");
    if (it->second.sizes() != at::IntArrayRef(shape)) {
      ckpt_fail("Hugging Face export: '" + name + "' has shape " + shape_text(it->second.sizes()) +
                "; the model config makes it " + shape_text(shape));
    }
    ordered.emplace_back(hf_llama_name(name), it->second);
    by_name.erase(it);
  }
  if (!by_name.empty()) {
    ckpt_fail("Hugging Face export: '" + by_name.begin()->first +
              "' is not a parameter of the model config's GPT");
  }

  // Greedy shards in model order, as transformers' save_pretrained(max_shard_size=) does.
  const int64_t elem = opts.dtype == at::kFloat ? 4 : 2;
  std::vector<std::vector<std::pair<std::string, at::Tensor>>> shards(1);
  int64_t in_shard = 0, total = 0;
  for (auto& t : ordered) {
    const int64_t bytes = t.second.numel() * elem;
    if (in_shard > 0 && in_shard + bytes > opts.max_shard_bytes) {
      shards.emplace_back();
      in_shard = 0;
    }
    shards.back().push_back(std::move(t));
    in_shard += bytes;
    total += bytes;
  }
  fs::create_directories(out_dir);
  // A previous export's files would mix with these (another shard count names other files).
  for (const auto& f : fs::directory_iterator(out_dir)) {
    const std::string name = f.path().filename().string();
    if (name == kSingleFile || name == kIndexFile ||
        (name.rfind("model-", 0) == 0 && name.find("-of-") != std::string::npos)) {
      fs::remove(f.path());
    }
  }
  std::vector<std::string> written;
  std::string weight_map;
  const size_t n = shards.size();
  for (size_t i = 0; i < n; ++i) {
    char name[64];
    std::snprintf(name, sizeof name, "model-%05zu-of-%05zu.safetensors", i + 1, n);
    const std::string file = n == 1 ? kSingleFile : name;
    write_safetensors((fs::path(out_dir) / file).string(), shards[i], opts.dtype,
                      {{"format", "pt"}});
    written.push_back(file);
    for (const auto& t : shards[i]) {
      weight_map += std::string(weight_map.empty() ? "" : ",\n") + "    \"" + t.first + "\": \"" +
                    file + "\"";
    }
  }
  if (n > 1) {
    write_text((fs::path(out_dir) / kIndexFile).string(),
               "{\n  \"metadata\": {\"total_size\": " + std::to_string(total) +
                   "},\n  \"weight_map\": {\n" + weight_map + "\n  }\n}\n");
    written.push_back(kIndexFile);
  }
  write_text((fs::path(out_dir) / "config.json").string(), config_json(c, opts));
  written.push_back("config.json");
  return written;
}

}  // namespace zero::models
