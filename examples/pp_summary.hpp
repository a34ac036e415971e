// What zero-train reports at the end of a pipeline run (pipeline.stages > 1), as the
// --summary-json file: the plain summary's keys where they mean the same (losses, the parameter
// checksum and norm, the step-time median, the time split), with the pipeline's own: the grid,
// and per stage its layers, where its time went (pipeline::StepTimes: forward, backward, the
// optimizer step, the pipeline's communication, the bubble included) and its memory.
//
// Whose numbers: the loss is the last stage's, the same on every rank (PipelineEngine); the
// plain keys' times (forward_s_mean, ...) are rank 0's, i.e. stage 0's; the checksum and norm
// are the whole model's (each stage's own parameters, a tied weight once, summed over the
// stages; under tensor parallelism over the tensor-parallel ranks too, the replicated norms
// once: whole_model_stats), and the memory keys are the plain summary's (memory_figures.hpp):
// each rank's peaks over the whole world, the start-up peaks, per phase the allocator's peak
// (a pipeline's forward, backward and step interleave: measured together, per step, in
// phase_step_peaks; initialize and save apart).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "memory_figures.hpp"
#include "metrics.hpp"
#include "train_summary.hpp"

namespace zero::pipeline {
class PipelineEngine;
}

namespace zero::examples {

// The whole model's parameter checksum and norm from a pipeline: each stage's own parameters (a
// tied copy is its owner's; under tensor parallelism over `tp`, whole_model_stats), summed over
// the stages. A collective over tp and the pipeline group; the same on every rank.
ParamStats pipeline_model_stats(const pipeline::PipelineEngine& pipe,
                                const std::shared_ptr<Group>& tp);

struct PipelineStageReport {
  int first_layer = 0, last_layer = 0;
  int64_t model_states_bytes = 0;  // its engine's (dp rank 0, tp rank 0), after the last step
  int64_t peak_rss_bytes = 0;      // the most any of its data-parallel ranks reached (VmHWM)
};

struct PipelineSummary {
  std::string grid, schedule, model, data;
  int world_size = 0, zero_stage = 0, micro_batches = 0;
  int64_t num_params = 0, seq_len = 0, train_batch_size = 0, skipped_steps = 0;
  double param_checksum = 0, param_norm = 0;
  std::vector<StepRecord> records;  // rank 0's, one per step
  std::vector<PipelineStageReport> stages;
  MemoryFigures memory;

  // Adds one step's times of every stage ([stage] = {forward, backward, optimizer, comm}).
  void add_stage_times(const std::vector<std::vector<double>>& times);
  // Each stage's mean times ({forward, backward, optimizer, comm}) over the steps after the
  // first, which pays for allocations and connection set-up (the first alone if it is the only).
  std::vector<std::vector<double>> mean_stage_times() const;
  void write_json(const std::string& path) const;

 private:
  std::vector<std::vector<double>> first_, rest_;  // the first step's; the later steps' sums
  int64_t rest_steps_ = 0;
};

}  // namespace zero::examples
