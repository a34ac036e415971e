#include "zero/pipeline/engine/save_layout.hpp"

#include <cctype>
#include <filesystem>
#include <string>

#include "zero/checkpoint/checkpoint_format.hpp"
#include "zero/checkpoint_io.hpp"

namespace zero::pipeline {
namespace fs = std::filesystem;
namespace {

constexpr const char* kFile = "pipeline.json";

std::string stage_dir(const std::string& dir, int s) { return dir + "/stage" + std::to_string(s); }

std::string bounds_text(const std::vector<int>& b) {
  std::string t = "[";
  for (size_t i = 0; i < b.size(); ++i) t += (i ? ", " : "") + std::to_string(b[i]);
  return t + "]";
}

// The file is ours and small (write_save_layout's): a key's integer, or integer list, is read
// where the key stands, anything unexpected an error naming the file.
size_t value_at(const std::string& text, const std::string& key, const std::string& path) {
  const std::string quoted = "\"" + key + "\"";
  size_t at = text.find(quoted);
  ZERO_CKPT_CHECK(at != std::string::npos, path, ": no \"", key, "\" (not a pipeline.json ",
                  "that PipelineEngine::save_checkpoint wrote)");
  at = text.find(':', at + quoted.size());
  ZERO_CKPT_CHECK(at != std::string::npos, path, ": \"", key, "\" has no value");
  ++at;
  while (at < text.size() && std::isspace(static_cast<unsigned char>(text[at]))) ++at;
  return at;
}

int parse_int(const std::string& text, size_t& at, const std::string& key,
              const std::string& path) {
  size_t used = 0;
  int v = 0;
  try {
    v = std::stoi(text.substr(at, 12), &used);
  } catch (const std::exception&) {
    ckpt::fail(path, ": \"", key, "\" is not an integer");
  }
  at += used;
  return v;
}

int int_value(const std::string& text, const std::string& key, const std::string& path) {
  size_t at = value_at(text, key, path);
  return parse_int(text, at, key, path);
}

std::vector<int> int_list(const std::string& text, const std::string& key,
                          const std::string& path) {
  size_t at = value_at(text, key, path);
  ZERO_CKPT_CHECK(at < text.size() && text[at] == '[', path, ": \"", key, "\" is not a list");
  std::vector<int> out;
  ++at;
  while (true) {
    while (at < text.size() && std::isspace(static_cast<unsigned char>(text[at]))) ++at;
    ZERO_CKPT_CHECK(at < text.size(), path, ": \"", key, "\" is not closed");
    if (text[at] == ']') break;
    if (text[at] == ',') {
      ++at;
      continue;
    }
    out.push_back(parse_int(text, at, key, path));
  }
  return out;
}

struct Recorded {
  int stages = 0;
  std::vector<int> bounds;
};

// dir/stage<s>/<tag>/pipeline.json, checked in itself.
Recorded read_layout_file(const std::string& path) {
  const std::string text =
      ckpt::read_text(path, "PipelineEngine::save_checkpoint writes it beside each stage's shards");
  Recorded r;
  r.stages = int_value(text, "stages", path);
  r.bounds = int_list(text, "bounds", path);
  bool ok = r.stages >= 1 && r.bounds.size() == static_cast<size_t>(r.stages) + 1 &&
            r.bounds.front() == 0;
  for (size_t i = 1; ok && i < r.bounds.size(); ++i) ok = r.bounds[i] >= r.bounds[i - 1];
  ZERO_CKPT_CHECK(ok, path, ": stages ", r.stages, " with bounds ", bounds_text(r.bounds),
                  " is not a partition (stages + 1 increasing bounds from 0)");
  return r;
}

}  // namespace

void write_save_layout(const std::string& dir, int stage, const PipelineSaveLayout& layout,
                       const std::string& partition) {
  std::string json = "{\n  \"format\": 1,\n  \"tag\": " + ckpt::json_quote(layout.tag) +
                     ",\n  \"stages\": " + std::to_string(layout.stages) +
                     ",\n  \"stage\": " + std::to_string(stage) +
                     ",\n  \"layers\": " + std::to_string(layout.bounds.back()) +
                     ",\n  \"bounds\": " + bounds_text(layout.bounds) +
                     ",\n  \"partition\": " + ckpt::json_quote(partition) + "\n}\n";
  ckpt::write_file_atomic(stage_dir(dir, stage) + "/" + layout.tag + "/" + kFile, json);
}

PipelineSaveLayout read_pipeline_save(const std::string& dir, const std::string& tag_arg) {
  PipelineSaveLayout out;
  const std::string first = stage_dir(dir, 0);
  out.tag = tag_arg.empty() ? latest_checkpoint_tag(first) : tag_arg;
  ZERO_CKPT_CHECK(!out.tag.empty(), first, "/latest: missing: no pipelined checkpoint in ", dir,
                  " (PipelineEngine::save_checkpoint writes dir/stage<s>/<tag>/ and "
                  "dir/stage0/latest); give the save_dir a pipelined run saved into");
  ckpt::check_tag(out.tag);
  std::error_code ec;
  const std::string path0 = first + "/" + out.tag + "/" + kFile;
  if (!fs::exists(path0, ec)) {
    // A save from before pipeline.json: the stage directories that hold the tag.
    ZERO_CKPT_CHECK(fs::exists(first + "/" + out.tag + "/manifest.json", ec), first, "/", out.tag,
                    ": no such checkpoint (no manifest.json)");
    out.recorded = false;
    while (fs::exists(stage_dir(dir, out.stages) + "/" + out.tag + "/manifest.json", ec))
      ++out.stages;
    return out;
  }
  const Recorded r = read_layout_file(path0);
  out.stages = r.stages;
  out.bounds = r.bounds;
  for (int s = 1; s < out.stages; ++s) {
    const std::string path = stage_dir(dir, s) + "/" + out.tag + "/" + kFile;
    const Recorded other = read_layout_file(path);
    ZERO_CKPT_CHECK(other.stages == r.stages && other.bounds == r.bounds, path, ": stages ",
                    other.stages, " with bounds ", bounds_text(other.bounds), " but ", path0,
                    " has stages ", r.stages, " with bounds ", bounds_text(r.bounds),
                    ": the stage directories are not one save");
  }
  return out;
}

std::vector<std::string> dirs_to_load(const std::string& dir, const PipelineSaveLayout& saved,
                                      const std::vector<int>& bounds, int stage) {
  const int stages = static_cast<int>(bounds.size()) - 1;
  const std::string where = dir + "/stage*/" + saved.tag;
  std::vector<std::string> dirs;
  if (!saved.recorded) {
    ZERO_CKPT_CHECK(saved.stages == stages, where, " was saved at pipeline.stages ", saved.stages,
                    " before checkpoints recorded their partition (no pipeline.json): it loads "
                    "at pipeline.stages ",
                    saved.stages, " only; this run has ", stages);
    return {stage_dir(dir, stage)};
  }
  ZERO_CKPT_CHECK(saved.bounds.back() == bounds.back(), where, " holds a model of ",
                  saved.bounds.back(), " layers (pipeline.stages ", saved.stages, ", bounds ",
                  bounds_text(saved.bounds), ") but this one has ", bounds.back(),
                  " layers: load it into the model it was saved from");
  if (saved.bounds == bounds) {
    return {stage_dir(dir, stage)};
  }
  // Layers lo .. hi - 1 are this stage's; the saved stage t held bounds[t] .. bounds[t + 1] - 1.
  // A tied weight is named, and saved, by the first layer holding it, which lies in the range
  // of the stage that owns it in either layout.
  const int lo = bounds[stage], hi = bounds[stage + 1];
  for (int t = 0; t < saved.stages; ++t) {
    if (saved.bounds[t] < hi && lo < saved.bounds[t + 1]) dirs.push_back(stage_dir(dir, t));
  }
  // A stage without layers still restores the step counters.
  if (dirs.empty()) dirs.push_back(stage_dir(dir, 0));
  return dirs;
}

ModelPart layers_part(int lo, int hi) {
  return [lo, hi](const std::string& name) {
    const size_t dot = name.find('.');
    if (dot == 0 || dot == std::string::npos || dot > 9) return false;
    for (size_t i = 0; i < dot; ++i) {
      if (!std::isdigit(static_cast<unsigned char>(name[i]))) return false;
    }
    const int layer = std::stoi(name.substr(0, dot));
    return lo <= layer && layer < hi;
  };
}

}  // namespace zero::pipeline
