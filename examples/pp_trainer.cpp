#include "pp_trainer.hpp"

#include <ATen/ATen.h>

#include <chrono>
#include <cstdio>
#include <stdexcept>
#include <vector>

#include "gpt.hpp"
#include "gpt_layers.hpp"
#include "hf_llama.hpp"
#include "metrics.hpp"
#include "monitor.hpp"
#include "zero/checkpoint_io.hpp"
#include "zero/engine.hpp"
#include "zero/pipeline_engine.hpp"

namespace zero::examples {
namespace {

using Clock = std::chrono::steady_clock;

void refuse_unsupported(const PipelineTrainerArgs& a) {
  const Config& cfg = a.cfg;
  std::string p = "pipeline.stages = " + std::to_string(cfg.pipeline.stages);
  if (cfg.pipeline.stages <= 1)
    p += " resuming the pipelined save in " + cfg.extra_string("trainer.save_dir") + "/stage*/";
  auto no = [&](const std::string& what) { throw ConfigError(a.config_path + ": " + what); };
  if (cfg.tensor_parallel.autotp_size > 1)
    no(p +
       " with tensor_parallel.autotp_size = " + std::to_string(cfg.tensor_parallel.autotp_size) +
       ": pipeline x tensor parallelism is not built yet; use one of the two");
  for (const char* section : {"tensorboard", "csv_monitor"})
    if (monitor_config(cfg, section).enabled)
      no(p + ": " + section +
         ".enabled: the monitors are not written for a pipeline yet; set it false "
         "(trainer.metrics_file has the losses)");
  if (!a.summary_path.empty())
    no(p +
       ": --summary-json is not written for a pipeline yet; drop it (trainer.metrics_file "
       "has the losses)");
  std::string ckpt = cfg.extra_string("trainer.activation_checkpointing");
  if (ckpt == "true" || ckpt == "True")
    no(p +
       ": trainer.activation_checkpointing checkpoints the whole model's blocks; a pipeline "
       "recomputes per stage with pipeline.activation_checkpoint_interval: n instead");
}

}  // namespace

int train_pipeline(const PipelineTrainerArgs& a) {
  refuse_unsupported(a);
  const Config& cfg = a.cfg;
  const std::string& path = a.config_path;
  // The weights the plain trainer starts from (the same seed, the same draws): pipeline runs of
  // any P start where P = 1 does.
  at::manual_seed(cfg.seed);
  Gpt model(a.model);
  if (!a.hf_dir.empty()) load_hf_llama(*model, a.hf_dir);
  // The whole model goes to the rank's device (the rotary tables the blocks share with it
  // included); the pipeline trains this stage's layers. `model` lives for the run, so every
  // stage holds every layer's weights on its device: simple, and wasteful for a model that
  // needs a pipeline to fit (moving only the stage's layers needs the partition before the
  // engine).
  model->to(a.device);

  auto world = process_group_from_env(cfg, a.device.type());
  pipeline::PipelineGrid grid;
  try {
    grid = pipeline::make_pipeline_grid(world, cfg.pipeline.stages);
  } catch (const std::invalid_argument& e) {
    throw ConfigError(path + ": " + e.what());
  }
  std::vector<pipeline::Layer> layers = gpt_pipeline_layers(model);
  std::vector<std::string> names;
  for (const auto& l : layers) names.push_back(l.name);
  std::unique_ptr<pipeline::PipelineEngine> pipe;
  try {
    pipe = std::make_unique<pipeline::PipelineEngine>(std::move(layers), gpt_loss, cfg, grid.pp,
                                                      grid.dp);
  } catch (const std::invalid_argument& e) {
    throw ConfigError(path + ": " + e.what());
  }
  const Engine& engine = pipe->engine();
  const Config& c = engine.config();  // batch sizes resolved for the data-parallel size
  const int rank = world->rank(), world_size = world->size();
  const int64_t micro = c.train_micro_batch_size_per_gpu;
  const int64_t ga = c.gradient_accumulation_steps;
  const int dp_size = grid.dp->size();
  BatchLoader loader(a.data, DistributedSampler(a.data->size(), grid.dp_rank, dp_size, cfg.seed),
                     micro);
  if (rank == 0) {
    std::printf(
        "zero-train: %s (%lld parameters), %d ranks (%s) on %s, ZeRO stage %d, %s, pipeline "
        "%s, micro-batch %lld x %lld micro-batches x %d data-parallel ranks = %lld sequences "
        "of %lld tokens, data: %s\n",
        a.preset.c_str(), (long long)a.model.num_params(), world_size, grid.describe().c_str(),
        a.device.str().c_str(), engine.stage(),
        c.bf16 ? "bf16" : (c.fp16.enabled ? "fp16" : "fp32"), c.pipeline.schedule.c_str(),
        (long long)micro, (long long)ga, dp_size, (long long)c.train_batch_size,
        (long long)a.seq_len, a.data->describe().c_str());
    const auto& b = pipe->bounds();
    for (int s = 0; s + 1 < static_cast<int>(b.size()); ++s)
      std::printf("pipeline: stage %d holds layers %d..%d (%s .. %s)\n", s, b[s], b[s + 1] - 1,
                  names[b[s]].c_str(), names[b[s + 1] - 1].c_str());
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
  if (resume != "false" && latest_checkpoint_tag(save_dir + "/stage0").empty() &&
      !checkpoint_dirs(save_dir).empty())
    throw ConfigError(path + ": trainer.resume: " + save_dir +
                      " holds a save of a run without a pipeline; a pipeline resumes pipelined "
                      "saves (save_dir/stage<s>/) only: resume it with pipeline.stages: 1, or "
                      "give another trainer.save_dir");
  // Stage 0's directory names the newest save whatever P wrote it (a later stage's may hold an
  // older one, or none): every rank asks it, so all resume or none.
  if (resume != "false" &&
      !(resume == "auto" && latest_checkpoint_tag(save_dir + "/stage0").empty())) {
    const std::string want = resume == "true" || resume == "auto" ? "" : resume;
    const std::string tag = pipe->load_checkpoint(save_dir, want);
    start_step = engine.stats().optimizer_steps;
    if (rank == 0) {
      std::printf("checkpoint: loaded %s/stage*/%s (step %lld)\n", save_dir.c_str(), tag.c_str(),
                  (long long)start_step);
      const pipeline::PipelineSaveLayout saved = pipeline::read_pipeline_save(save_dir, tag);
      if (saved.stages != cfg.pipeline.stages || saved.bounds != pipe->bounds()) {
        std::string b;
        for (size_t i = 0; i < saved.bounds.size(); ++i)
          b += (i ? "," : "") + std::to_string(saved.bounds[i]);
        std::printf(
            "checkpoint: resharded the save of pipeline.stages %d (bounds %s) to "
            "pipeline.stages %d\n",
            saved.stages, b.c_str(), cfg.pipeline.stages);
      }
    }
    for (int64_t i = 0; i < start_step * ga; ++i) loader.next();
  }

  MetricsLog metrics(rank == 0 ? cfg.extra_string("trainer.metrics_file") : "");
  const double tokens_per_step = static_cast<double>(c.train_batch_size * a.seq_len);
  double first_loss = 0, last_loss = 0;
  const auto t0 = Clock::now();
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
    const float loss = pipe->train_batch(inputs, targets);
    StepRecord rec;
    rec.step = step + 1;
    rec.total_steps = a.steps;
    rec.loss = loss;
    rec.lr = engine.lr();
    rec.skipped = !pipe->last_step_applied();
    // The global norm (every stage's), settled: on a GPU stats() holds the previous step's until
    // the next step (the loss's read above already waited for the device).
    rec.grad_norm = engine.settled_stats().last_grad_norm;
    rec.loss_scale = engine.loss_scale();
    rec.step_s = std::chrono::duration<double>(Clock::now() - start).count();
    rec.forward_s = rec.step_s;  // one train_batch: forward and backward interleave
    rec.tokens_per_s = tokens_per_step / rec.step_s;
    rec.eta_s = std::chrono::duration<double>(Clock::now() - t0).count() /
                static_cast<double>(rec.step - start_step) *
                static_cast<double>(a.steps - rec.step);
    rec.memory_bytes = engine.memory_report().measured.total();
    if (step == start_step) first_loss = loss;
    last_loss = loss;
    metrics.write(rec);
    if (save_interval > 0 && rec.step % save_interval == 0) {
      pipe->save_checkpoint(save_dir, "", keep_last);
      if (rank == 0)
        std::printf("checkpoint: saved %s/stage*/step%lld\n", save_dir.c_str(),
                    (long long)rec.step);
    }
    const bool log = rec.step % c.steps_per_print == 0 || step == 0 || rec.step == a.steps;
    if (rank == 0 && log) {
      std::printf("%s\n", format_progress(rec).c_str());
      std::fflush(stdout);
    }
  }
  if (rank == 0) std::printf("done: loss %.4f -> %.4f\n", first_loss, last_loss);
  return 0;
}

}  // namespace zero::examples
