// Config's entry points: reading the file, batch-size resolution (DeepSpeed's rules) and typed
// access to the application's keys.
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>

#if __has_include(<yaml-cpp/depthguard.h>)  // yaml-cpp >= 0.7 bounds the nesting
#include <yaml-cpp/depthguard.h>
#define ZERO_YAML_DEPTH_GUARD 1
#endif

#include "zero/config.hpp"
#include "zero/config/config_schema.hpp"

namespace zero {

const char* dtype_name(Dtype d) {
  switch (d) {
    case Dtype::kFloat32:
      return "fp32";
    case Dtype::kBFloat16:
      return "bf16";
    case Dtype::kFloat16:
      return "fp16";
  }
  return "?";
}

Config Config::from_file(const std::string& path, const std::vector<std::string>& overrides,
                         const Extension* ext) {
  const auto unreadable = [&](int err) {
    return ConfigError("zero: cannot read config file '" + path + "': " + std::strerror(err) +
                       "; pass an existing YAML or JSON file to --config");
  };
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> f(std::fopen(path.c_str(), "rb"), &std::fclose);
  if (!f) throw unreadable(errno);
  std::string text;
  char buf[1 << 16];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, f.get())) > 0) text.append(buf, n);
  // fopen succeeds on a directory; the read is what fails (EISDIR).
  if (std::ferror(f.get())) throw unreadable(errno);
  return from_string(text, path, overrides, ext);
}

Config Config::from_string(const std::string& text, const std::string& source_name,
                           const std::vector<std::string>& overrides, const Extension* ext) {
  YAML::Node root;
  try {
    root = YAML::Load(text);
  }
#ifdef ZERO_YAML_DEPTH_GUARD
  catch (const YAML::DeepRecursion& e) {
    // yaml-cpp's own text for this is "bad file", which says nothing of what is wrong.
    throw ConfigError("zero: " + source_name + ":" + std::to_string(e.mark.line + 1) + ":" +
                      std::to_string(e.mark.column + 1) +
                      ": the document nests deeper than yaml-cpp's limit of " +
                      std::to_string(e.depth()) +
                      " levels (a config is a few levels deep: is this the file you meant?) "
                      "(yaml-cpp: " +
                      e.msg + ")");
  }
#endif
  catch (const YAML::Exception& e) {
    throw ConfigError("zero: " + source_name + ":" + std::to_string(e.mark.line + 1) + ":" +
                      std::to_string(e.mark.column + 1) + ": " + e.msg);
  }
  Config c;
  c.source = source_name;
  config_detail::Loader l(source_name, &c.warnings);
  try {
    for (const auto& o : overrides) l.apply_override(root, o);
    try {
      config_detail::load(l, root, ext, c);
    } catch (const ConfigError& e) {
      // A cross-key check after the walk: reported with whatever the walk collected.
      l.add_error(e.what());
    }
    l.finish();
  } catch (const YAML::Exception& e) {
    // Every access checks the node type first, so this would be a yaml-cpp surprise.
    throw ConfigError("zero: " + source_name + ": " + e.what());
  }
  return c;
}

