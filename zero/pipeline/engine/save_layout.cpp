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
  int stages = 0, tp = 1, virtual_stages = 1;
  std::vector<int> bounds;
};

// dir/stage<s>/<tag>/pipeline.json, checked in itself.
Recorded read_layout_file(const std::string& path) {
  const std::string text =
      ckpt::read_text(path, "PipelineEngine::save_checkpoint writes it beside each stage's shards");
  Recorded r;
  r.stages = int_value(text, "stages", path);
  r.bounds = int_list(text, "bounds", path);
  // Saves from before tensor-parallel pipelines were saved record no "tp": one rank per stage.
  if (text.find("\"tp\"") != std::string::npos) r.tp = int_value(text, "tp", path);
  ZERO_CKPT_CHECK(r.tp >= 1, path, ": \"tp\" is ", r.tp, ", not a tensor-parallel size");
  // Saves from before the interleaved schedule could save record no "virtual_stages": one chunk
  // per stage.
  if (text.find("\"virtual_stages\"") != std::string::npos)
    r.virtual_stages = int_value(text, "virtual_stages", path);
  ZERO_CKPT_CHECK(r.virtual_stages >= 1, path, ": \"virtual_stages\" is ", r.virtual_stages,
                  ", not a number of model chunks per stage");
  bool ok = r.stages >= 1 &&
            r.bounds.size() == static_cast<size_t>(r.stages) * r.virtual_stages + 1 &&
            r.bounds.front() == 0;
  for (size_t i = 1; ok && i < r.bounds.size(); ++i) ok = r.bounds[i] >= r.bounds[i - 1];
  ZERO_CKPT_CHECK(ok, path, ": stages ", r.stages, " x virtual_stages ", r.virtual_stages,
                  " with bounds ", bounds_text(r.bounds),
                  " is not a partition (stages x virtual_stages + 1 increasing bounds from 0)");
  return r;
}

}  // namespace

std::string stage_save_dir(const std::string& dir, int stage, int tp, int tp_rank) {
  return tp == 1 ? stage_dir(dir, stage) : stage_dir(dir, stage) + "/tp" + std::to_string(tp_rank);
}

void write_save_layout(const std::string& dir, int stage, int tp_rank,
                       const PipelineSaveLayout& layout, const std::string& partition) {
  std::string json = "{\n  \"format\": 1,\n  \"tag\": " + ckpt::json_quote(layout.tag) +
                     ",\n  \"stages\": " + std::to_string(layout.stages) +
                     ",\n  \"stage\": " + std::to_string(stage) +
                     ",\n  \"tp\": " + std::to_string(layout.tp) +
                     ",\n  \"tp_rank\": " + std::to_string(tp_rank) +
                     ",\n  \"virtual_stages\": " + std::to_string(layout.virtual_stages) +
                     ",\n  \"layers\": " + std::to_string(layout.bounds.back()) +
                     ",\n  \"bounds\": " + bounds_text(layout.bounds) +
                     ",\n  \"partition\": " + ckpt::json_quote(partition) + "\n}\n";
  ckpt::write_file_atomic(
      stage_save_dir(dir, stage, layout.tp, tp_rank) + "/" + layout.tag + "/" + kFile, json);
}

