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

#include "zero/checkpoint_io.hpp"
#include "zero/config.hpp"
#include "zero/models/rope.hpp"
#include "zero/safetensors.hpp"

namespace zero::models {
namespace fs = std::filesystem;
namespace {

constexpr const char* kIndexFile = "model.safetensors.index.json";
constexpr const char* kSingleFile = "model.safetensors";

[[noreturn]] void ckpt_fail(const std::string& msg) { throw CheckpointError(msg); }

YAML::Node load_json(const std::string& path, const std::string& hint) {
  if (!fs::exists(path)) ckpt_fail(path + ": missing (" + hint + ")");
  try {
    return YAML::LoadFile(path);
  } catch (const YAML::Exception& e) {
    ckpt_fail(path + ": not valid JSON: " + e.what());
  }
}

// Reads config.json's keys, each error naming the key and what the GPT can do instead.
class ConfigReader {
 public:
  ConfigReader(YAML::Node root, std::string path)
      : root_(std::move(root)), path_(std::move(path)) {}

  // JSON null counts as absent, as transformers treats it.
  static bool present(const YAML::Node& n) { return n.IsDefined() && !n.IsNull(); }
  YAML::Node get(const std::string& key) const {
    const YAML::Node& root = root_;
    return root[key];
  }
  bool has(const std::string& key) const { return present(get(key)); }
  template <typename T>
  T required(const std::string& key) const {
    const YAML::Node n = get(key);
    if (!present(n)) fail(key, "is missing");
    return as<T>(n, key);
  }
  template <typename T>
  T optional(const std::string& key, T fallback) const {
    const YAML::Node n = get(key);
    return present(n) ? as<T>(n, key) : fallback;
  }
  template <typename T>
  T as(const YAML::Node& n, const std::string& key) const {
    try {
      return n.as<T>();
    } catch (const YAML::Exception&) {
      fail(key, "has the wrong type");
    }
  }
  [[noreturn]] void fail(const std::string& key, const std::string& what) const {
    throw ConfigError(path_ + ": " + key + " " + what);
  }

