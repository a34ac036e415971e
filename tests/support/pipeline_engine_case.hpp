// What test_pipeline_engine.cpp and test_pipeline_engine_checkpoint.cpp share: the example GPT
// in P = 2 stages of PipelineEngine, micro-batches of kRowsPerMicroBatch rows, kMicroBatches per
// step and data-parallel rank, the global norm clipped at kClip; SGD with momentum or AdamW.
#pragma once

#include <string>
#include <vector>

#include "support/gpt_reference.hpp"
#include "support/pipeline_gpt.hpp"
#include "zero/models/gpt.hpp"
#include "zero/pipeline/schedule.hpp"
#include "zero/pipeline_engine.hpp"

namespace zero::pipeline::engine_test {

constexpr double kTol = 1e-5;
constexpr double kClip = 0.5;
constexpr int kSteps = 4, kRowsPerMicroBatch = 2, kSeq = 16, kMicroBatches = 4;

using Opt = zero::testing::RefOpt;  // SGD with momentum or AdamW

inline Config engine_config(Opt o, int zero_stage, int stages, ScheduleKind schedule) {
  Config c;
  c.zero_optimization.stage = zero_stage;
  c.train_micro_batch_size_per_gpu = kRowsPerMicroBatch;
  c.gradient_accumulation_steps = kMicroBatches;
  c.gradient_clipping = kClip;
  zero::testing::set_optimizer(c, o);
  c.pipeline.stages = stages;
  c.pipeline.schedule = std::string(schedule_name(schedule));
  return c;
}

using Batch = zero::testing::StepBatch;
using Params = zero::testing::GptParams;

// kSteps batches of `rows` rows (every data-parallel rank's together).
inline std::vector<Batch> make_batches(const models::GptConfig& c, int rows) {
  return zero::testing::step_batches(c.vocab, kSteps, rows, kSeq);
}

// Trains `pipe` on batches [from, to), each cut into its micro-batches on `device`; appends the
// losses to `out`.
inline void train_on(PipelineEngine& pipe, const std::vector<Batch>& batches, size_t from,
                     size_t to, const c10::Device& device, std::vector<float>& out) {
  for (size_t i = from; i < to; ++i) {
    std::vector<at::Tensor> in, tg;
    for (const auto& t : batches[i].inputs.chunk(kMicroBatches, 0)) in.push_back(t.to(device));
    for (const auto& t : batches[i].targets.chunk(kMicroBatches, 0)) tg.push_back(t.to(device));
    out.push_back(pipe.train_batch(in, tg).item<float>());
  }
}

}  // namespace zero::pipeline::engine_test
