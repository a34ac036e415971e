#include "pp_trainer.hpp"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <stdexcept>
#include <vector>

#include "checkpoint_agreement.hpp"
#include "file_checks.hpp"
#include "launcher_check.hpp"
#include "memory_figures.hpp"
#include "metrics.hpp"
#include "monitor.hpp"
#include "phase_peaks.hpp"
#include "pp_summary.hpp"
#include "startup_agreement.hpp"
#include "train_summary.hpp"
#include "zero/checkpoint_io.hpp"
#include "zero/comm_overlap.hpp"
#include "zero/device.hpp"
#include "zero/engine.hpp"
#include "zero/errors.hpp"
#include "zero/launcher.hpp"
#include "zero/models/gpt.hpp"
#include "zero/models/gpt_layers.hpp"
#include "zero/models/hf_llama.hpp"
#include "zero/models/tp_gpt.hpp"
#include "zero/models/tp_gpt_layers.hpp"
#include "zero/pipeline_engine.hpp"
#include "zero/tensor_parallel/overlap.hpp"

namespace zero::examples {
namespace {

using Clock = std::chrono::steady_clock;

void refuse_unsupported(const PipelineTrainerArgs& a) {
  const Config& cfg = a.cfg;
  std::string p = "pipeline.stages = " + std::to_string(cfg.pipeline.stages);
  if (cfg.pipeline.stages <= 1)
    p += " resuming the pipelined save in " + cfg.extra_string("trainer.save_dir") + "/stage*/";
  auto no = [&](const std::string& what) { throw ConfigError(a.config_path + ": " + what); };
  const int tp = cfg.tensor_parallel.autotp_size;
  // Sequence parallelism: each tensor-parallel rank holds (and sends to the next stage) its
  // 1/T of the sequence, so the sequence must split evenly.
  if (tp > 1 && cfg.tensor_parallel.sequence_parallel && a.seq_len % tp != 0)
    no(p + " with tensor_parallel.sequence_parallel: trainer.seq_len " + std::to_string(a.seq_len) +
       " must be a multiple of tensor_parallel.autotp_size " + std::to_string(tp) +
       " (each tensor-parallel rank holds an equal part of the sequence); "
       "choose another trainer.seq_len or set tensor_parallel.sequence_parallel: false");
  std::string ckpt = cfg.extra_string("trainer.activation_checkpointing");
  if (ckpt == "true" || ckpt == "True")
    no(p +
       ": trainer.activation_checkpointing checkpoints the whole model's blocks; a pipeline "
       "recomputes per stage with pipeline.activation_checkpoint_interval: n instead");
}

// "stages: 0 fwd 20% bwd 45% opt 5% comm 30% mem 1.2 MiB | 1 ...": each stage's step by the
// instructions it ran, from gather_over_stages' {forward, backward, step, comm, model states}.
std::string format_stages(const std::vector<std::vector<double>>& v) {
  std::string line = "  stages:";
  for (size_t s = 0; s < v.size(); ++s) {
    const double total = std::max(1e-12, v[s][0] + v[s][1] + v[s][2] + v[s][3]);
    char part[160];
    std::snprintf(part, sizeof part, "%s %zu fwd %.0f%% bwd %.0f%% opt %.0f%% comm %.0f%% mem %s",
                  s ? " |" : "", s, 100 * v[s][0] / total, 100 * v[s][1] / total,
                  100 * v[s][2] / total, 100 * v[s][3] / total,
                  format_bytes(static_cast<int64_t>(v[s][4])).c_str());
    line += part;
  }
  return line;
}

// The --summary-json file (pp_summary.hpp says whose numbers): collectives over the stages and
// data-parallel groups on every rank, the file written by rank 0.
void write_summary(const PipelineTrainerArgs& a, const pipeline::PipelineEngine& pipe,
                   const pipeline::PipelineGrid& grid, const std::shared_ptr<Group>& world,
                   const PhasePeaks& phases, PipelineSummary& summary) {
  if (a.summary_path.empty()) return;
  const int rank = world->rank(), world_size = world->size();
  const Engine& engine = pipe.engine();
  const Config& c = engine.config();
  // The memory figures first (the checksum below allocates), every rank's over the world: the
  // plain summary's keys (memory_figures.hpp).
  MemoryFigures& mem = summary.memory;
  mem.peak_rss_per_rank = gather_over(world, peak_rss_bytes(), a.device);
  mem.peak_rss_bytes =
      *std::max_element(mem.peak_rss_per_rank.begin(), mem.peak_rss_per_rank.end());
  const DeviceMemory dm = device_memory(a.device);
  mem.device_peak_per_rank = gather_over(
      world, dm.available ? std::max(dm.peak_allocated, phases.overall()) : 0, a.device);
  mem.device_peak_allocated_bytes =
      *std::max_element(mem.device_peak_per_rank.begin(), mem.device_peak_per_rank.end());
  for (int i = 0; i < kPhases; ++i)
    mem.phase_measured[i] = max_over(world, phases.measured(static_cast<Phase>(i)), a.device);
  mem.step_peaks.clear();
  for (int64_t p : phases.step_peaks()) mem.step_peaks.push_back(max_over(world, p, a.device));
  mem.steady_states = max_over(world, phases.after_step(), a.device);
  // The whole model's (every stage's, every tensor-parallel rank's shards).
  const ParamStats stats = pipeline_model_stats(pipe, grid.tp);
  const auto peaks = engine.all_gather_values(peak_rss_bytes());  // over the stage's dp ranks
  const int64_t peak = *std::max_element(peaks.begin(), peaks.end());
  const auto per_stage = pipe.gather_over_stages(
      {static_cast<double>(peak), static_cast<double>(engine.memory_report().measured.total())});
  if (rank != 0) return;
  summary.param_checksum = stats.checksum;
  summary.param_norm = stats.norm;
  const auto& b = pipe.bounds();
  summary.stages.resize(per_stage.size());
  const size_t p = per_stage.size(), last_chunk = (pipe.virtual_stages() - 1) * p;
  for (size_t s = 0; s < p; ++s) {
    // Interleaved: from its first chunk's first layer to its last chunk's last (the other
    // stages' chunks lie between).
    summary.stages[s].first_layer = b[s];
    summary.stages[s].last_layer = b[last_chunk + s + 1] - 1;
    summary.stages[s].peak_rss_bytes = static_cast<int64_t>(per_stage[s][0]);
    summary.stages[s].model_states_bytes = static_cast<int64_t>(per_stage[s][1]);
  }
  summary.grid = grid.describe();
  summary.schedule = c.pipeline.schedule;
  summary.model = a.preset;
  summary.data = a.data->describe();
  summary.world_size = world_size;
  summary.zero_stage = engine.stage();
  summary.micro_batches = pipe.micro_batches();
  summary.num_params = a.model.num_params();
  summary.seq_len = a.seq_len;
  // The step's (interleaved, the engine's window counts every chunk's backward: v x this).
  summary.train_batch_size =
      c.train_micro_batch_size_per_gpu * pipe.micro_batches() * grid.dp->size();
  summary.skipped_steps = engine.settled_stats().skipped_steps;
  summary.write_json(a.summary_path);
  std::printf("summary: %s\n", a.summary_path.c_str());
}

}  // namespace

int train_pipeline(const PipelineTrainerArgs& a) {
  refuse_unsupported(a);
  const Config& cfg = a.cfg;
  const std::string& path = a.config_path;
  // The weights the plain trainer starts from (the same seed, the same draws): pipeline runs of
  // any P start where P = 1 does. Under tensor parallelism each rank keeps its shards of them:
  // of the Hugging Face model read whole, or drawn as the plain constructor draws them
  // (init_like_gpt from the generator as that constructor finds it), as the plain trainer does.
  const int tp = cfg.tensor_parallel.autotp_size;
  at::manual_seed(cfg.seed);
  const at::Generator init_gen = at::detail::getDefaultCPUGenerator().clone();
  models::Gpt model(nullptr);
  if (tp == 1 || !a.hf_dir.empty()) {
    model = models::Gpt(a.model);
    if (!a.hf_dir.empty()) models::load_hf_llama(*model, a.hf_dir);
  }

  auto world = process_group_from_env(cfg, a.device.type());
  pipeline::PipelineGrid grid;
  try {
    grid = pipeline::make_pipeline_grid(world, cfg.pipeline.stages, tp);
    if (tp > 1) models::check_tensor_parallel_shape(a.model, tp);
  } catch (const std::invalid_argument& e) {
    throw ConfigError(path + ": " + e.what());
  }
  models::TpGpt tp_model(nullptr);
  std::vector<pipeline::Layer> layers;
  pipeline::LossFn loss_fn = models::gpt_loss;
  if (tp > 1) {
    tp_model = models::TpGpt(grid.tp, a.model, cfg.tensor_parallel.sequence_parallel);
    tensor_parallel::set_overlap_comm(*tp_model, tensor_parallel_overlap_comm(cfg));
    if (model) {
      tp_model->load_full(*model);
      model = models::Gpt(nullptr);
    } else {
      models::init_like_gpt(*tp_model, init_gen);
    }
    layers = models::tp_gpt_pipeline_layers(tp_model, a.seq_len);
    loss_fn = models::tp_gpt_loss(grid.tp);
  } else {
    layers = models::gpt_pipeline_layers(model, a.seq_len);
  }
  std::vector<std::string> names;
  for (const auto& l : layers) names.push_back(l.name);
  // pipeline.partition: compute cuts by these; the start-up lines say where each came from and
  // each stage's share.
  const bool by_compute = cfg.pipeline.partition == "compute";
  const std::vector<pipeline::LayerCost> costs = pipeline::layer_costs(layers);
  const std::string cost_line = pipeline::describe_layer_costs(layers, costs);
  std::unique_ptr<pipeline::PipelineEngine> pipe;
  try {
    // The model stays on the host; only this stage's layers go to the rank's device.
    pipe = std::make_unique<pipeline::PipelineEngine>(std::move(layers), std::move(loss_fn), cfg,
                                                      grid, a.device);
  } catch (const std::invalid_argument& e) {
    throw ConfigError(path + ": " + e.what());
  }
  // The engine holds this stage's layers; the other stages' go with the model (fp32 on the host:
  // 7/8 of the model per process at P = 8, kept for nothing).
  model = models::Gpt(nullptr);
  tp_model = models::TpGpt(nullptr);
  // Start-up memory as the plain trainer records it (the model and this stage's engine), and
  // the allocator's peaks from here on: each step's, and the saves'.
  const int64_t startup_peak = peak_rss_bytes(), after_initialize = rss_bytes();
  PhasePeaks phases(a.device);
  const Engine& engine = pipe->engine();
  const Config& c = engine.config();  // batch sizes resolved for the data-parallel size
  const int rank = world->rank(), world_size = world->size();
  const int64_t micro = c.train_micro_batch_size_per_gpu;
  // Micro-batches per step: gradient_accumulation_steps (the engine's config counts v times
  // that under the interleaved schedule, see PipelineEngine::engine).
  const int64_t ga = pipe->micro_batches();
  const int dp_size = grid.dp->size();
  const int64_t train_batch = micro * ga * dp_size;
  BatchLoader loader(a.data, DistributedSampler(a.data->size(), grid.dp_rank, dp_size, cfg.seed),
                     micro);
  if (rank == 0) {
    std::printf(
        "zero-train: %s (%lld parameters), %d ranks (%s) on %s, ZeRO stage %d, %s, pipeline "
        "%s, micro-batch %lld x %lld micro-batches x %d data-parallel ranks = %lld sequences "
        "of %lld tokens, data: %s\n",
        a.preset.c_str(), (long long)a.model.num_params(), world_size,
        (grid.describe() +
         (tp > 1 && cfg.tensor_parallel.sequence_parallel ? ", sequence parallel" : "") +
         // Said only when off: the log of an A/B run (bench/overlap_ab.sh) says which side it is.
         (tp > 1 && !tensor_parallel_overlap_comm(cfg) ? ", tensor_parallel.overlap_comm off"
                                                       : "") +
         (!overlap_p2p_comm(cfg) ? ", pipeline.overlap_p2p_comm off" : ""))
            .c_str(),
        a.device.str().c_str(), engine.stage(),
        c.bf16 ? "bf16" : (c.fp16.enabled ? "fp16" : "fp32"), c.pipeline.schedule.c_str(),
        (long long)micro, (long long)ga, dp_size, (long long)train_batch, (long long)a.seq_len,
        a.data->describe().c_str());
    const auto& b = pipe->bounds();
    const int v = pipe->virtual_stages(), p = pipe->stages();
    double total = 0;
    for (const auto& c : costs) total += static_cast<double>(c.flops_per_token);
    if (by_compute) std::printf("%s\n", cost_line.c_str());
    for (int s = 0; s < p; ++s)
      for (int k = 0; k < v; ++k) {
        const int vs = k * p + s;
        double share = 0;
        for (int i = b[vs]; i < b[vs + 1]; ++i)
          share += static_cast<double>(costs[i].flops_per_token) / std::max(total, 1.0);
        const std::string share_text =
            by_compute
                ? ", " + std::to_string(static_cast<int>(100 * share + 0.5)) + "% of the FLOPs"
                : "";
        std::printf(
            "pipeline: stage %d %sholds layers %d..%d (%s .. %s)%s\n", s,
            v > 1 ? ("chunk " + std::to_string(k) + " (virtual stage " + std::to_string(vs) + ") ")
                        .c_str()
                  : "",
            b[vs], b[vs + 1] - 1, names[b[vs]].c_str(), names[b[vs + 1] - 1].c_str(),
            share_text.c_str());
      }
    std::fflush(stdout);
  }

  // Checkpoints per stage (save_dir/stage<s>/ and the partition in pipeline.json), resumed at
  // any pipeline.stages and data-parallel size: each stage reads its layers from whichever
  // saved stages hold them. Resuming replays the loader to the saved step, as the plain trainer
  // does.
  const std::string save_dir = cfg.extra_string("trainer.save_dir");
  const int64_t save_interval = cfg.extra_int("trainer.save_interval");
  const int keep_last = static_cast<int>(cfg.extra_int("trainer.keep_last"));
  const std::string resume = cfg.extra_string("trainer.resume");
  if ((save_interval > 0 || resume != "false") && save_dir.empty())
    throw ConfigError(path + ": trainer.save_interval and trainer.resume need a trainer.save_dir");
  int64_t start_step = 0;
  // A save of a run without a pipeline (save_dir/<tag>, save_dir/tp<r>/) names the plain
  // model's parameters, not layers: refused rather than trained over from the start.
  // Stage 0's directory (its tp0/ under tensor parallelism) names the newest save whatever P and
  // T wrote it (a later stage's may hold an older one, or none): every rank asks it, so all
  // resume or none.
  const bool pipelined = !checkpoint_dirs(save_dir + "/stage0").empty();
  if (resume != "false" && !pipelined && !checkpoint_dirs(save_dir).empty())
    throw ConfigError(path + ": trainer.resume: " + save_dir +
                      " holds a save of a run without a pipeline; a pipeline resumes pipelined "
                      "saves (save_dir/stage<s>/) only: resume it with pipeline.stages: 1, or "
                      "give another trainer.save_dir");
  if (resume != "false" && !(resume == "auto" && !pipelined)) {
    const std::string want = resume == "true" || resume == "auto" ? "" : resume;
    // One tag for every rank: the newest complete in every stage directory of its layout (a save
    // cut short after stage 0 had published its part resumes every stage from the older one).
    std::string note;
    const std::string agreed = agree_pipeline_resume_tag(save_dir, want, &note, a.device, world);
    if (rank == 0 && !note.empty()) std::printf("checkpoint: %s\n", note.c_str());
    const std::string tag = pipe->load_checkpoint(save_dir, agreed);
    start_step = engine.stats().optimizer_steps;
    if (rank == 0) {
      std::printf("checkpoint: loaded %s/stage*/%s (step %lld)\n", save_dir.c_str(), tag.c_str(),
                  (long long)start_step);
      const pipeline::PipelineSaveLayout saved = pipeline::read_pipeline_save(save_dir, tag);
      const int v = pipe->virtual_stages();
      if (saved.stages != cfg.pipeline.stages || saved.bounds != pipe->bounds()) {
        std::string b;
        for (size_t i = 0; i < saved.bounds.size(); ++i)
          b += (i ? "," : "") + std::to_string(saved.bounds[i]);
        // Interleaved runs name their chunks per stage; 1F1B lines stay as they were.
        auto chunks = [](int n) {
          return n > 1 ? " x pipeline.virtual_stages " + std::to_string(n) : std::string();
        };
        std::printf(
            "checkpoint: resharded the save of pipeline.stages %d%s (bounds %s) to "
            "pipeline.stages %d%s\n",
            saved.stages, chunks(saved.virtual_stages).c_str(), b.c_str(), cfg.pipeline.stages,
            chunks(v).c_str());
      }
    }
    for (int64_t i = 0; i < start_step * ga; ++i) loader.next();
  }

  // DeepSpeed's monitors and the summary are rank 0's (stage 0's): the loss it reports is the
  // last stage's (broadcast to every rank), the global norm every stage's. Rank 0's outputs are
  // checked before training time is spent, and every rank learns whether they failed: otherwise
  // the other stages would wait at their first send for rank 0 until comm_timeout_s.
  const std::string metrics_path = rank == 0 ? cfg.extra_string("trainer.metrics_file") : "";
  std::unique_ptr<MonitorWriter> monitors;
  std::string problem;
  try {
    if (!metrics_path.empty()) require_writable_file(metrics_path, "trainer.metrics_file");
    if (rank == 0) {
      if (!a.summary_path.empty()) require_writable_file(a.summary_path, "--summary-json");
      monitors = std::make_unique<MonitorWriter>(monitor_config(cfg, "tensorboard"),
                                                 monitor_config(cfg, "csv_monitor"), true);
      if (monitors->enabled()) std::printf("monitors: %s\n", monitors->describe().c_str());
    }
  } catch (const std::exception& e) {
    problem = e.what();
  }
  stop_unless_every_rank_passed(problem, a.device, world);
  MetricsLog metrics(metrics_path);
  PipelineSummary summary;
  summary.memory.startup_peak_rss_bytes = max_over(world, startup_peak, a.device);
  summary.memory.rss_after_initialize_bytes = max_over(world, after_initialize, a.device);
  const double tokens_per_step = static_cast<double>(train_batch * a.seq_len);
  double first_loss = 0, last_loss = 0;
  const auto t0 = Clock::now();
  // Each stage saves into save_dir/stage<s>/ over its data-parallel group; the tags keep_last
  // drops go only once every rank has published the new one (checkpoint_agreement.hpp).
  auto save = [&] {
    phases.begin();
    save_over_world([&] { pipe->save_checkpoint(save_dir, "", 0); },
                    [&] {
                      if (grid.dp_rank == 0)
                        prune_checkpoints(pipe->stage_dir(save_dir), keep_last);
                    },
                    a.device, world);
    phases.end(Phase::kSave);
    if (rank == 0)
      std::printf("checkpoint: saved %s/stage*/step%lld\n", save_dir.c_str(),
                  (long long)engine.stats().optimizer_steps);
  };
  LauncherCheck launcher(
      std::min(2.0, std::chrono::duration<double>(c.comm_timeout).count() / 4), c.steps_per_print,
      world, a.device, [] { return launcher_exited(); }, start_step);
  // Nothing in a step reads the device on the host (a GPU run queues steps ahead): the loss stays
  // a tensor, the stage times and the norm are host values, and at each print step one
  // all-gather over the stages and one read of the window's losses fill the window's records
  // (the plain trainer's log_window does the same).
  std::vector<StepRecord> window;
  std::vector<at::Tensor> window_losses;  // each step's, on the stage's device
  std::vector<double> window_times;       // 5 per step: forward, backward, step, comm, memory
  // A GPU engine learns a step's norm at the next step (Engine::stats); on the host at once.
  const bool norm_lags = !a.device.is_cpu();
  bool first_window = true;
  auto flush = [&](bool print) {
    const at::Tensor losses = at::cat(window_losses).to(at::kDouble).cpu();
    const auto all = pipe->gather_over_stages(window_times);  // [stage][5 x steps]
    const zero::EngineStats settled = engine.settled_stats();
    const double loss_scale = engine.loss_scale();
    std::vector<std::vector<double>> stage_values;
    for (size_t i = 0; i < window.size(); ++i) {
      StepRecord& rec = window[i];
      rec.loss = losses[static_cast<int64_t>(i)].item<double>();
      if (i + 1 == window.size()) {
        rec.grad_norm = settled.last_grad_norm;
        if (norm_lags) rec.skipped = settled.last_step_skipped;
      }
      rec.loss_scale = loss_scale;  // known at print steps; earlier records repeat it
      stage_values.assign(all.size(), {});
      for (size_t s = 0; s < all.size(); ++s)
        stage_values[s].assign(all[s].begin() + 5 * i, all[s].begin() + 5 * (i + 1));
      summary.add_stage_times(stage_values);
      if (first_window && i == 0) first_loss = rec.loss;
      last_loss = rec.loss;
      metrics.write(rec);
      if (monitors) monitors->write(rec, rec.step * train_batch);  // DeepSpeed's x
      if (rank == 0) summary.records.push_back(rec);
    }
    first_window = false;
    if (rank == 0 && print) {
      std::printf("%s\n", format_progress(window.back()).c_str());
      std::printf("%s\n", format_stages(stage_values).c_str());
      std::fflush(stdout);
    }
    window.clear();
    window_losses.clear();
    window_times.clear();
  };
  for (int64_t step = start_step; step < a.steps; ++step) {
    const auto start = Clock::now();
    // Every rank draws its data-parallel share (the sampler stays in step); the first stage
    // reads the tokens, the last the targets.
    std::vector<at::Tensor> inputs, targets;
    for (int64_t m = 0; m < ga; ++m) {
      auto batch = loader.next();
      inputs.push_back(batch.tokens.to(a.device));
      targets.push_back(batch.targets.to(a.device));
    }
    const double data_s = std::chrono::duration<double>(Clock::now() - start).count();
    phases.begin_step();
    phases.begin();
    window_losses.push_back(pipe->train_batch(inputs, targets).reshape({1}));
    phases.end_phases();
    phases.end_step();
    // The previous step's norm and fp16 verdict, now known without waiting (the step above
    // settled them).
    if (norm_lags && !window.empty()) {
      window.back().grad_norm = engine.stats().last_grad_norm;
      window.back().skipped = engine.stats().last_step_skipped;
    }
    StepRecord rec;
    rec.step = step + 1;
    rec.total_steps = a.steps;
    rec.lr = engine.lr();
    // An fp16 overflow's skip: on the host at once, else at the next step or the flush (asking
    // now would wait for this step's last kernel on a GPU).
    if (!norm_lags) rec.skipped = !pipe->last_step_applied();
    // The global norm (every stage's): here on the host, else at the next step or the flush.
    if (!norm_lags) rec.grad_norm = engine.stats().last_grad_norm;
    rec.step_s = std::chrono::duration<double>(Clock::now() - start).count();
    // This rank's stage (rank 0: stage 0), by the instructions it ran (pipeline::StepTimes):
    // the exposed communication is the pipeline's, waiting on the neighbouring stages (the
    // bubble) included; the data-parallel reduction is inside the last backward.
    const pipeline::StepTimes& t = pipe->last_step_times();
    rec.forward_s = t.forward_s;
    rec.backward_s = t.backward_s;
    rec.optimizer_s = t.step_s;
    rec.comm_exposed_s = t.comm_s;
    rec.data_s = data_s;
    rec.tokens_per_s = tokens_per_step / rec.step_s;
    rec.eta_s = std::chrono::duration<double>(Clock::now() - t0).count() /
                static_cast<double>(rec.step - start_step) *
                static_cast<double>(a.steps - rec.step);
    rec.memory_bytes = engine.memory_report().measured.total();
    // Every stage's split and model states, for the per-stage line and the summary (gathered
    // over the pipeline group at the print step).
    window_times.insert(window_times.end(), {t.forward_s, t.backward_s, t.step_s, t.comm_s,
                                             static_cast<double>(rec.memory_bytes)});
    window.push_back(rec);
    const bool saved = save_interval > 0 && rec.step % save_interval == 0;
    if (saved) save();
    const bool log = rec.step % c.steps_per_print == 0 || step == 0 || rec.step == a.steps;
    if (log) flush(true);
    // Ranks whose launcher died stop together, every stage at the same step, after a last
    // checkpoint when saving is on (the plain trainer's check_launcher).
    if (launcher.launcher_gone(rec.step, log)) {
      if (!window.empty()) flush(false);  // the records of the steps since the last print
      std::string what = "stopping at step " + std::to_string(rec.step);
      if (save_interval > 0) {
        if (!saved) save();
        what += " after saving " + save_dir + "/stage*/step" + std::to_string(rec.step) +
                " (continue with trainer.resume: auto)";
      }
      throw LaunchError(
          "the launcher" +
          (launcher_pid() > 0 ? " (pid " + std::to_string(launcher_pid()) + ")" : std::string()) +
          " exited during training; " + what);
    }
  }
  if (rank == 0) std::printf("done: loss %.4f -> %.4f\n", first_loss, last_loss);
  write_summary(a, *pipe, grid, world, phases, summary);
  return 0;
}

}  // namespace zero::examples
