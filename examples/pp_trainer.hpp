// Pipeline parallelism in zero-train (pipeline.stages > 1, or 1 resuming a pipelined save):
// the pp x dp grid over the launched processes (Megatron's order, tensor parallel 1), the
// example GPT as pipeline layers, each stage's layers trained by the ZeRO engine
// (include/zero/pipeline_engine.hpp), and a training loop of its own: one train_batch per
// optimizer step, gradient_accumulation_steps micro-batches.
// Checkpoints per stage (save_dir/stage<s>/, resumed at any P and data-parallel size). What the
// plain loop offers beyond that (the summary, tensor parallelism, CUDA) is refused with the key
// named until the pipeline supports it.
#pragma once

#include <c10/core/Device.h>

#include <cstdint>
#include <memory>
#include <string>

#include "data.hpp"
#include "gpt_config.hpp"
#include "zero/config.hpp"

namespace zero::examples {

struct PipelineTrainerArgs {
  Config cfg;
  std::string config_path;  // errors name it
  GptConfig model;
  std::string preset;  // the start-up line's model name
  std::string hf_dir;  // "" or a Hugging Face directory the weights come from
  std::shared_ptr<const Dataset> data;
  int64_t steps = 0, seq_len = 0;
  c10::Device device = c10::Device(c10::kCPU);
  std::string summary_path;  // --summary-json (refused for now)
};

// Trains; returns the process's exit code. Throws ConfigError for what it refuses.
int train_pipeline(const PipelineTrainerArgs& a);

}  // namespace zero::examples
