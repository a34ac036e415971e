// zero-train's trainer: the example GPT trained with the ZeRO engine, in the phases a run goes
// through. zero_train.cpp reads the command line and calls them in order:
//
//   Trainer t(options);   set-up: the config (with the trainer.* keys), the data, the device
//   t.build();            the model (plain or tensor-parallel), its groups, "auto", the engine
//   t.prepare_outputs();  checkpoint directory, metrics and monitors checked on every rank
//   t.resume();           a checkpoint's state, and the loader replayed to its step
//   t.train();            the steps, a progress line at each print step
//   t.finish();           the summary (and its JSON) on rank 0
#pragma once

#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "data.hpp"
#include "launcher_check.hpp"
#include "metrics.hpp"
#include "monitor.hpp"
#include "phase_peaks.hpp"
#include "pp_trainer.hpp"
#include "train_summary.hpp"
#include "utilisation.hpp"
#include "zero/activation_checkpointing.hpp"
#include "zero/config.hpp"
#include "zero/engine.hpp"
#include "zero/groups.hpp"
#include "zero/models/gpt.hpp"
#include "zero/models/tp_gpt.hpp"
#include "zero/tensor_parallel/groups.hpp"

namespace zero::examples {

struct TrainerOptions {
  std::string config_path;
  std::string summary_path;       // rank 0 writes the JSON summary here ("" = none)
  std::vector<std::string> sets;  // --set key=value overrides, in order
};

// The trainer.* keys zero-train adds to the config (Config::Extension).
Config::Extension trainer_keys();

class Trainer {
 public:
  explicit Trainer(const TrainerOptions& options);
  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;
  ~Trainer();

  // pipeline.stages > 1, or 1 resuming a pipelined save (save_dir/stage0/, and no save of a
  // run without a pipeline beside it): what examples/pp_trainer.cpp's train_pipeline needs (the
  // set-up above), to run instead of the phases below; nullopt otherwise. At one stage the
  // pipeline's engine names parameters by layer, as the save does: the plain model's names
  // differ, so a pipelined save goes on in the pipeline's loop (at P = 1, the same training).
  std::optional<PipelineTrainerArgs> pipeline_args() const;

  void build();
  void prepare_outputs();
  void resume();
  void train();
  void finish();

 private:
  using Clock = std::chrono::steady_clock;

  // One optimizer step: gradient_accumulation_steps micro-steps, timed by phase.
  StepRecord run_step(int64_t step);
  // Saves when the interval says so; true if it saved.
  bool maybe_save(const StepRecord& rec);
  // Saves this rank's part (save_dir_), agreed over the world (checkpoint_agreement.hpp).
  void save();
  // Ranks whose launcher died stop together, after a last checkpoint (throws LaunchError).
  void check_launcher(const StepRecord& rec, bool log, bool saved);
  // Print step: the window's losses read back once, written to the metrics and monitors.
  void log_window();
  // `dir`/`tag`: the directory saved or loaded (a resume may read another layout's save).
  void report_io(const char* verb, const std::string& dir, const std::string& tag,
                 double seconds) const;
  // No save to resume from under trainer.save_dir, in any tensor-parallel layout.
  bool nothing_to_resume() const;
  torch::nn::Module& trained();
  at::Tensor loss(const at::Tensor& tokens, const at::Tensor& targets);

  // Set-up.
  TrainerOptions options_;
  Config cfg_;
  std::string hf_dir_, preset_;
  models::GptConfig mc_;
  int64_t steps_ = 0, seq_ = 0;
  std::shared_ptr<const Dataset> data_;
  c10::Device device_ = c10::Device(c10::kCPU);
  int64_t rss_before_model_ = 0;

  // Build.
  models::Gpt model_{nullptr};
  // The deferred model's source of initial values, until initialize has used it.
  zero::InitialValues initial_values_;
  // Whether build() made the model deferred (all but tp > 1 from HF files): the planner's start-up
  // figure follows it.
  bool started_deferred_ = false;
  models::TpGpt tp_model_{nullptr};
  tensor_parallel::Groups layout_;
  std::shared_ptr<Group> world_;
  models::CheckpointPolicy policy_;
  std::optional<Engine> engine_;
  std::optional<PhasePeaks> phases_;
  std::optional<BatchLoader> loader_;
  std::vector<MemoryReport> reports_;
  int64_t startup_peak_ = 0, after_initialize_ = 0;
  int rank_ = 0, world_size_ = 1, dp_size_ = 1;
  int64_t micro_ = 1, ga_ = 1;
  double peak_flops_ = 0;

  // Outputs and the loop.
  std::string save_root_, save_dir_, resume_;  // trainer.save_dir; this rank's part of it
  int64_t save_interval_ = 0;
  int keep_last_ = 0;
  std::unique_ptr<MonitorWriter> monitors_;
  std::optional<MetricsLog> metrics_;
  std::optional<UtilisationMeter> utilisation_;
  std::optional<LauncherCheck> launcher_check_;
  TrainSummary sum_;
  int64_t start_step_ = 0;
  Clock::time_point t0_;
  // Losses stay on the device until a print step: then the window's losses are averaged over
  // ranks in one collective and read once, so the host never waits for the device mid-window.
  std::vector<StepRecord> window_;
  std::vector<at::Tensor> window_losses_;
};

}  // namespace zero::examples
