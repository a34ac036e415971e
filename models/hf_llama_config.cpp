// Reading a Hugging Face LLaMA-family config.json (llama, qwen2, mistral) into a GptConfig, each
// refusal naming the key and what the GPT can do instead.
#include <yaml-cpp/yaml.h>

#include <filesystem>
#include <string>

#include "models/hf_json.hpp"
#include "zero/config.hpp"
#include "zero/errors.hpp"
#include "zero/models/hf_llama.hpp"
#include "zero/models/rope.hpp"

namespace zero::models {
namespace fs = std::filesystem;

[[noreturn]] void ckpt_fail(const std::string& msg) { throw CheckpointError(msg); }

YAML::Node load_json(const std::string& path, const std::string& hint) {
  if (!fs::exists(path)) ckpt_fail(path + ": missing (" + hint + ")");
  try {
    return YAML::LoadFile(path);
  } catch (const YAML::Exception& e) {
    ckpt_fail(path + ": not valid JSON: " + e.what());
  }
}

namespace {

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

}  // namespace zero::models
