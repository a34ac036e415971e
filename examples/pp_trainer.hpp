// Pipeline parallelism in zero-train (pipeline.stages > 1, or 1 resuming a pipelined save):
// the pp x dp x tp grid over the launched processes (Megatron's order, tensor parallel
// innermost: tensor_parallel.autotp_size), the example GPT (its tensor-parallel form when
// autotp_size > 1) as pipeline layers, each stage's layers trained by the ZeRO engine
// (include/zero/pipeline_engine.hpp), and a training loop of its own: one train_batch per
// optimizer step, gradient_accumulation_steps micro-batches.
// The progress line splits rank 0's (stage 0's) step by the instructions it ran (forward,
// backward, optimizer step, the pipeline's communication with the bubble), the line after it
// every stage's with its model states; the monitors (tensorboard, csv_monitor) write rank 0's
// record, whose loss is the last stage's; --summary-json is pp_summary.hpp's. Sequence
// parallelism, fp16 and the interleaved schedule (pipeline.schedule, pipeline.virtual_stages)
// run with tensor parallelism. Checkpoints per stage (save_dir/stage<s>/, under tensor
// parallelism stage<s>/tp<r>/), resumed at another P, T, v or data-parallel size. What it refuses
// (trainer.activation_checkpointing: a pipeline recomputes per stage; a trainer.seq_len that
// does not split over tp under sequence parallelism) is named with the key.
#pragma once

#include <c10/core/Device.h>

#include <cstdint>
#include <memory>
#include <string>

#include "data.hpp"
#include "zero/config.hpp"
#include "zero/models/gpt_config.hpp"

namespace zero::examples {

struct PipelineTrainerArgs {
  Config cfg;
  std::string config_path;  // errors name it
  models::GptConfig model;
  std::string preset;  // the start-up line's model name
  std::string hf_dir;  // "" or a Hugging Face directory the weights come from
  std::shared_ptr<const Dataset> data;
  int64_t steps = 0, seq_len = 0;
  c10::Device device = c10::Device(c10::kCPU);
  std::string summary_path;  // --summary-json: "" = none
};

// Trains; returns the process's exit code. Throws ConfigError for what it refuses.
int train_pipeline(const PipelineTrainerArgs& a);

}  // namespace zero::examples