PipelineSaveLayout read_pipeline_save(const std::string& dir, const std::string& tag_arg) {
  PipelineSaveLayout out;
  std::error_code ec;
  // A save under tensor parallelism lies in stage<s>/tp<r>/; when stage0 holds both layouts (a
  // run resumed under another tensor-parallel size into the same save_dir), checkpoint_dirs
  // picks the one the tag names, or the newer.
  const std::vector<std::string> found = checkpoint_dirs(stage_dir(dir, 0), tag_arg);
  const bool split = !found.empty() && found.front() != stage_dir(dir, 0);
  const std::string first = split ? found.front() : stage_dir(dir, 0);
  out.tag = tag_arg.empty() ? latest_checkpoint_tag(first) : tag_arg;
  ZERO_CKPT_CHECK(!out.tag.empty(), first, "/latest: missing: no pipelined checkpoint in ", dir,
                  " (PipelineEngine::save_checkpoint writes dir/stage<s>/<tag>/, or "
                  "dir/stage<s>/tp<r>/<tag>/ under tensor parallelism, and its latest); give the "
                  "save_dir a pipelined run saved into");
  ckpt::check_tag(out.tag);
  const std::string path0 = first + "/" + out.tag + "/" + kFile;
  if (!split && !fs::exists(path0, ec)) {
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
  out.tp = r.tp;
  out.virtual_stages = r.virtual_stages;
  out.bounds = r.bounds;
  ZERO_CKPT_CHECK(split == (r.tp > 1), path0, ": records tensor-parallel size ", r.tp,
                  " but lies in ", first, ": the directories are not one save");
  for (const std::string& sub : pipeline_save_dirs(dir, out)) {
    const std::string path = sub + "/" + out.tag + "/" + kFile;
    ZERO_CKPT_CHECK(fs::exists(path, ec), sub, "/", out.tag,
                    ": missing: the save of pipeline.stages ", r.stages,
                    " x tensor_parallel.autotp_size ", r.tp, " (", path0,
                    ") has one directory per stage and tensor-parallel rank (dir/stage<s>/",
                    r.tp > 1 ? "tp<r>/" : "", "<tag>), ", r.stages * r.tp,
                    " in all; copy every one of them with the save, or load another tag");
    const Recorded other = read_layout_file(path);
    ZERO_CKPT_CHECK(other.stages == r.stages && other.tp == r.tp &&
                        other.virtual_stages == r.virtual_stages && other.bounds == r.bounds,
                    path, ": stages ", other.stages, " x tp ", other.tp, " x virtual_stages ",
                    other.virtual_stages, " with bounds ", bounds_text(other.bounds), " but ",
                    path0, " has stages ", r.stages, " x tp ", r.tp, " x virtual_stages ",
                    r.virtual_stages, " with bounds ", bounds_text(r.bounds),
                    ": the stage directories are not one save");
  }
  return out;
}

std::vector<std::string> pipeline_save_dirs(const std::string& dir,
                                            const PipelineSaveLayout& saved) {
  std::vector<std::string> out;
  for (int s = 0; s < saved.stages; ++s)
    for (int r = 0; r < saved.tp; ++r) out.push_back(stage_save_dir(dir, s, saved.tp, r));
  return out;
}

LayerRanges stage_layer_ranges(const std::vector<int>& bounds, int stages, int stage) {
  LayerRanges out;
  for (int c = stage; c + 1 < static_cast<int>(bounds.size()); c += stages)
    out.emplace_back(bounds[c], bounds[c + 1]);
  return out;
}

namespace {

// The saved stages holding any of the layers stage `stage` holds under `bounds`.
std::vector<int> stages_to_load(const std::string& dir, const PipelineSaveLayout& saved,
                                const std::vector<int>& bounds, int stages, int stage) {
  const int chunks = static_cast<int>(bounds.size()) - 1;
  const std::string where = dir + "/stage*/" + saved.tag;
  if (!saved.recorded) {
    ZERO_CKPT_CHECK(saved.stages == stages && chunks == stages, where,
                    " was saved at pipeline.stages ", saved.stages,
                    " before checkpoints recorded their partition (no pipeline.json): it loads "
                    "at pipeline.stages ",
                    saved.stages, " only; this run has ", stages,
                    chunks > stages
                        ? " x pipeline.virtual_stages " + std::to_string(chunks / stages)
                        : std::string());
    return {stage};
  }
  ZERO_CKPT_CHECK(saved.bounds.back() == bounds.back(), where, " holds a model of ",
                  saved.bounds.back(), " layers (pipeline.stages ", saved.stages,
                  saved.virtual_stages > 1
                      ? " x pipeline.virtual_stages " + std::to_string(saved.virtual_stages)
                      : std::string(),
                  ", bounds ", bounds_text(saved.bounds), ") but this one has ", bounds.back(),
                  " layers: load it into the model it was saved from");
  // The same cut on as many stages: the stage's own directory holds exactly its layers. (The
  // bounds alone do not say it: P = 4 and P = 2 x v = 2 both have 5.)
  if (saved.stages == stages && saved.bounds == bounds) return {stage};
  // Saved virtual stage c held saved.bounds[c] .. saved.bounds[c + 1] - 1, on stage c % P. A
  // tied weight is named, and saved, by the first of its owner's layers holding it, which is its
  // first layer in either layout when that layer lies on the owner (the embedding on stage 0's
  // chunk 0, as for the example GPT).
  std::vector<char> wanted(saved.stages, 0);
  for (const auto& [lo, hi] : stage_layer_ranges(bounds, stages, stage)) {
    for (int c = 0; c + 1 < static_cast<int>(saved.bounds.size()); ++c)
      if (saved.bounds[c] < hi && lo < saved.bounds[c + 1]) wanted[c % saved.stages] = 1;
  }
  std::vector<int> out;
  for (int t = 0; t < saved.stages; ++t)
    if (wanted[t]) out.push_back(t);
  // A stage without layers still restores the step counters.
  if (out.empty()) out.push_back(0);
  return out;
}

}  // namespace

std::vector<std::string> dirs_to_load(const std::string& dir, const PipelineSaveLayout& saved,
                                      const std::vector<int>& bounds, int stages, int stage, int tp,
                                      int tp_rank) {
  std::vector<std::string> dirs;
  for (const int t : stages_to_load(dir, saved, bounds, stages, stage)) {
    // Each saved tensor-parallel rank holds its blocks of the split weights: all of them cover
    // this rank's block under any tp (the engine reads the blocks by their recorded offsets).
    const int own = saved.tp == tp ? tp_rank : 0;
    dirs.push_back(stage_save_dir(dir, t, saved.tp, own));
    for (int r = 0; r < saved.tp; ++r)
      if (r != own) dirs.push_back(stage_save_dir(dir, t, saved.tp, r));
  }
  return dirs;
}

ModelPart layers_part(LayerRanges ranges) {
  return [ranges = std::move(ranges)](const std::string& name) {
    const size_t dot = name.find('.');
    if (dot == 0 || dot == std::string::npos || dot > 9) return false;
    for (size_t i = 0; i < dot; ++i) {
      if (!std::isdigit(static_cast<unsigned char>(name[i]))) return false;
    }
    const int layer = std::stoi(name.substr(0, dot));
    for (const auto& [lo, hi] : ranges)
      if (lo <= layer && layer < hi) return true;
    return false;
  };
}

ModelPart layers_part(int lo, int hi) { return layers_part(LayerRanges{{lo, hi}}); }

}  // namespace zero::pipeline
