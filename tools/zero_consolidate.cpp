// zero-consolidate: one safetensors file with the full model from a sharded checkpoint, read
// straight from the shard files (no process group, any number of ranks wrote it); or, with
// --format hf, the example GPT as a Hugging Face LlamaForCausalLM directory. A tensor-parallel
// run's save (DIR/tp0, DIR/tp1, ...: each rank's blocks of the split weights) is put together,
// and so is a pipelined one (DIR/stage0, DIR/stage1, ...: each stage's layers, named by layer
// index), its parameters renamed to the example GPT's when they are its layers.
//
//   zero-consolidate --checkpoint ckpt/ [--tag step200] --out model.safetensors [--dtype bf16]
//   zero-consolidate --checkpoint ckpt/ --format hf --model hf:BASE_DIR --out hf_model/ \
//       [--max-shard-size 5GB]
#include <ATen/ATen.h>
#include <boost/program_options.hpp>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <iostream>

#include "zero/checkpoint_io.hpp"
#include "zero/errors.hpp"
#include "zero/models/gpt_layers.hpp"
#include "zero/models/hf_llama.hpp"
#include "zero/pipeline_engine.hpp"

namespace po = boost::program_options;

namespace {

// "5GB", "200MB", "100KB" or bytes, in decimal units as transformers' max_shard_size.
int64_t parse_size(const std::string& s) {
  size_t end = 0;
  double v = 0;
  try {
    v = std::stod(s, &end);
  } catch (const std::exception&) {
    end = 0;
  }
  const std::string unit = s.substr(end);
  const double scale = unit.empty() || unit == "B" ? 1
                       : unit == "KB"              ? 1e3
                       : unit == "MB"              ? 1e6
                       : unit == "GB"              ? 1e9
                                                   : -1;
  if (end == 0 || scale < 0 || v <= 0) {
    throw std::invalid_argument("--max-shard-size '" + s + "': use e.g. 5GB, 200MB or bytes");
  }
  return static_cast<int64_t>(v * scale);
}

int run(int argc, char** argv) {
  std::string dir, tag, out, dtype = "fp32", state = "master", format, model, shard_size;
  po::options_description desc("zero-consolidate options");
  desc.add_options()("help,h", "show this help")("checkpoint", po::value(&dir)->required(),
                                                 "checkpoint directory (trainer.save_dir)")(
      "tag", po::value(&tag), "checkpoint tag (default: the one DIR/latest names)")(
      "out", po::value(&out)->required(), "safetensors file (or, with --format hf, directory)")(
      "format", po::value(&format)->default_value("zero"),
      "zero (our names, one file) or hf (a Hugging Face LlamaForCausalLM directory)")(
      "model", po::value(&model),
      "--format hf: the example GPT's shape, hf:DIR (the model training started from) or a "
      "preset name")("max-shard-size", po::value(&shard_size)->default_value("5GB"),
                     "--format hf: largest safetensors shard")(
      "dtype", po::value(&dtype)->default_value("fp32"), "fp32 or bf16")(
      "state", po::value(&state)->default_value("master"),
      "master (the parameters) or an optimizer state, e.g. exp_avg");
  po::variables_map vm;
  po::store(po::parse_command_line(argc, argv, desc), vm);
  if (vm.count("help")) {
    std::cout << desc << "\n";
    return 0;
  }
  po::notify(vm);
  if (dtype != "fp32" && dtype != "bf16") {
    throw std::invalid_argument("--dtype must be fp32 or bf16, got '" + dtype + "'");
  }
  if (format != "zero" && format != "hf") {
    throw std::invalid_argument("--format must be zero or hf, got '" + format + "'");
  }
  if (format == "hf" && (model.empty() || state != "master")) {
    throw std::invalid_argument(
        "--format hf needs --model hf:DIR (the Hugging Face model training started from) or a "
        "GPT preset name, and exports the parameters only (--state master)");
  }
  // A tensor-parallel run's save lies in DIR/tp0, DIR/tp1, ...: their blocks are put together.
  std::vector<std::string> dirs = zero::checkpoint_dirs(dir, tag);
  // A pipelined save (zero-train with pipeline.stages, PipelineEngine::save_checkpoint): the
  // stages that saved it, as its pipeline.json records them.
  int stages = 0, layers = 0;
  std::error_code ec;
  if (dirs.empty() && std::filesystem::is_directory(dir + "/stage0", ec)) {
    const zero::pipeline::PipelineSaveLayout saved = zero::pipeline::read_pipeline_save(dir, tag);
    stages = saved.stages;
    if (saved.recorded) layers = saved.bounds.back();
    tag = saved.tag;
    // dir/stage<s>, or dir/stage<s>/tp<r> when each stage's tensor-parallel ranks saved blocks.
    dirs = zero::pipeline::pipeline_save_dirs(dir, saved);
  }
  if (dirs.empty()) dirs = {dir};  // read_checkpoint_info says what is missing
  const zero::CheckpointInfo info = zero::read_checkpoint_info(dirs.front(), tag);
  auto tensors = zero::read_consolidated(dirs, info.tag, state);
  if (stages > 0) {
    // Named "<layer index>.<name in the layer>": the example GPT's names when every one is its
    // layers' (zero-logits and --format hf read those), else as saved.
    // A save from before pipeline.json: the last layer has parameters (the GPT's final norm).
    if (layers == 0)
      for (const auto& t : tensors) layers = std::max(layers, std::atoi(t.first.c_str()) + 1);
    std::vector<std::string> names;
    for (const auto& t : tensors) {
      names.push_back(zero::models::gpt_name_of_layer_param(t.first, layers));
      if (names.back().empty()) {
        names.clear();
        break;
      }
    }
    for (size_t i = 0; i < names.size(); ++i) tensors[i].first = names[i];
    std::printf(
        "zero-consolidate: a pipelined save of %d stages (%s ... %s), each of %d data-parallel "
        "ranks; %s\n",
        stages, dirs.front().c_str(), dirs.back().c_str(), info.world_size,
        names.empty() ? "parameters named by layer index (not the example GPT's layers)"
                      : "parameters under the example GPT's names");
  } else if (dirs.size() > 1) {
    std::printf(
        "zero-consolidate: %zu tensor-parallel ranks' saves (%s ... %s), each of %d "
        "data-parallel ranks\n",
        dirs.size(), dirs.front().c_str(), dirs.back().c_str(), info.world_size);
  }
  int64_t numel = 0;
  for (const auto& t : tensors) numel += t.second.numel();
  if (format == "hf") {
    namespace ex = zero::models;
    const bool hf = model.rfind("hf:", 0) == 0;
    ex::HfExportOptions opts;
    opts.dtype = dtype == "bf16" ? at::kBFloat16 : at::kFloat;
    opts.max_shard_bytes = parse_size(shard_size);
    if (hf) opts.base_dir = model.substr(3);
    const auto files = ex::save_hf_llama(
        hf ? ex::hf_llama_config(model.substr(3)) : ex::gpt_preset(model), tensors, out, opts);
    std::printf(
        "zero-consolidate: %s (%d ranks, step %lld): %zu tensors, %lld elements -> %s/ "
        "in the Hugging Face LLaMA layout (%s, %zu files)\n",
        info.dir.c_str(), info.world_size, (long long)info.optimizer_steps, tensors.size(),
        (long long)numel, out.c_str(), dtype.c_str(), files.size());
    return 0;
  }
  zero::write_safetensors(out, tensors, dtype == "bf16" ? at::kBFloat16 : at::kFloat,
                          {{"format", "pt"},
                           {"zero.tag", info.tag},
                           {"zero.state", state},
                           {"zero.optimizer_steps", std::to_string(info.optimizer_steps)},
                           {"zero.saved_world_size", std::to_string(info.world_size)},
                           {"zero.fingerprint", info.fingerprint}});
  std::printf(
      "zero-consolidate: %s (%s, %d ranks, step %lld): %zu tensors, %lld elements -> %s (%s)\n",
      info.dir.c_str(), state.c_str(), info.world_size, (long long)info.optimizer_steps,
      tensors.size(), (long long)numel, out.c_str(), dtype.c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return zero::run_main("zero-consolidate", [&] { return run(argc, argv); });
}
