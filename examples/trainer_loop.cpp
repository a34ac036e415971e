// zero-train's trainer, the steps and the end of the run (trainer.hpp): each optimizer step's
// micro-steps timed by phase, checkpoints at their interval, the launcher watched, a progress
// line at each print step, and the summary.
#include <ATen/ATen.h>
#include <torch/nn/module.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>

#include "checkpoint_agreement.hpp"
#include "trainer.hpp"
#include "zero/auto_strategy.hpp"
#include "zero/checkpoint_io.hpp"
#include "zero/device.hpp"
#include "zero/errors.hpp"
#include "zero/host_counting.hpp"
#include "zero/launcher.hpp"
#include "zero/memory_plan.hpp"
#include "zero/parallel_plan.hpp"
#include "zero/time_plan.hpp"
#include "zero/zero.hpp"

namespace zero::examples {
namespace {

using Clock = std::chrono::steady_clock;
double since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

}  // namespace

void Trainer::report_io(const char* verb, const std::string& dir, const std::string& tag,
                        double seconds) const {
  if (rank_ != 0) return;
  uintmax_t bytes = 0;  // the checkpoint's files, shared by the ranks that wrote or read them
  for (const auto& f : std::filesystem::directory_iterator(dir + "/" + tag)) {
    bytes += f.file_size();
  }
  const double mb = static_cast<double>(bytes) / dp_size_ / 1e6;
  std::printf("checkpoint: %s %s/%s in %.3f s: %.1f MB per rank, %.1f MB/s per rank\n", verb,
              dir.c_str(), tag.c_str(), seconds, mb, mb / std::max(seconds, 1e-9));
  std::fflush(stdout);
}

void Trainer::train() {
  const Config& c = engine_->config();
  metrics_.emplace(rank_ == 0 ? cfg_.extra_string("trainer.metrics_file") : "");
  // The summary's memory figures over every process, its checksum and norm the whole model's.
  sum_.world = world_;
  sum_.device = device_;
  if (tp_model_) sum_.tensor_parallel = layout_.tp;
  sum_.record_startup(*engine_, startup_peak_, after_initialize_);
  t0_ = Clock::now();
  utilisation_.emplace(device_);  // rank 0's device, per print interval
  // A launcher's death goes unnoticed at most this long (a quarter of comm_timeout_s leaves the
  // rest for the last checkpoint; an all-reduce of two numbers and a host sync every 2 s are a
  // negligible share of the training time).
  const double comm_timeout_s = std::chrono::duration<double>(c.comm_timeout).count();
  // Agreed over every process (the tensor-parallel and data-parallel ranks alike), so that all
  // of them check at the same steps and stop at the same one.
  launcher_check_.emplace(
      std::min(2.0, comm_timeout_s / 4), c.steps_per_print, world_, device_,
      [] { return launcher_exited(); }, start_step_);
  for (int64_t step = start_step_; step < steps_; ++step) {
    StepRecord rec = run_step(step);
    window_.push_back(rec);
    // Save on any step (the save reads the last step's outcome itself), log at print steps.
    const bool log = rec.step % c.steps_per_print == 0 || step == 0 || rec.step == steps_;
    const bool saved = maybe_save(rec);
    check_launcher(rec, log, saved);
    if (log) log_window();
  }
}

StepRecord Trainer::run_step(int64_t step) {
  const Config& c = engine_->config();
  const bool cuda = device_.is_cuda();
  const auto step_start = Clock::now();
  StepRecord rec;
  at::Tensor loss_sum = at::zeros({}, at::TensorOptions().device(device_));
  const double comm_before = engine_->stats().comm_wait_seconds;
  phases_->begin_step();
  for (int64_t m = 0; m < ga_; ++m) {
    auto t = Clock::now();
    auto batch = loader_->next();
    rec.data_s += since(t);
    phases_->begin();
    t = Clock::now();
    // Pinned host memory lets the copies run asynchronously to the host; a pageable
    // host-to-device copy would synchronise the stream.
    at::Tensor tokens = cuda ? batch.tokens.pin_memory() : batch.tokens;
    at::Tensor targets = cuda ? batch.targets.pin_memory() : batch.targets;
    // fp16.auto_cast casts floating-point inputs only: token ids pass unchanged, as in DeepSpeed.
    tokens = engine_->cast_input(tokens.to(device_, /*non_blocking=*/cuda));
    targets = targets.to(device_, cuda);
    at::Tensor l;
    {
      const HostCountingAllocator::Tag tag(HostTag::kActivations);
      l = loss(tokens, targets);
    }
    loss_sum += l.detach().to(at::kFloat);
    rec.forward_s += since(t);
    phases_->end(Phase::kForward);
    phases_->begin();
    t = Clock::now();
    {
      const HostCountingAllocator::Tag tag(HostTag::kBackward);
      engine_->backward(l);
    }
    rec.backward_s += since(t);
    phases_->end(Phase::kBackward);
    phases_->begin();
    t = Clock::now();
    {
      const HostCountingAllocator::Tag tag(HostTag::kStep);
      engine_->step();
    }
    rec.optimizer_s += since(t);
    phases_->end(Phase::kStep);
  }
  phases_->end_step();
  rec.comm_exposed_s = engine_->stats().comm_wait_seconds - comm_before;
  rec.allgather_wait_s = engine_->stats().allgather_wait_seconds;
  rec.backward_s -= rec.comm_exposed_s;
  rec.step_s = since(step_start);
  rec.step = step + 1;
  rec.total_steps = steps_;
  rec.lr = engine_->lr();
  const double tokens_per_step = static_cast<double>(c.train_batch_size * seq_);
  rec.tokens_per_s = tokens_per_step / rec.step_s;
  rec.mfu = peak_flops_ > 0
                ? rec.tokens_per_s * flops_per_token(mc_, seq_) / (peak_flops_ * world_size_)
                : -1;
  rec.eta_s = since(t0_) / static_cast<double>(rec.step) * static_cast<double>(steps_ - rec.step);
  window_losses_.push_back((loss_sum / static_cast<double>(ga_)).reshape({1}));
  return rec;
}

bool Trainer::maybe_save(const StepRecord& rec) {
  if (save_interval_ <= 0 || rec.step % save_interval_ != 0) return false;
  const auto t = Clock::now();
  phases_->begin();
  save();
  phases_->end(Phase::kSave);
  report_io("saved", save_dir_, "step" + std::to_string(engine_->stats().optimizer_steps),
            since(t));
  return true;
}

void Trainer::save() {
  // Each tensor-parallel rank saves into its own directory over its data-parallel group; the
  // tags keep_last drops go only once every rank of the world has published the new one, so a
  // save cut short leaves every directory the previous tag (agree_resume_point resumes from it).
  save_over_world([&] { engine_->save_checkpoint(save_dir_, "", 0); },
                  [&] {
                    if (engine_->rank() == 0) prune_checkpoints(save_dir_, keep_last_);
                  },
                  device_, world_);
}

void Trainer::check_launcher(const StepRecord& rec, bool log, bool saved) {
  // Ranks whose launcher died would train on unsupervised (nobody would stop or restart them):
  // they agree to stop at the same step, after a last checkpoint when saving is on. Agreeing
  // costs an all-reduce and a host sync: at print steps, and often enough between them to stop
  // within a few seconds (LauncherCheck), not at every step.
  if (!launcher_check_->launcher_gone(rec.step, log)) return;
  std::string what = "stopping at step " + std::to_string(rec.step);
  if (save_interval_ > 0) {
    if (!saved) save();
    what += " after saving " + save_dir_ + "/step" +
            std::to_string(engine_->stats().optimizer_steps) +
            " (continue with trainer.resume: auto)";
  }
  throw LaunchError(
      "the launcher" +
      (launcher_pid() > 0 ? " (pid " + std::to_string(launcher_pid()) + ")" : std::string()) +
      " exited during training; " + what);
}

void Trainer::log_window() {
  const Config& c = engine_->config();
  // Print step: the one read-back of the window (losses, the norm and scale of this step).
  const at::Tensor losses = engine_->all_reduce_mean(at::cat(window_losses_)).cpu();
  const double grad_norm = engine_->settled_stats().last_grad_norm;
  const bool skipped = engine_->settled_stats().last_step_skipped;
  const double loss_scale = engine_->loss_scale();
  const DeviceMemory dm = device_memory(device_);
  const double busy = utilisation_->sample();
  for (size_t i = 0; i < window_.size(); ++i) {
    StepRecord& r = window_[i];
    r.loss = losses[static_cast<int64_t>(i)].item<double>();
    r.grad_norm = grad_norm;  // known at print steps; earlier records repeat it
    r.skipped = skipped && i + 1 == window_.size();
    r.loss_scale = loss_scale;
    r.utilisation = busy;
    // The allocator's peak restarts with each phase: the run's is the phases'.
    r.memory_bytes = dm.available ? std::max(dm.peak_allocated, phases_->overall())
                                  : reports_[0].measured.total();
    sum_.add(r);
    metrics_->write(r);
    if (monitors_) monitors_->write(r, r.step * c.train_batch_size);  // DeepSpeed's x: samples
  }
  const StepRecord rec = window_.back();
  window_.clear();
  window_losses_.clear();
  if (rank_ != 0) return;
  std::printf("%s\n", format_progress(rec).c_str());
  if (rec.step == 1 && model_ && model_->offloader) {
    // What checkpointing kept between forward and backward went to host memory.
    const OffloadStats os = model_->offloader->stats();
    std::printf(
        "activations: %s of block inputs offloaded to host memory at peak, %s left "
        "on the device; %lld blocks offloaded, %lld prefetched\n",
        format_bytes(os.peak_host_bytes).c_str(), format_bytes(os.device_bytes_kept).c_str(),
        (long long)os.offloaded, (long long)os.prefetched);
  }
  std::fflush(stdout);
}

void Trainer::finish() {
  const Config& c = engine_->config();
  RunShape run;
  run.stage = engine_->stage();
  run.world_size = world_size_;
  run.grad_accum = ga_;
  run.micro_batch = micro_;
  run.checkpointing = policy_.enabled;
  run.cpu = device_.is_cpu();
  run.memory_baseline = device_.is_cuda() ? 0 : rss_before_model_;
  {
    const auto& q = c.zero_optimization.quantized_gradients;
    const Dtype comm = c.communication_data_type.value_or(c.param_dtype());
    run.comm_bits = q.enabled ? q.bits : comm == Dtype::kFloat32 ? 32 : 16;
  }
  const ModelShape shape{mc_.layers, mc_.dim,  mc_.heads,   mc_.ffn_dim(),
                         mc_.vocab,  mc_.tied, mc_.kv_heads};
  {
    PlanInput pi;  // the planner's bucket order is the engine's
    pi.shape = shape;
    pi.num_params = mc_.num_params();
    pi.bucket_elements = c.zero_optimization.reduce_bucket_size;
    run.buckets = static_cast<int64_t>(bucket_sizes(pi).size());
  }
  {
    // The planner's figure for each phase, beside the allocator's (the summary's phase_peaks).
    // Under tensor parallelism: this rank's shard of the parameters over the data-parallel
    // ranks, and its share of the activations (parallel_plan.hpp).
    PlanInput pp = plan_input_for(c, mc_.num_params(), world_size_);
    pp.shape = shape;
    pp.seq_len = seq_;
    pp.micro_batch = micro_;
    pp.tensor_parallel = tp_model_ ? layout_.tp->size() : 1;
    pp.sequence_parallel = tp_model_ && tp_model_->sequence_parallel;
    // A deferred start-up never holds the fp32 model on the device (plan_startup_peak).
    pp.deferred_start = started_deferred_;
    const PlanInput rank = rank_states_input(pp, 0);
    const int stage = engine_->stage();
    const int64_t states = plan_model_states(rank, stage).total() - plan_host_states(rank, stage);
    const Recompute rc = !policy_.enabled      ? Recompute::kNone
                         : policy_.cpu_offload ? Recompute::kCheckpointOffload
                                               : Recompute::kCheckpoint;
    const ActivationEstimate a = predict_stage_activations(pp, rc, 0);
    // The bound on every phase: the steady states + two buckets + the activations at backward's
    // worst moment. A bucket closes on the parameter that crosses reduce_bucket_size, so it
    // holds up to reduce_bucket_size - 1 elements plus the largest parameter (gpt-100m's 20.5 M
    // element embedding and head each make a bucket 41x reduce_bucket_size 5e5), in fp32 (the
    // gradient accumulation, gloo's gather output) at most.
    int64_t largest = 0;
    for (const auto& p : trained().parameters()) largest = std::max(largest, p.numel());
    const int64_t bucket_bytes = (c.zero_optimization.reduce_bucket_size + largest) * 4;
    // Stage 3 holds its gradient shard and bucket buffers from the window's first reduction to
    // the step only: in backward and the step, and in the forwards of an accumulation window
    // after its first. The bound's steady states (measured after a step) lack it too.
    const int64_t grad_path = stage3_gradient_path_bytes(rank, stage);
    sum_.record_phases(*engine_, *phases_,
                       {plan_startup_peak(rank, stage),
                        states + a.blocks + a.head + a.loss + (ga_ > 1 ? grad_path : 0),
                        states + a.peak() + grad_path, states + grad_path, states},
                       bucket_bytes, a.peak() + grad_path);
  }
  const DeviceMemory dm = device_memory(device_);
  run.memory_budget = dm.total > 0 ? dm.total : c.zero_optimization.auto_device_memory;
  sum_.finish(*engine_, trained(), model_ ? model_->offloader.get() : nullptr, policy_,
              data_->describe(), loader_->wait_seconds(), run);
  if (rank_ != 0) return;
  std::printf("done: loss %.4f -> %.4f, parameter L2 norm %.6f, median step %.3f s\n",
              sum_.first_loss, sum_.final_loss, sum_.param_norm, sum_.median_step_s());
  std::printf("%s\n", sum_.verdict.line().c_str());
  if (monitors_ && monitors_->enabled()) {
    std::printf(
        "monitors: %lld steps handed to the writer thread, %.1f us per step on the "
        "training thread\n",
        (long long)monitors_->records(),
        1e6 * monitors_->enqueue_seconds() / std::max<int64_t>(1, monitors_->records()));
  }
  if (!options_.summary_path.empty()) {
    sum_.write_json(options_.summary_path, *engine_, preset_, mc_, seq_, reports_);
  }
}

}  // namespace zero::examples
