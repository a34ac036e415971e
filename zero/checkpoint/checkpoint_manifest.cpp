// manifest.json: written by hand (a few fields, no JSON library needed), read back with
// yaml-cpp (JSON is YAML). Tags, the `latest` pointer and pruning live here too.
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <set>
#include <tuple>

#include "zero/checkpoint/checkpoint_format.hpp"

namespace zero::ckpt {
namespace fs = std::filesystem;
std::string json_quote(const std::string& s) {
  std::string out = "\"";
  for (unsigned char c : s) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (c < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", c);
          out += buf;
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  return out + "\"";
}

namespace {

std::string quote(const std::string& s) { return json_quote(s); }

// "[2, 3]"
std::string int_list(const std::vector<int64_t>& v) {
  std::string t = "[";
  for (size_t i = 0; i < v.size(); ++i) t += (i ? ", " : "") + std::to_string(v[i]);
  return t + "]";
}

std::string number(double v) {
  if (!std::isfinite(v)) return "0";  // JSON has no inf/NaN; these fields are informative
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.17g", v);
  return buf;
}

template <typename T>
T get(const YAML::Node& n, const char* key, const std::string& path) {
  const YAML::Node v = n[key];
  ZERO_CKPT_CHECK(v.IsDefined() && !v.IsNull(), path, ": corrupted: the manifest has no '", key,
                  "' (restore it or load another tag)");
  try {
    return v.as<T>();
  } catch (const YAML::Exception&) {
    fail(path, ": corrupted: the manifest's '", key, "' has the wrong type");
  }
}

const std::string kChecksumField = ",\n  \"manifest_checksum\": \"";

void verify_checksum(const std::string& text, const std::string& path) {
  const size_t at = text.rfind(kChecksumField);
  ZERO_CKPT_CHECK(at != std::string::npos, path,
                  ": corrupted: the manifest has no manifest_checksum (written by an older zero "
                  "or edited by hand); restore it or load another tag");
  const std::string stored = text.substr(at + kChecksumField.size(), 16);
  ZERO_CKPT_CHECK(stored == fnv1a_hex(text.substr(0, at)), path,
                  ": corrupted: the manifest does not match its manifest_checksum (edited by hand "
                  "or damaged); restore it or load another tag, never edit a manifest");
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

}  // namespace

std::string manifest_to_json(const Manifest& m) {
  std::string j = "{\n  \"format\": \"zero-checkpoint\",\n";
  j += "  \"format_version\": " + std::to_string(m.format_version) + ",\n";
  j += "  \"tag\": " + quote(m.tag) + ",\n";
  j += "  \"fingerprint\": " + quote(m.fingerprint) + ",\n";
  j += "  \"world_size\": " + std::to_string(m.world_size) + ",\n";
  j += "  \"stage\": " + std::to_string(m.stage) + ",\n";
  j += "  \"param_dtype\": " + quote(m.param_dtype) + ",\n";
  j += "  \"optimizer\": {\"name\": " + quote(m.optimizer) +
       ", \"steps\": " + std::to_string(m.optimizer_internal_steps) + ", \"states\": [";
  for (size_t i = 0; i < m.state_names.size(); ++i) j += (i ? ", " : "") + quote(m.state_names[i]);
  j += "], \"param_groups\": " + quote(m.param_groups) + "},\n";
  j += "  \"optimizer_steps\": " + std::to_string(m.optimizer_steps) + ",\n";
  j += "  \"micro_steps\": " + std::to_string(m.micro_steps) + ",\n";
  j += "  \"skipped_steps\": " + std::to_string(m.skipped_steps) + ",\n";
  j += "  \"gradient_accumulation_steps\": " + std::to_string(m.accumulation) + ",\n";
  j += "  \"scheduler_step\": " + std::to_string(m.optimizer_steps) + ",\n";
  j += "  \"last_grad_norm\": " + number(m.last_grad_norm) + ",\n";
  j += "  \"loss_scaler\": {\"scale\": " + number(m.loss_scale) +
       ", \"iter\": " + std::to_string(m.scaler_iter) +
       ", \"last_overflow_iter\": " + std::to_string(m.scaler_last_overflow_iter) +
       ", \"hysteresis_left\": " + std::to_string(m.scaler_hysteresis_left) + "},\n";
  j += "  \"rng\": \"each rank's CPU (and CUDA) generator states are in its shard's index\",\n";
  j += "  \"config_source\": " + quote(m.config_source) + ",\n";
  j += "  \"config_text\": " + quote(m.config_text) + ",\n  \"config\": {";
  for (size_t i = 0; i < m.config.size(); ++i) {
    j += std::string(i ? "," : "") + "\n    " + quote(m.config[i].first) + ": " +
         quote(m.config[i].second);
  }
  j += "\n  },\n  \"params\": [";
  for (size_t i = 0; i < m.params.size(); ++i) {
    const CheckpointParam& p = m.params[i];
    j += std::string(i ? "," : "") + "\n    {\"name\": " + quote(p.name) +
         ", \"shape\": " + int_list(p.shape) +
         ", \"global_shape\": " + int_list(p.global_shape.empty() ? p.shape : p.global_shape) +
         ", \"offset\": " +
         int_list(p.offset.empty() ? std::vector<int64_t>(p.shape.size(), 0) : p.offset) + "}";
  }
  j += "\n  ],";
  if (!m.units.empty()) {
    j += "\n  \"units\": [";
    for (size_t i = 0; i < m.units.size(); ++i) {
      const Manifest::Unit& u = m.units[i];
      j += std::string(i ? "," : "") + "\n    {\"name\": " + quote(u.name) + ", \"params\": [";
      for (size_t k = 0; k < u.params.size(); ++k) j += (k ? ", " : "") + quote(u.params[k]);
      j += "], \"offsets\": " + int_list(u.offsets) + ", \"numel\": " + std::to_string(u.numel) +
           "}";
    }
    j += "\n  ],";
  }
  j += "\n  \"files\": [";
  for (size_t i = 0; i < m.files.size(); ++i) {
    j += std::string(i ? "," : "") + "\n    {\"name\": " + quote(m.files[i].name) +
         ", \"bytes\": " + std::to_string(m.files[i].bytes) +
         ", \"crc32\": " + std::to_string(m.files[i].payload_crc) + "}";
  }
  j += "\n  ]";
  // Last, over every byte before it: a manifest edited by hand (a step count, a world size) is
  // refused instead of resuming from a state that was never trained.
  j += kChecksumField + fnv1a_hex(j) + "\"\n}\n";
  return j;
}

Manifest parse_manifest(const std::string& text, const std::string& path) {
  verify_checksum(text, path);
  YAML::Node n;
  try {
    n = YAML::Load(text);
  } catch (const YAML::Exception& e) {
    fail(path, ": corrupted: not valid JSON (", e.what(), "); restore it or load another tag");
  }
  ZERO_CKPT_CHECK(n.IsMap() && n["format"] && n["format"].as<std::string>() == "zero-checkpoint",
                  path, ": not a zero checkpoint manifest");
  Manifest m;
  m.format_version = get<int>(n, "format_version", path);
  ZERO_CKPT_CHECK(m.format_version == kFormatVersion, path, ": checkpoint format version ",
                  m.format_version, "; this build reads version ", kFormatVersion);
  m.tag = get<std::string>(n, "tag", path);
  m.fingerprint = get<std::string>(n, "fingerprint", path);
  m.world_size = get<int>(n, "world_size", path);
  m.stage = get<int>(n, "stage", path);
  m.param_dtype = get<std::string>(n, "param_dtype", path);
  const YAML::Node opt = n["optimizer"];
  ZERO_CKPT_CHECK(opt.IsMap(), path, ": corrupted: the manifest has no 'optimizer' section");
  m.optimizer = get<std::string>(opt, "name", path);
  m.optimizer_internal_steps = get<int64_t>(opt, "steps", path);
  m.state_names = get<std::vector<std::string>>(opt, "states", path);
  // Absent in checkpoints written before parameter groups existed: they had none.
  if (opt["param_groups"]) m.param_groups = get<std::string>(opt, "param_groups", path);
  m.optimizer_steps = get<int64_t>(n, "optimizer_steps", path);
  m.micro_steps = get<int64_t>(n, "micro_steps", path);
  m.skipped_steps = get<int64_t>(n, "skipped_steps", path);
  m.accumulation = get<int64_t>(n, "gradient_accumulation_steps", path);
  m.last_grad_norm = get<double>(n, "last_grad_norm", path);
  const YAML::Node ls = n["loss_scaler"];
  ZERO_CKPT_CHECK(ls.IsMap(), path, ": corrupted: the manifest has no 'loss_scaler' section");
  m.loss_scale = get<double>(ls, "scale", path);
  m.scaler_iter = get<int64_t>(ls, "iter", path);
  m.scaler_last_overflow_iter = get<int64_t>(ls, "last_overflow_iter", path);
  m.scaler_hysteresis_left = get<int64_t>(ls, "hysteresis_left", path);
  m.config_source = get<std::string>(n, "config_source", path);
  for (const auto& kv : n["config"]) {
    m.config.emplace_back(kv.first.as<std::string>(), kv.second.as<std::string>());
  }
  const YAML::Node params = n["params"];
  ZERO_CKPT_CHECK(params.IsSequence(), path, ": corrupted: the manifest has no 'params' list");
  for (const auto& p : params) {
    CheckpointParam cp{get<std::string>(p, "name", path),
                       get<std::vector<int64_t>>(p, "shape", path)};
    // Absent in checkpoints written before parameters could be parts: they were whole.
    cp.global_shape =
        p["global_shape"] ? get<std::vector<int64_t>>(p, "global_shape", path) : cp.shape;
    cp.offset = p["offset"] ? get<std::vector<int64_t>>(p, "offset", path)
                            : std::vector<int64_t>(cp.shape.size(), 0);
    bool inside = cp.global_shape.size() == cp.shape.size() && cp.offset.size() == cp.shape.size();
    for (size_t d = 0; inside && d < cp.shape.size(); ++d) {
      inside = cp.offset[d] >= 0 && cp.offset[d] + cp.shape[d] <= cp.global_shape[d];
    }
    ZERO_CKPT_CHECK(inside, path, ": corrupted: parameter '", cp.name, "' of shape ",
                    int_list(cp.shape), " at offset ", int_list(cp.offset),
                    " does not lie inside its global shape ", int_list(cp.global_shape));
    m.params.push_back(std::move(cp));
  }
  // Only stage 3 writes them; each names parameters of the checkpoint, at an offset in its unit.
  if (const YAML::Node units = n["units"]) {
    ZERO_CKPT_CHECK(units.IsSequence(), path, ": corrupted: the manifest's 'units' is not a list");
    std::set<std::string> names;
    for (const CheckpointParam& p : m.params) names.insert(p.name);
    for (const auto& u : units) {
      Manifest::Unit unit{
          get<std::string>(u, "name", path), get<std::vector<std::string>>(u, "params", path),
          get<std::vector<int64_t>>(u, "offsets", path), get<int64_t>(u, "numel", path)};
      ZERO_CKPT_CHECK(unit.params.size() == unit.offsets.size(), path, ": corrupted: unit '",
                      unit.name, "' lists ", unit.params.size(), " parameters but ",
                      unit.offsets.size(), " offsets");
      for (size_t k = 0; k < unit.params.size(); ++k) {
        ZERO_CKPT_CHECK(
            names.count(unit.params[k]) && unit.offsets[k] >= 0 && unit.offsets[k] <= unit.numel,
            path, ": corrupted: unit '", unit.name, "' holds '", unit.params[k], "' at offset ",
            unit.offsets[k], ", which is not a parameter of the checkpoint inside the unit's ",
            unit.numel, " elements");
      }
      m.units.push_back(std::move(unit));
    }
  }
  const YAML::Node files = n["files"];
  ZERO_CKPT_CHECK(files.IsSequence() && static_cast<int>(files.size()) == m.world_size, path,
                  ": corrupted: the manifest must list ", m.world_size, " shard files");
  for (const auto& f : files) {
    m.files.push_back({get<std::string>(f, "name", path), get<uint64_t>(f, "bytes", path),
                       get<uint32_t>(f, "crc32", path)});
  }
  for (int r = 0; r < m.world_size; ++r) {
    ZERO_CKPT_CHECK(m.files[r].name == shard_file_name(r, m.world_size), path, ": corrupted: file ",
                    r, " is '", m.files[r].name, "', expected '", shard_file_name(r, m.world_size),
                    "'");
  }
  return m;
}

std::string run_fingerprint(const std::vector<CheckpointParam>& params, const std::string& dtype) {
  std::string text = dtype + ";";
  for (const CheckpointParam& p : params) {
    text += p.name + "[";
    for (int64_t d : p.shape) text += std::to_string(d) + ",";
    text += "];";
  }
  return fnv1a_hex(text);
}

std::string escaped(const std::string& s, size_t max_bytes) {
  std::string out;
  for (size_t i = 0; i < s.size() && i < max_bytes; ++i) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if (c == '\\') {
      out += "\\\\";
    } else if (c >= 0x20 && c < 0x7f) {
      out += static_cast<char>(c);
    } else {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      out += buf;
    }
  }
  if (s.size() > max_bytes) out += "... (" + std::to_string(s.size()) + " bytes)";
  return out;
}

void check_tag(const std::string& tag) {
  ZERO_CKPT_CHECK(!tag.empty() && tag.find('/') == std::string::npos && tag != "." && tag != ".." &&
                      tag != "latest" && !ends_with(tag, ".tmp") && !ends_with(tag, ".old"),
                  "zero: checkpoint tag '", escaped(tag, 80),
                  "' cannot name a checkpoint directory: use a non-empty name without '/' that is "
                  "not 'latest' and does not end in .tmp or .old (e.g. step100)");
}

std::string resolve_tag(const std::string& dir, const std::string& tag) {
  if (!tag.empty()) {
    check_tag(tag);
    return tag;
  }
  const std::string latest = latest_checkpoint_tag(dir);
  ZERO_CKPT_CHECK(!latest.empty(), dir, "/latest: missing: no checkpoint was completed in ", dir,
                  " (check the directory, or pass the tag to load)");
  // save_checkpoint writes a tag of printable characters: anything else is a damaged file, and
  // printed raw it would be cut at the first NUL byte or garble the terminal.
  const bool text = std::all_of(latest.begin(), latest.end(), [](char ch) {
    const auto c = static_cast<unsigned char>(ch);
    return c >= 0x20 && c < 0x7f;
  });
  ZERO_CKPT_CHECK(text, dir, "/latest: does not hold a checkpoint tag but ", latest.size(),
                  " bytes of other data (\"", escaped(latest, 48),
                  "\"): the file is damaged; write the tag of a complete checkpoint into it (e.g. "
                  "step100, a directory in ",
                  dir, " with a manifest.json) or pass the tag to load");
  check_tag(latest);
  return latest;
}

}  // namespace zero::ckpt

namespace zero {
namespace fs = std::filesystem;

bool CheckpointParam::whole() const {
  const bool at_origin =
      offset.empty() || std::all_of(offset.begin(), offset.end(), [](int64_t o) { return o == 0; });
  return at_origin && (global_shape.empty() || global_shape == shape);
}

std::string latest_checkpoint_tag(const std::string& dir) {
  std::error_code ec;
  const std::string path = (fs::path(dir) / "latest").string();
  if (!fs::is_regular_file(path, ec)) return "";
  std::string t = ckpt::read_text(path, "the pointer to the newest checkpoint");
  while (!t.empty() && std::isspace(static_cast<unsigned char>(t.back()))) t.pop_back();
  return t;
}

CheckpointInfo read_checkpoint_info(const std::string& dir, const std::string& tag) {
  const std::string t = ckpt::resolve_tag(dir, tag);
  const std::string tag_dir = (fs::path(dir) / t).string();
  const std::string path = tag_dir + "/manifest.json";
  const ckpt::Manifest m = ckpt::parse_manifest(
      ckpt::read_text(path, "a save that did not finish writes no manifest; load another tag"),
      path);
  CheckpointInfo info;
  info.dir = tag_dir;
  info.tag = t;
  info.fingerprint = m.fingerprint;
  info.world_size = m.world_size;
  info.stage = m.stage;
  info.param_dtype = m.param_dtype;
  info.optimizer = m.optimizer;
  info.state_names = m.state_names;
  info.optimizer_steps = m.optimizer_steps;
  info.micro_steps = m.micro_steps;
  info.params = m.params;
  return info;
}

void prune_checkpoints(const std::string& dir, int keep_last) {
  if (keep_last <= 0) return;
  const std::string latest = latest_checkpoint_tag(dir);
  // (optimizer step, manifest time, tag): newest last after sorting.
  std::vector<std::tuple<int64_t, fs::file_time_type, std::string>> complete;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const std::string tag = entry.path().filename().string();
    const fs::path manifest = entry.path() / "manifest.json";
    if (!entry.is_directory() || ckpt::ends_with(tag, ".tmp") || ckpt::ends_with(tag, ".old") ||
        !fs::is_regular_file(manifest)) {
      continue;
    }
    try {
      const auto m =
          ckpt::parse_manifest(ckpt::read_text(manifest.string(), "manifest"), manifest.string());
      complete.emplace_back(m.optimizer_steps, fs::last_write_time(manifest), tag);
    } catch (const std::exception&) {
      // Not ours or damaged: never delete what we cannot identify.
    }
  }
  std::sort(complete.begin(), complete.end());
  const int drop = static_cast<int>(complete.size()) - keep_last;
  for (int i = 0; i < drop; ++i) {
    const std::string& tag = std::get<2>(complete[i]);
    if (tag == latest) continue;
    fs::remove_all(fs::path(dir) / tag, ec);
  }
}

}  // namespace zero