 private:
  YAML::Node root_;
  std::string path_;
};

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

// The RoPE variant of rope_parameters (or rope_scaling), with transformers' defaults.
void read_rope(const ConfigReader& r, const std::string& key, GptConfig& c) {
  const YAML::Node rp = r.get(key);
  if (!rp.IsMap()) r.fail(key, "is not an object");
  auto present = [&](const char* k) { return ConfigReader::present(rp[k]); };
  auto num = [&](const char* k) { return r.as<double>(rp[k], key + "." + k); };
  auto need = [&](const char* k) {
    if (!present(k)) r.fail(key + "." + k, "is missing (rope_type '" + c.rope.type + "' needs it)");
    return num(k);
  };
  if (present("rope_theta")) c.rope_theta = num("rope_theta");
  const char* type_key = present("rope_type") ? "rope_type" : "type";  // "type": transformers 4.3x
  if (present(type_key)) c.rope.type = r.as<std::string>(rp[type_key], key + "." + type_key);
  if (!rope_type_known(c.rope.type)) {
    r.fail(key + "." + type_key, "is '" + c.rope.type +
                                     "'; the GPT implements the RoPE types default, linear, "
                                     "dynamic, llama3 and yarn");
  }
  if (present("partial_rotary_factor") && num("partial_rotary_factor") != 1.0) {
    r.fail(key + ".partial_rotary_factor", "is not 1; the GPT rotates every channel of a head");
  }
  const std::string& t = c.rope.type;
  if (t == "default") return;
  const int64_t orig = present("original_max_position_embeddings")
                           ? r.as<int64_t>(rp["original_max_position_embeddings"],
                                           key + ".original_max_position_embeddings")
                           : c.max_seq;  // transformers' default for llama3 and yarn
  if (orig < 1) r.fail(key + ".original_max_position_embeddings", "is not positive");
  c.rope.original_max_seq = orig;
  if (t == "yarn" && !present("factor")) {
    c.rope.factor = static_cast<double>(c.max_seq) / static_cast<double>(orig);
  } else {
    c.rope.factor = need("factor");
  }
  if (!(c.rope.factor > 0)) r.fail(key + ".factor", "must be positive");
  if (t == "llama3") {
    c.rope.low_freq_factor = need("low_freq_factor");
    c.rope.high_freq_factor = need("high_freq_factor");
    if (!(c.rope.high_freq_factor > c.rope.low_freq_factor)) {
      r.fail(key + ".high_freq_factor", "must exceed low_freq_factor");
    }
  }
  if (t == "yarn") {
    // transformers: `get(k) or default`, so 0 and null both mean the default.
    if (present("attention_factor")) c.rope.attention_factor = num("attention_factor");
    if (present("beta_fast") && num("beta_fast") != 0) c.rope.beta_fast = num("beta_fast");
    if (present("beta_slow") && num("beta_slow") != 0) c.rope.beta_slow = num("beta_slow");
    if (present("mscale")) c.rope.mscale = num("mscale");
    if (present("mscale_all_dim")) c.rope.mscale_all_dim = num("mscale_all_dim");
    if (present("truncate")) c.rope.truncate = r.as<bool>(rp["truncate"], key + ".truncate");
  }
  if (t == "dynamic" && c.head_dim() <= 2) r.fail(key + ".rope_type", "dynamic needs head_dim > 2");
}

// Mistral's sliding_window (0: null). transformers masks key j for query i when i - j >=
// sliding_window, so a window of at least max_position_embeddings never masks anything in a
// sequence the GPT runs (it runs at most max_seq = max_position_embeddings tokens, and
// transformers then takes the same plain causal path, not merely an equal mask). A smaller
// window would change the attention of long sequences: refused, by name.
int64_t mistral_window(const ConfigReader& r, int64_t max_seq) {
  const YAML::Node n = r.get("sliding_window");
  if (n.IsDefined() && n.IsNull()) return 0;
  // Absent: MistralConfig's default, 4096.
  const int64_t w = n.IsDefined() ? r.as<int64_t>(n, "sliding_window") : 4096;
  if (w < 1) r.fail("sliding_window", "is not positive");
  if (w < max_seq) {
    r.fail("sliding_window",
           "is " + std::to_string(w) +
               std::string(n.IsDefined() ? "" : " (MistralConfig's default)") +
               ", below max_position_embeddings " + std::to_string(max_seq) +
               ": longer sequences would attend over that window only, and the GPT attends over "
               "the full causal window; zero loads Mistral with sliding_window null or at least "
               "max_position_embeddings");
  }
  return w;
}

}  // namespace

GptConfig hf_llama_config(const std::string& dir) {
  const std::string path = (fs::path(dir) / "config.json").string();
  ConfigReader r(load_json(path,
                           "a Hugging Face model directory holds config.json and its "
                           "*.safetensors; save one with save_pretrained()"),
                 path);
  // Qwen2 is LLaMA with biases on q/k/v (and optional sliding-window layers, refused below);
  // Mistral is LLaMA without biases and with an optional sliding window (refused below unless
  // no sequence the GPT runs can reach it).
  const std::string type = r.optional<std::string>("model_type", "llama");
  if (type != "llama" && type != "qwen2" && type != "mistral") {
    r.fail("model_type", "is '" + type +
                             "'; zero's GPT loads LLaMA ('llama'), Qwen2 ('qwen2') and Mistral "
                             "('mistral')");
  }
  const bool qwen2 = type == "qwen2", mistral = type == "mistral";
  const std::string arch =
      qwen2 ? "Qwen2ForCausalLM" : (mistral ? "MistralForCausalLM" : "LlamaForCausalLM");
  if (r.has("architectures")) {
    bool ok = false;
    std::string all;
    for (const auto& n : r.get("architectures")) {
      const std::string s = r.as<std::string>(n, "architectures");
      ok |= s == arch;
      all += (all.empty() ? "" : ", ") + s;
    }
    if (!ok)
      r.fail("architectures",
             "is [" + all + "]; for model_type '" + type + "' zero's GPT loads " + arch + " only");
  }
  GptConfig c;
  c.vocab = r.required<int64_t>("vocab_size");
  c.dim = r.required<int64_t>("hidden_size");
  c.ffn = r.required<int64_t>("intermediate_size");
  c.layers = r.required<int64_t>("num_hidden_layers");
  c.heads = r.required<int64_t>("num_attention_heads");
  c.kv_heads = r.optional<int64_t>("num_key_value_heads", c.heads);
  // MistralConfig's default is 4096 * 32.
  c.max_seq = r.optional<int64_t>("max_position_embeddings", mistral ? 131072 : 2048);
  c.norm_eps = r.optional<double>("rms_norm_eps", 1e-6);
  c.tied = r.optional<bool>("tie_word_embeddings", false);
  if (c.vocab < 1 || c.dim < 1 || c.ffn < 1 || c.layers < 1 || c.heads < 1 || c.max_seq < 1) {
    r.fail("vocab_size", "(or another size) is not positive");
  }
  if (c.dim % c.heads != 0 || (c.dim / c.heads) % 2 != 0) {
    r.fail("num_attention_heads", "must split hidden_size into heads of an even size");
  }
  if (c.kv_heads < 1 || c.heads % c.kv_heads != 0) {
    r.fail("num_key_value_heads", "must divide num_attention_heads");
  }
  if (const int64_t hd = r.optional<int64_t>("head_dim", c.head_dim()); hd != c.head_dim()) {
    r.fail("head_dim", "is " + std::to_string(hd) +
                           "; the GPT's head size is hidden_size / "
                           "num_attention_heads = " +
                           std::to_string(c.head_dim()));
  }
  if (const auto act = r.optional<std::string>("hidden_act", "silu"); act != "silu") {
    r.fail("hidden_act", "is '" + act + "'; the GPT's MLP is SwiGLU (silu)");
  }
  if (r.optional<bool>("mlp_bias", false)) {
    r.fail("mlp_bias", "is true; the GPT's MLP has no biases");
  }
  if (qwen2) {
    c.qkv_bias = true;  // Qwen2Attention: q/k/v biases always, none on o_proj
    if (r.optional<bool>("use_sliding_window", false)) {
      r.fail("use_sliding_window", "is true; the GPT attends over the full causal window");
    }
    if (r.has("layer_types")) {
      for (const auto& n : r.get("layer_types")) {
        const auto t = r.as<std::string>(n, "layer_types");
        if (t != "full_attention") {
          r.fail("layer_types", "holds '" + t + "'; the GPT has full_attention layers only");
        }
      }
    }
  } else if (mistral) {
    // MistralAttention has no biases whatever the config says.
    c.hf_model_type = "mistral";
    c.hf_sliding_window = mistral_window(r, c.max_seq);
  } else {
    c.qkv_bias = c.o_bias = r.optional<bool>("attention_bias", false);
  }
  if (r.optional<double>("attention_dropout", 0.0) != 0.0) {
    r.fail("attention_dropout", "is not 0; the GPT has no dropout");
  }
  if (r.optional<double>("partial_rotary_factor", 1.0) != 1.0) {
    r.fail("partial_rotary_factor", "is not 1; the GPT rotates every channel of a head");
  }
  // transformers >= 5 keeps rope_theta and the rope type in rope_parameters; older versions
  // write rope_theta and rope_scaling at the top level.
  c.rope_theta = r.optional<double>("rope_theta", 10000.0);
  const char* rope_key = r.has("rope_parameters") ? "rope_parameters" : "rope_scaling";
  if (r.has(rope_key)) read_rope(r, rope_key, c);
  return c;
}

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
