// zero-train's trainer, the phases before the first step: set-up, build, outputs, resume
// (trainer.hpp). The loop and the summary: trainer_loop.cpp.
#include "trainer.hpp"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <torch/nn/module.h>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <sstream>

#include "checkpoint_agreement.hpp"
#include "file_checks.hpp"
#include "startup_agreement.hpp"
#include "tp_trainer.hpp"
#include "zero/auto_strategy.hpp"
#include "zero/checkpoint_io.hpp"
#include "zero/comm_overlap.hpp"
#include "zero/device.hpp"
#include "zero/errors.hpp"
#include "zero/host_counting.hpp"
#include "zero/models/hf_llama.hpp"
#include "zero/tensor_parallel.hpp"
#include "zero/tensor_parallel/overlap.hpp"
#include "zero/zero.hpp"

namespace zero::examples {

Config::Extension trainer_keys() {
  using T = Config::Extension::Type;
  Config::Extension ext;
  ext.section = "trainer";
  ext.keys = {
      {"model", T::kString, "small", "GPT preset: tiny, small, gpt-25m, gpt-50m, gpt-100m, ..."},
      {"init_from", T::kString, "",
       "pretrained weights to start from: hf:DIR, a Hugging Face LlamaForCausalLM directory "
       "(its config.json sets the model's shape; trainer.model is then ignored)"},
      {"steps", T::kInt, "100", "optimizer steps to train"},
      {"seq_len", T::kInt, "64", "tokens per sample"},
      {"data", T::kString, "synthetic",
       "synthetic, text:PATH (bytes), bin:PATH (uint16, or an llm.c token file) or "
       "megatron:PREFIX (a Megatron-LM / GPT-NeoX indexed dataset, PREFIX.idx + PREFIX.bin)"},
      {"activation_checkpointing", T::kString, "false",
       "true, false or auto (the planner decides, see zero_optimization.auto_device_memory): "
       "recompute each block in backward; activation_checkpointing.cpu_checkpointing also "
       "moves the kept block inputs to host memory"},
      {"metrics_file", T::kString, "", "rank 0 appends one JSON line per optimizer step here"},
      {"device", T::kString, "auto",
       "cpu, cuda (GPU LOCAL_RANK) or auto: cuda when this build and machine have one"},
      {"peak_tflops", T::kFloat, "0",
       "peak FLOP/s per rank for MFU, in TFLOP/s; 0: from the accelerator's name"},
      {"save_dir", T::kString, "", "checkpoint directory (for save_interval and resume)"},
      {"save_interval", T::kInt, "0", "save a checkpoint every N optimizer steps (0 = off)"},
      {"keep_last", T::kInt, "0", "keep only the N newest checkpoints (0 = keep all)"},
      {"resume", T::kString, "false",
       "false, true (the tag save_dir/latest names), auto (latest if there is one), or a tag"},
  };
  return ext;
}

namespace {

constexpr uint64_t kMaxConfigBytes = 16u << 20;

// The key's value must be in [lo, hi]: a negative step count or interval is a typo, never a
// request.
void check_range(const Config& cfg, const std::string& source, const std::string& key, double lo,
                 double hi, const std::string& meaning) {
  const double v = cfg.extra_float(key);
  if (!(v >= lo && v <= hi)) {
    std::ostringstream os;
    os << source << ": " << key << " = " << v << " is out of range: " << meaning;
    throw ConfigError(os.str());
  }
}

void check_trainer_ranges(const Config& cfg, const std::string& source) {
  constexpr double kMax = 9.2e18;
  check_range(cfg, source, "trainer.steps", 0, kMax, "give the number of optimizer steps, >= 0");
  check_range(cfg, source, "trainer.seq_len", 1, kMax, "give the tokens per sample, >= 1");
  check_range(cfg, source, "trainer.save_interval", 0, kMax,
              "give the steps between checkpoints, or 0 for none");
  check_range(cfg, source, "trainer.keep_last", 0, 1e9,
              "give how many checkpoints to keep, or 0 to keep all");
  check_range(cfg, source, "trainer.peak_tflops", 0, 1e9,
              "give the accelerator's peak TFLOP/s, or 0 to look it up");
}

// resume: auto starts afresh only where no complete checkpoint exists; one that is complete but
// lost its `latest` pointer (a hand-cleaned directory, a copy) would otherwise be trained over.
void refuse_orphaned_checkpoints(const std::string& save_dir, const std::string& source) {
  std::error_code ec;
  if (!std::filesystem::is_directory(save_dir, ec)) return;
  std::string newest;
  int64_t newest_step = -1;
  for (const auto& e : std::filesystem::directory_iterator(save_dir, ec)) {
    if (!e.is_directory(ec) || !std::filesystem::exists(e.path() / "manifest.json", ec)) continue;
    try {
      const CheckpointInfo info = read_checkpoint_info(save_dir, e.path().filename().string());
      if (info.optimizer_steps > newest_step) {
        newest_step = info.optimizer_steps;
        newest = info.tag;
      }
    } catch (const std::exception&) {
      // Not a complete checkpoint (damaged or foreign): it does not block a fresh start.
    }
  }
  if (newest.empty()) return;
  throw ConfigError(source + ": trainer.resume is auto but " + save_dir +
                    "/latest is missing while " + save_dir + "/" + newest +
                    " is a complete checkpoint (step " + std::to_string(newest_step) +
                    "): set trainer.resume: " + newest +
                    " to continue from it, or give an empty trainer.save_dir to start afresh");
}

// The "auto" values HF's Trainer fills from the run (transformers' trainer_config_finalize:
// scheduler.params.total_num_steps from the run's optimizer steps), filled from zero-train's
// own settings. The batch sizes resolve in Config::resolve_batch; warmup_num_steps is not
// derivable (zero-train has no warmup setting of its own, HF's comes from --warmup_steps or
// --warmup_ratio), so it keeps the DeepSpeed default the config load noted.
void fill_run_autos(Config& cfg, int64_t steps) {
  SchedulerConfig& s = cfg.scheduler;
  if (!s.total_num_steps_auto || s.total_num_steps > 0) return;
  // A decaying schedule needs a positive horizon even for a run of no steps.
  s.total_num_steps = std::max<int64_t>(1, steps);
  cfg.warnings.push_back("zero: " + cfg.source +
                         ": 'scheduler.params.total_num_steps' is \"auto\": using " +
                         std::to_string(s.total_num_steps) + " (trainer.steps" +
                         (steps < 1 ? " is 0, and a decaying schedule needs at least 1"
                                    : ", the run's optimizer steps") +
                         ", as HF's Trainer fills it)");
  if (s.warmup_num_steps > s.total_num_steps) {
    cfg.warnings.push_back("zero: " + cfg.source + ": 'scheduler.params.warmup_num_steps' (" +
                           std::to_string(s.warmup_num_steps) +
                           ") exceeds 'scheduler.params.total_num_steps' (" +
                           std::to_string(s.total_num_steps) +
                           "): the run ends inside the warmup; set warmup_num_steps to the "
                           "warmup you want");
  }
}

}  // namespace

Trainer::~Trainer() = default;

Trainer::Trainer(const TrainerOptions& options) : options_(options) {
  const std::string& config_path = options_.config_path;
  // A config is small: a device or a FIFO given by mistake must not be read without end.
  require_input_file(config_path, "--config", kMaxConfigBytes);
  const auto ext = trainer_keys();
  cfg_ = Config::from_file(config_path, options_.sets, &ext);
  check_trainer_ranges(cfg_, config_path);
  const std::string init_from = cfg_.extra_string("trainer.init_from");
  if (!init_from.empty() && init_from.rfind("hf:", 0) != 0) {
    throw ConfigError(config_path + ": trainer.init_from '" + init_from +
                      "': use hf:DIR (a Hugging Face LlamaForCausalLM directory)");
  }
  hf_dir_ = init_from.empty() ? "" : init_from.substr(3);
  preset_ = hf_dir_.empty() ? cfg_.extra_string("trainer.model") : init_from;
  mc_ = hf_dir_.empty() ? models::gpt_preset(preset_) : models::hf_llama_config(hf_dir_);
  steps_ = cfg_.extra_int("trainer.steps");
  fill_run_autos(cfg_, steps_);
  seq_ = cfg_.extra_int("trainer.seq_len");
  if (seq_ > mc_.max_seq || seq_ < 1) {
    throw ConfigError(config_path + ": trainer.seq_len " + std::to_string(seq_) +
                      " must be in [1, " + std::to_string(mc_.max_seq) + "] for model " + preset_);
  }
  data_ = open_dataset(cfg_.extra_string("trainer.data"), seq_, mc_.vocab, cfg_.seed);

  const std::string want = cfg_.extra_string("trainer.device");
  if (want != "auto" && want != "cpu" && want != "cuda") {
    throw ConfigError(config_path + ": trainer.device '" + want + "': use cpu, cuda or auto");
  }
  if (want == "cuda" && !at::hasCUDA()) {
    throw ConfigError(config_path +
                      ": trainer.device is cuda but this build or machine has no "
                      "CUDA device; use trainer.device: cpu");
  }
  const char* local_rank = std::getenv("LOCAL_RANK");
  device_ = (want == "cuda" || (want == "auto" && at::hasCUDA()))
                ? c10::Device(c10::kCUDA,
                              static_cast<c10::DeviceIndex>(local_rank ? std::atoi(local_rank) : 0))
                : c10::Device(c10::kCPU);
  set_current_device(device_);
  // On CPU the summary's phase peaks come from counting every CPU storage (the host has no
  // allocator peak of its own); installed now, before the model, so that every training tensor
  // is counted. A hash-map insert per allocation, nothing per byte.
  if (device_.is_cpu()) HostCountingAllocator::get();
}

torch::nn::Module& Trainer::trained() {
  return tp_model_ ? static_cast<torch::nn::Module&>(*tp_model_) : *model_;
}

at::Tensor Trainer::loss(const at::Tensor& tokens, const at::Tensor& targets) {
  return tp_model_ ? tp_model_->loss(tokens, targets) : model_->loss(tokens, targets);
}

std::optional<PipelineTrainerArgs> Trainer::pipeline_args() const {
  if (cfg_.pipeline.stages <= 1) {
    const std::string save_dir = cfg_.extra_string("trainer.save_dir");
    if (cfg_.extra_string("trainer.resume") == "false" || save_dir.empty() ||
        checkpoint_dirs(save_dir + "/stage0").empty() || !checkpoint_dirs(save_dir).empty())
      return std::nullopt;
  }
  return PipelineTrainerArgs{
      cfg_,    options_.config_path, mc_, preset_, hf_dir_, data_, steps_, seq_,
      device_, options_.summary_path};
}

void Trainer::build() {
  const std::string& config_path = options_.config_path;
  const int tp_size = cfg_.tensor_parallel.autotp_size;
  rss_before_model_ = rss_bytes();
  at::manual_seed(cfg_.seed);
  // The generator as the plain model's constructor finds it: a tensor-parallel model draws the
  // very same weights from a copy of it (init_like_gpt), one full tensor at a time, without the
  // full model.
  const at::Generator init_gen = at::detail::getDefaultCPUGenerator().clone();
  if (tp_size == 1) {
    // Deferred (docs/start-up.md): built a block at a time with no weights held, then
    // zero::initialize fills what this rank keeps - at stage 3 its shard and the root unit, at
    // stages 0-2 the flat buffer once, in the compute dtype on the device - from the seed's
    // draws or from the HF files' slices. Bit for bit the eager build's weights.
    model_ = models::Gpt(mc_, Deferred{device_});
    started_deferred_ = true;
    initial_values_ =
        hf_dir_.empty() ? model_->initial_values() : models::hf_llama_values(*model_, hf_dir_);
  } else if (!hf_dir_.empty()) {
    model_ = models::Gpt(mc_);
    // Under tensor parallelism every rank reads the weights, each tensor alone, and then keeps
    // its part.
    models::load_hf_llama(*model_, hf_dir_);
  }
  policy_.cpu_offload = cfg_.extra_bool("activation_checkpointing.cpu_checkpointing");
  std::string ckpt = cfg_.extra_string("trainer.activation_checkpointing");
  for (char& ch : ckpt) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  if (ckpt != "true" && ckpt != "false" && ckpt != "auto") {
    throw ConfigError(config_path + ": trainer.activation_checkpointing '" + ckpt +
                      "': use true, false or auto");
  }
  // "auto" values (stage, micro-batch, checkpointing) are planned for this model's shape
  // before anything is sharded; the group is made here so the ranks can agree on a budget.
  world_ = process_group_from_env(cfg_, device_.type());
  // Tensor parallelism: the tp x dp groups (tensor-parallel ranks adjacent, Megatron's order),
  // then each rank keeps its part of the weights tp 1 starts from (the HF model read above, or
  // the seed's draws), so tp T starts from exactly the weights tp 1 does.
  Groups groups{world_};
  if (tp_size > 1) {
    layout_ = tensor_parallel_layout(cfg_, world_, mc_, seq_, config_path);
    // From the seed: deferred as at tp 1, each rank filling only what it keeps of its part (at
    // stage 3 its dp shard) from init_like_gpt's draws. From HF files: the full model read above.
    if (model_) {
      tp_model_ = models::TpGpt(layout_.tp, mc_, cfg_.tensor_parallel.sequence_parallel);
    } else {
      tp_model_ =
          models::TpGpt(layout_.tp, mc_, cfg_.tensor_parallel.sequence_parallel, Deferred{device_});
      initial_values_ = models::initial_values_like_gpt(*tp_model_, init_gen);
      started_deferred_ = true;
    }
    tensor_parallel::set_overlap_comm(*tp_model_, tensor_parallel_overlap_comm(cfg_));
    // open_dataset checked every token against the vocabulary: no per-micro-batch check (an
    // all-gather and a host read each in the embedding and the loss) on the hot path.
    tp_model_->set_check_inputs(false);
    groups = engine_groups(layout_, tp_model_->placements());
    if (model_) {
      tp_model_->load_full(*model_);
      model_ = models::Gpt(nullptr);
      tp_model_->to(device_);
    }
  }
  AutoTarget target;
  target.shape = {mc_.layers, mc_.dim, mc_.heads, mc_.ffn_dim(), mc_.vocab, mc_.tied, mc_.kv_heads};
  // Under tensor parallelism the planner splits the model as the layers do: each rank's shard
  // of the parameters (the norms whole) and its share of the activations.
  target.num_params = mc_.num_params();
  target.tensor_parallel = tp_size;
  if (tp_size > 1) target.tensor_parallel_group = layout_.tp;
  target.sequence_parallel = cfg_.tensor_parallel.sequence_parallel;
  target.announce = world_->rank() == 0;
  target.seq_len = seq_;
  target.cpu_offload = policy_.cpu_offload;
  if (ckpt != "auto") target.checkpointing = ckpt == "true";
  target.device = device_;
  if (device_.is_cuda()) {
    for (const auto& p : trained().parameters()) {
      if (!is_deferred(p)) target.held_bytes += p.nbytes();
    }
  }
  resolve_auto(cfg_, target, *groups.dp);
  policy_.enabled = target.checkpointing.value_or(false);
  if (policy_.cpu_offload && !policy_.enabled && ckpt != "auto") {
    throw ConfigError(config_path +
                      ": activation_checkpointing.cpu_checkpointing offloads what checkpointing "
                      "keeps; also set trainer.activation_checkpointing: true");
  }
  if (tp_model_) {
    if (policy_.cpu_offload) {
      throw ConfigError(config_path +
                        ": activation_checkpointing.cpu_checkpointing is not implemented for the "
                        "tensor-parallel model; set it false (checkpointing itself works)");
    }
    tp_model_->checkpointing = policy_;
  } else {
    models::apply_activation_checkpointing(model_, policy_);
  }
  std::shared_ptr<torch::nn::Module> trained_ptr =
      tp_model_ ? std::shared_ptr<torch::nn::Module>(tp_model_.ptr()) : model_.ptr();
  engine_.emplace(initialize(trained_ptr, cfg_, groups, initial_values_));
  initial_values_ = nullptr;  // the HF files' maps go with it
  startup_peak_ = peak_rss_bytes();
  after_initialize_ = rss_bytes();
  phases_.emplace(device_);             // closes "initialize": the allocator's peak so far
  const Config& c = engine_->config();  // batch sizes resolved for the data-parallel size
  // rank and world: every process (rank 0 prints and writes); the engine's: the data-parallel
  // group, which the data is split over (the tensor-parallel ranks of a group share a batch).
  rank_ = world_->rank();
  world_size_ = world_->size();
  dp_size_ = engine_->world_size();
  micro_ = c.train_micro_batch_size_per_gpu;
  ga_ = c.gradient_accumulation_steps;
  loader_.emplace(data_, DistributedSampler(data_->size(), engine_->rank(), dp_size_, cfg_.seed),
                  micro_);

  reports_ = engine_->gather_memory_reports();
  const std::string dev_name = device_name(device_);
  peak_flops_ = cfg_.extra_float("trainer.peak_tflops") * 1e12;
  if (peak_flops_ <= 0) peak_flops_ = known_peak_flops(dev_name);
  if (rank_ == 0) {
    const std::string layout_text =
        tp_model_
            ? " (" + layout_.describe() +
                  (cfg_.tensor_parallel.sequence_parallel ? ", sequence parallel" : "") +
                  (tensor_parallel_overlap_comm(cfg_) ? "" : ", tensor_parallel.overlap_comm off") +
                  ")"
            : "";
    std::printf(
        "zero-train: %s (%lld parameters), %d ranks%s on %s, ZeRO stage %d%s, %s%s, micro-batch "
        "%lld x accumulation %lld x %d %sranks = %lld sequences of %lld tokens, data: %s\n",
        preset_.c_str(), (long long)mc_.num_params(), world_size_, layout_text.c_str(),
        dev_name.c_str(), engine_->stage(),
        c.zero_optimization.offload_optimizer.enabled ? " (optimizer offloaded to CPU)" : "",
        c.bf16 ? "bf16" : (c.fp16.enabled ? "fp16" : "fp32"),
        policy_.enabled
            ? (policy_.cpu_offload ? ", checkpointing + CPU offload" : ", checkpointing")
            : "",
        (long long)micro_, (long long)ga_, dp_size_, tp_model_ ? "data-parallel " : "",
        (long long)c.train_batch_size, (long long)seq_, data_->describe().c_str());
    std::printf("%s", format_memory_reports(reports_).c_str());
    std::fflush(stdout);
  }
}

void Trainer::prepare_outputs() {
  const std::string& config_path = options_.config_path;
  const Config& c = engine_->config();
  // Checkpoints. Under tensor parallelism each tensor-parallel rank's engine checkpoints its own
  // shards (parameters under their full names, each rank its part) over its data-parallel group,
  // in save_dir/tp<r>/, recording where its blocks lie in the whole tensors. A resume reads the
  // newest save wherever it lies (save_dir/ of a run without tensor parallelism, save_dir/tp*/
  // of one with it), under whatever autotp_size saved it: each rank reads the blocks covering
  // its own (checkpoint_dirs, Engine::load_checkpoint(dirs)). zero-consolidate --checkpoint
  // save_dir puts the blocks together.
  save_root_ = cfg_.extra_string("trainer.save_dir");
  save_dir_ = tp_model_ && !save_root_.empty()
                  ? save_root_ + "/tp" + std::to_string(layout_.tp_rank())
                  : save_root_;
  save_interval_ = cfg_.extra_int("trainer.save_interval");
  keep_last_ = static_cast<int>(cfg_.extra_int("trainer.keep_last"));
  resume_ = cfg_.extra_string("trainer.resume");
  if ((save_interval_ > 0 || resume_ != "false") && save_dir_.empty()) {
    throw ConfigError(config_path +
                      ": trainer.save_interval and trainer.resume need a "
                      "trainer.save_dir");
  }
  // Outputs are checked before training time is spent; every rank learns whether any failed.
  std::string problem;
  try {
    if (!save_dir_.empty()) require_writable_dir(save_dir_, "trainer.save_dir");
    if (rank_ == 0) {
      const std::string metrics_path = cfg_.extra_string("trainer.metrics_file");
      if (!metrics_path.empty()) require_writable_file(metrics_path, "trainer.metrics_file");
      if (!options_.summary_path.empty()) {
        require_writable_file(options_.summary_path, "--summary-json");
      }
      monitors_ = std::make_unique<MonitorWriter>(monitor_config(c, "tensorboard"),
                                                  monitor_config(c, "csv_monitor"), true);
      if (monitors_->enabled()) std::printf("monitors: %s\n", monitors_->describe().c_str());
    }
    if (resume_ == "auto" && nothing_to_resume()) {
      refuse_orphaned_checkpoints(save_dir_, config_path);
    }
  } catch (const std::exception& e) {
    problem = e.what();
  }
  // Over every process, not the engine's group (one data-parallel group under tensor
  // parallelism).
  stop_unless_every_rank_passed(problem, device_, world_);
}

bool Trainer::nothing_to_resume() const {
  return save_root_.empty() || checkpoint_dirs(save_root_).empty();
}

void Trainer::resume() {
  // Resuming replays the loader to the saved step, so the run sees the batches the interrupted
  // one would have seen next (the same global batches on another world size).
  if (resume_ == "false" || (resume_ == "auto" && nothing_to_resume())) {
    return;
  }
  const auto t = Clock::now();
  const std::string want = resume_ == "true" || resume_ == "auto" ? "" : resume_;
  // The save's directories (this rank's own first: its random-generator states) and one tag for
  // every rank of the world: the newest complete in every tensor-parallel rank's directory, so
  // that a save cut short after some of them had published theirs resumes all from the older.
  const ResumePoint point = agree_resume_point(save_root_, want, save_dir_, device_, world_);
  const std::vector<std::string>& dirs = point.dirs;
  if (rank_ == 0 && !point.note.empty()) {
    std::printf("checkpoint: %s\n", point.note.c_str());
    std::fflush(stdout);
  }
  const std::string tag = engine_->load_checkpoint(dirs, point.tag);
  report_io("loaded", dirs.front(), tag, std::chrono::duration<double>(Clock::now() - t).count());
  const size_t saved_tp = dirs.front() == save_root_ ? 1 : dirs.size();
  const int tp_size = tp_model_ ? layout_.tp->size() : 1;
  if (rank_ == 0 && saved_tp != static_cast<size_t>(tp_size)) {
    std::printf("checkpoint: resharded the save of autotp_size %zu to autotp_size %d\n", saved_tp,
                tp_size);
    std::fflush(stdout);
  }
  start_step_ = engine_->stats().optimizer_steps;
  for (int64_t i = 0; i < start_step_ * ga_; ++i) loader_->next();
}

}  // namespace zero::examples