void Config::resolve_batch(int world_size) {
  const auto fail = [&](const std::string& m) { throw ConfigError("zero: " + source + ": " + m); };
  const auto num = [](int64_t v) { return "(" + std::to_string(v) + ")"; };
  if (world_size <= 0) fail("world size must be positive, got " + std::to_string(world_size));
  const int64_t w = world_size;
  int64_t& tbs = train_batch_size;
  int64_t& mb = train_micro_batch_size_per_gpu;
  int64_t& ga = gradient_accumulation_steps;
  const auto product = [&](int64_t a, int64_t b) {
    int64_t r = 0;
    if (__builtin_mul_overflow(a, b, &r)) fail("the batch size overflows a 64-bit integer");
    return r;
  };

  // DeepSpeed's rules: any two of the triple determine the third; a lone train_batch_size or
  // micro batch means no accumulation.
  if (tbs > 0 && mb > 0 && ga > 0) {
    // checked below
  } else if (tbs > 0 && mb > 0) {
    const int64_t d = product(mb, w);
    if (tbs % d != 0) {
      fail("train_batch_size " + num(tbs) + " is not divisible by train_micro_batch_size_per_gpu " +
           num(mb) + " x world size " + num(w) + " = " + std::to_string(d) +
           ", so gradient_accumulation_steps cannot be derived; change one of them");
    }
    ga = tbs / d;
  } else if (tbs > 0 && ga > 0) {
    const int64_t d = product(ga, w);
    if (tbs % d != 0) {
      fail("train_batch_size " + num(tbs) + " is not divisible by gradient_accumulation_steps " +
           num(ga) + " x world size " + num(w) + " = " + std::to_string(d) +
           ", so train_micro_batch_size_per_gpu cannot be derived; change one of them");
    }
    mb = tbs / d;
  } else if (mb > 0 && ga > 0) {
    tbs = product(product(mb, ga), w);
  } else if (tbs > 0) {
    if (tbs % w != 0) {
      fail("train_batch_size " + num(tbs) + " is not divisible by world size " + num(w) +
           ", so train_micro_batch_size_per_gpu cannot be derived; set "
           "train_micro_batch_size_per_gpu and gradient_accumulation_steps too");
    }
    ga = 1;
    mb = tbs / w;
  } else if (mb > 0) {
    ga = 1;
    tbs = product(mb, w);
  } else if (ga > 0) {
    // HF configs leave the batch sizes "auto" and set only the accumulation.
    mb = 1;
    tbs = product(ga, w);
  } else {
    mb = 1;
    ga = 1;
    tbs = w;
  }

  const int64_t per_rank = product(mb, ga);
  const int64_t want = product(per_rank, w);
  if (tbs != want) {
    std::string m = "train_batch_size " + num(tbs) + " must equal train_micro_batch_size_per_gpu " +
                    num(mb) + " x gradient_accumulation_steps " + num(ga) + " x world size " +
                    num(w) + " = " + std::to_string(want) + "; change one of them";
    if (tbs % per_rank == 0) m += " or launch with " + std::to_string(tbs / per_rank) + " ranks";
    fail(m);
  }
  if (!auto_batch_keys.empty()) {
    std::string given;
    for (const auto& k : auto_batch_keys) given += (given.empty() ? "" : ", ") + k;
    warnings.push_back("zero: " + source + ": " + given + " \"auto\" resolved for " +
                       std::to_string(w) + " ranks: train_batch_size " + std::to_string(tbs) +
                       ", train_micro_batch_size_per_gpu " + std::to_string(mb) +
                       ", gradient_accumulation_steps " + std::to_string(ga));
    auto_batch_keys.clear();  // reported once, even if resolved again
  }
}

namespace {

const std::string& extra_text(const Config& c, const std::string& key) {
  auto it = c.extra.find(key);
  if (it == c.extra.end()) {
    throw ConfigError("zero: config has no key '" + key +
                      "' (declare it in the application's Config::Extension)");
  }
  return it->second;
}

[[noreturn]] void not_a(const Config& c, const std::string& key, const char* what) {
  throw ConfigError("zero: " + c.source + ": '" + key + "' is '" + extra_text(c, key) + "', not " +
                    what);
}

}  // namespace

int64_t Config::extra_int(const std::string& key) const {
  if (auto v = config_detail::parse_int(extra_text(*this, key))) return *v;
  not_a(*this, key, "an integer");
}

double Config::extra_float(const std::string& key) const {
  if (auto v = config_detail::parse_float(extra_text(*this, key))) return *v;
  not_a(*this, key, "a number");
}

bool Config::extra_bool(const std::string& key) const {
  if (auto v = config_detail::parse_bool(extra_text(*this, key))) return *v;
  not_a(*this, key, "true or false");
}

const std::string& Config::extra_string(const std::string& key) const {
  return extra_text(*this, key);
}

}  // namespace zero
