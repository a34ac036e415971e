// What zero-train reports at the end: losses, a checksum and norm of the full parameters, the
// step-time median and the per-rank memory, and the bottleneck verdict, as the --summary-json
// file.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "bottleneck.hpp"
#include "memory_figures.hpp"
#include "metrics.hpp"
#include "phase_peaks.hpp"
#include "zero/engine.hpp"
#include "zero/models/gpt.hpp"

namespace zero::examples {

struct TrainSummary {
  // The ranks the memory figures are gathered over and the checksum's tensor-parallel group:
  // every process of the run (set by the trainer; unset: the engine's data-parallel group), and
  // the device the gathers move.
  std::shared_ptr<Group> world, tensor_parallel;
  c10::Device device = c10::Device(c10::kCPU);

  double first_loss = NAN, final_loss = NAN;
  double param_checksum = 0, param_norm = 0;
  std::vector<StepRecord> records;
  int64_t peak_rss_bytes = 0;  // max over ranks (each rank's in the per-rank lists)
  std::vector<int64_t> peak_rss_per_rank, device_peak_per_rank;
  int64_t offload_peak_host_bytes = 0;
  int64_t device_peak_allocated_bytes = 0;  // CUDA caching allocator, max over ranks; 0 on CPU
  double data_wait_s = 0;
  bool checkpointing = false, cpu_offload = false;
  std::string data;
  Verdict verdict;  // set by finish

  // Start-up memory (VmHWM after model creation + initialize, VmRSS right after), max over
  // ranks; a collective.
  int64_t startup_peak_rss_bytes = 0, rss_after_initialize_bytes = 0;
  void record_startup(const Engine& engine, int64_t peak, int64_t after);

  // Per phase (phase_peaks.hpp): the most any rank's allocator reached (-1: not measured, as on
  // CPU) and the planner's prediction. A collective.
  std::array<int64_t, kPhases> phase_measured{}, phase_predicted{};
  int64_t phase_overall_ = -1;  // this rank's peak over every phase
  // Per training step, the most any rank's allocator reached; the bytes in use after the last
  // step (the steady model states, max over ranks; -1: not measured); and the bound every phase
  // must meet: those states + two buckets + the planner's activations.
  std::vector<int64_t> step_peaks;
  int64_t steady_states = -1, phase_bound = -1;
  std::vector<int64_t> last_step_split;  // MemoryFigures::last_step_split
  void record_phases(const Engine& engine, const PhasePeaks& phases,
                     const std::array<int64_t, kPhases>& predicted, int64_t bucket_bytes,
                     int64_t activations);
  std::string phase_json() const;

  void add(const StepRecord& r);
  // Collective: reads the memory peaks first (so no end-of-run temporary shows in them), then
  // the full parameters (every rank holds them after a step), one at a time. `run` says what
  // the verdict's advice depends on; its memory_used is filled in here.
  // `model`: the trained module (under tensor parallelism this rank's shards: the checksum and
  // norm are the whole model's, whole_model_stats over `tensor_parallel`); `offloader`: the
  // activation offloader, if any.
  void finish(const Engine& engine, torch::nn::Module& model,
              const zero::ActivationOffloader* offloader, const models::CheckpointPolicy& policy,
              const std::string& data_description, double loader_wait_s, RunShape run);
  // Means over the steps after the first.
  StepTimes mean_times() const;
  // Median over the steps after the first, which pays for allocations and connection set-up.
  double median_step_s() const;
  // The memory keys as every layout's summary writes them (memory_figures.hpp).
  MemoryFigures memory_figures() const;
  void write_json(const std::string& path, const Engine& engine, const std::string& preset,
                  const models::GptConfig& mc, int64_t seq_len,
                  const std::vector<MemoryReport>& reports) const;
};

// Sum and L2 norm of the trained parameters (requires_grad; a tied tensor once), for the
// summary's checksum, in fp64, `chunk_numel` elements at a time: the transient memory is one
// chunk's fp64 copy at most, never a copy of the model (Engine::flat_parameters() is one: an
// fp32 cat of every parameter, ~28 GB at 7B).
struct ParamStats {
  double checksum = 0, norm = 0;
};
ParamStats parameter_stats(const std::vector<at::Tensor>& params, int64_t chunk_numel = 1 << 24);
// The same for the whole model when `model` is this rank's part of a tensor-parallel model over
// `tp` (null or size 1: `model` is whole): the split parameters' sums and squares are added over
// the group, the replicated ones (tensor_parallel::placements: the norms) counted once, so the
// figures equal the unsplit model's (up to the order of the fp64 sums). A collective over `tp`.
ParamStats whole_model_stats(const torch::nn::Module& model, const std::shared_ptr<Group>& tp);
// The same at stage 3, from the engine's gathered state_dict (compute dtype; a collective over
// the engine's group, and under tensor parallelism over `tp` as whole_model_stats).
ParamStats gathered_model_stats(const Engine& engine, const torch::nn::Module& model,
                                const std::shared_ptr<Group>& tp);

// Peak resident memory of this process (Linux VmHWM): on CPU it is where activations show up.
int64_t peak_rss_bytes();
// Resident memory now (VmRSS).
int64_t rss_bytes();

}  // namespace zero::examples
