// zero-train: trains the example GPT with the ZeRO engine, on the built-in synthetic corpus, a
// text file (bytes) or a pre-tokenized uint16 .bin file.
//
//   torchrun --no-python --nproc-per-node 2 build/examples/zero-train \
//       --config configs/zero2.yaml --summary-json out/summary.json
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <torch/nn/module.h>
#include <boost/program_options.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>
#include <vector>

#include "data.hpp"
#include "file_checks.hpp"
#include "gpt.hpp"
#include "hf_llama.hpp"
#include "launcher_check.hpp"
#include "metrics.hpp"
#include "monitor.hpp"
#include "phase_peaks.hpp"
#include "tp_gpt.hpp"
#include "tp_trainer.hpp"
#include "train_summary.hpp"
#include "utilisation.hpp"
#include "zero/auto_strategy.hpp"
#include "zero/checkpoint_io.hpp"
#include "zero/device.hpp"
#include "zero/memory_plan.hpp"
#include "zero/tensor_parallel.hpp"
#include "zero/time_plan.hpp"
#include "zero/zero.hpp"

namespace po = boost::program_options;
using namespace zero;
using namespace zero::examples;

namespace {

using Clock = std::chrono::steady_clock;
double since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

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

int run(int argc, char** argv) {
  po::options_description desc("zero-train options");
  std::string config_path, summary_path;
  std::vector<std::string> sets;
  desc.add_options()("help,h", "show this help")("config", po::value(&config_path)->required(),
                                                 "YAML or DeepSpeed JSON config file")(
      "set", po::value(&sets)->composing(), "override a key: --set zero_optimization.stage=1")(
      "summary-json", po::value(&summary_path), "rank 0 writes a JSON summary here")(
      "device-memory", po::value<std::string>(),
      "per-rank memory budget for \"auto\" values (24GB, 24GiB): sets "
      "zero_optimization.auto_device_memory");
  po::variables_map vm;
  const po::parsed_options parsed = po::command_line_parser(argc, argv).options(desc).run();
  // A word without an option name was a mistake (a missing --set, a stray path): refuse it
  // instead of training with the config it was meant to change.
  for (const auto& o : parsed.options) {
    if (o.position_key >= 0 || o.string_key.empty()) {
      throw ConfigError("unexpected argument '" +
                        (o.original_tokens.empty() ? std::string() : o.original_tokens[0]) +
                        "': every argument is an option (--config FILE, --set key=value, "
                        "--summary-json FILE); see --help");
    }
  }
  po::store(parsed, vm);
  if (vm.count("help")) {
    std::cout << desc << "\n";
    return 0;
  }
  po::notify(vm);

  // A config is small: a device or a FIFO given by mistake must not be read without end.
  require_input_file(config_path, "--config", kMaxConfigBytes);
  if (vm.count("device-memory")) {
    sets.push_back("zero_optimization.auto_device_memory=" + vm["device-memory"].as<std::string>());
  }
  const auto ext = trainer_keys();
  Config cfg = Config::from_file(config_path, sets, &ext);
  check_trainer_ranges(cfg, config_path);
  const std::string init_from = cfg.extra_string("trainer.init_from");
  if (!init_from.empty() && init_from.rfind("hf:", 0) != 0) {
    throw ConfigError(config_path + ": trainer.init_from '" + init_from +
                      "': use hf:DIR (a Hugging Face LlamaForCausalLM directory)");
  }
  const std::string hf_dir = init_from.empty() ? "" : init_from.substr(3);
  const std::string preset = hf_dir.empty() ? cfg.extra_string("trainer.model") : init_from;
  const GptConfig mc = hf_dir.empty() ? gpt_preset(preset) : hf_llama_config(hf_dir);
  const int64_t steps = cfg.extra_int("trainer.steps");
  const int64_t seq = cfg.extra_int("trainer.seq_len");
  if (seq > mc.max_seq || seq < 1) {
    throw ConfigError(config_path + ": trainer.seq_len " + std::to_string(seq) +
                      " must be in [1, " + std::to_string(mc.max_seq) + "] for model " + preset);
  }
  std::shared_ptr<const Dataset> data =
      open_dataset(cfg.extra_string("trainer.data"), seq, mc.vocab, cfg.seed);

  const std::string want = cfg.extra_string("trainer.device");
  if (want != "auto" && want != "cpu" && want != "cuda") {
    throw ConfigError(config_path + ": trainer.device '" + want + "': use cpu, cuda or auto");
  }
  if (want == "cuda" && !at::hasCUDA()) {
    throw ConfigError(config_path +
                      ": trainer.device is cuda but this build or machine has no "
                      "CUDA device; use trainer.device: cpu");
  }
  const char* local_rank = std::getenv("LOCAL_RANK");
  const c10::Device device =
      (want == "cuda" || (want == "auto" && at::hasCUDA()))
          ? c10::Device(c10::kCUDA,
                        static_cast<c10::DeviceIndex>(local_rank ? std::atoi(local_rank) : 0))
          : c10::Device(c10::kCPU);
  set_current_device(device);

  const int tp_size = cfg.tensor_parallel.autotp_size;
  const int64_t rss_before_model = rss_bytes();
  at::manual_seed(cfg.seed);
  // The generator as the plain model's constructor finds it: a tensor-parallel model draws the
  // very same weights from a copy of it (init_like_gpt), one full tensor at a time, without the
  // full model.
  const at::Generator init_gen = at::detail::getDefaultCPUGenerator().clone();
  Gpt model{nullptr};
  if (tp_size == 1 || !hf_dir.empty()) {
    model = Gpt(mc);
    // Every rank reads the weights (ZeRO-1/2 replicate parameters), each tensor alone; under
    // tensor parallelism each then keeps its part.
    if (!hf_dir.empty()) load_hf_llama(*model, hf_dir);
    if (tp_size == 1) model->to(device);
  }
  CheckpointPolicy policy;
  policy.cpu_offload = cfg.extra_bool("activation_checkpointing.cpu_checkpointing");
  std::string ckpt = cfg.extra_string("trainer.activation_checkpointing");
  for (char& ch : ckpt) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  if (ckpt != "true" && ckpt != "false" && ckpt != "auto") {
    throw ConfigError(config_path + ": trainer.activation_checkpointing '" + ckpt +
                      "': use true, false or auto");
  }
  // "auto" values (stage, micro-batch, checkpointing) are planned for this model's shape
  // before anything is sharded; the group is made here so the ranks can agree on a budget.
  auto group = process_group_from_env(cfg, device.type());
  // Tensor parallelism: the tp x dp groups (tensor-parallel ranks adjacent, Megatron's order),
  // then each rank keeps its part of the weights tp 1 starts from (the HF model read above, or
  // the seed's draws), so tp T starts from exactly the weights tp 1 does.
  tensor_parallel::Groups layout;
  Groups engine_groups_of_run{group};
  TpGpt tp_model{nullptr};
  if (tp_size > 1) {
    layout = tensor_parallel_layout(cfg, group, mc, seq, config_path);
    tp_model = TpGpt(layout.tp, mc, cfg.tensor_parallel.sequence_parallel);
    engine_groups_of_run = engine_groups(cfg, layout, tp_model->placements(), config_path);
    if (model) {
      tp_model->load_full(*model);
      model = Gpt(nullptr);
    } else {
      init_like_gpt(*tp_model, init_gen);
    }
    tp_model->to(device);
  }
  torch::nn::Module& trained = tp_model ? static_cast<torch::nn::Module&>(*tp_model) : *model;
  AutoTarget target;
  target.shape = {mc.layers, mc.dim, mc.heads, mc.ffn_dim(), mc.vocab, mc.tied};
  // Under tensor parallelism the planner sees each rank's share of the parameters (its
  // activation model knows nothing of the split: it over-counts them).
  target.num_params = mc.num_params() / tp_size;
  target.seq_len = seq;
  target.cpu_offload = policy.cpu_offload;
  if (ckpt != "auto") target.checkpointing = ckpt == "true";
  target.device = device;
  if (device.is_cuda()) {
    for (const auto& p : trained.parameters()) target.held_bytes += p.nbytes();
  }
  resolve_auto(cfg, target, *engine_groups_of_run.dp);
  policy.enabled = target.checkpointing.value_or(false);
  if (policy.cpu_offload && !policy.enabled && ckpt != "auto") {
    throw ConfigError(config_path +
                      ": activation_checkpointing.cpu_checkpointing offloads what checkpointing "
                      "keeps; also set trainer.activation_checkpointing: true");
  }
  if (tp_model) {
    if (policy.cpu_offload) {
      throw ConfigError(config_path +
                        ": activation_checkpointing.cpu_checkpointing is not implemented for the "
                        "tensor-parallel model; set it false (checkpointing itself works)");
    }
    tp_model->checkpointing = policy;
  } else {
    apply_activation_checkpointing(model, policy);
  }
  std::shared_ptr<torch::nn::Module> trained_ptr =
      tp_model ? std::shared_ptr<torch::nn::Module>(tp_model.ptr()) : model.ptr();
  Engine engine = initialize(trained_ptr, cfg, engine_groups_of_run);
  const int64_t startup_peak = peak_rss_bytes(), after_initialize = rss_bytes();
  PhasePeaks phases(device);          // closes "initialize": the allocator's peak so far
  const Config& c = engine.config();  // batch sizes resolved for the data-parallel size
  // rank and world: every process (rank 0 prints and writes); the engine's: the data-parallel
  // group, which the data is split over (the tensor-parallel ranks of a group share a batch).
  const int rank = group->rank(), world = group->size();
  const int dp_rank = engine.rank(), dp_size = engine.world_size();
  const int64_t micro = c.train_micro_batch_size_per_gpu;
  const int64_t ga = c.gradient_accumulation_steps;
  BatchLoader loader(data, DistributedSampler(data->size(), dp_rank, dp_size, cfg.seed), micro);
  const std::string layout_text = tp_model ? " (" + layout.describe() + ")" : "";

  const auto reports = engine.gather_memory_reports();
  const std::string dev_name = device_name(device);
  double peak = cfg.extra_float("trainer.peak_tflops") * 1e12;
  if (peak <= 0) peak = known_peak_flops(dev_name);
  if (rank == 0) {
    std::printf(
        "zero-train: %s (%lld parameters), %d ranks%s on %s, ZeRO stage %d%s, %s%s, micro-batch "
        "%lld x accumulation %lld x %d %sranks = %lld sequences of %lld tokens, data: %s\n",
        preset.c_str(), (long long)mc.num_params(), world, layout_text.c_str(), dev_name.c_str(),
        engine.stage(),
        c.zero_optimization.offload_optimizer.enabled ? " (optimizer offloaded to CPU)" : "",
        c.bf16 ? "bf16" : (c.fp16.enabled ? "fp16" : "fp32"),
        policy.enabled ? (policy.cpu_offload ? ", checkpointing + CPU offload" : ", checkpointing")
                       : "",
        (long long)micro, (long long)ga, dp_size, tp_model ? "data-parallel " : "",
        (long long)c.train_batch_size, (long long)seq, data->describe().c_str());
    std::printf("%s", format_memory_reports(reports).c_str());
    std::fflush(stdout);
  }

  // Checkpoints. Resuming replays the loader to the saved step, so the run sees the batches the
  // interrupted one would have seen next (the same global batches on another world size).
  // Under tensor parallelism each tensor-parallel rank's engine checkpoints its own shards
  // (parameters under their full names, each rank its part) over its data-parallel group, in
  // save_dir/tp<r>/, recording where its blocks lie in the whole tensors. A resume reads the
  // newest save wherever it lies (save_dir/ of a run without tensor parallelism, save_dir/tp*/
  // of one with it), under whatever autotp_size saved it: each rank reads the blocks covering
  // its own (checkpoint_dirs, Engine::load_checkpoint(dirs)). zero-consolidate --checkpoint
  // save_dir puts the blocks together.
  const std::string save_root = cfg.extra_string("trainer.save_dir");
  const std::string save_dir = tp_model && !save_root.empty()
                                   ? save_root + "/tp" + std::to_string(layout.tp_rank())
                                   : save_root;
  const int64_t save_interval = cfg.extra_int("trainer.save_interval");
  const int keep_last = static_cast<int>(cfg.extra_int("trainer.keep_last"));
  const std::string resume = cfg.extra_string("trainer.resume");
  if ((save_interval > 0 || resume != "false") && save_dir.empty()) {
    throw ConfigError(config_path +
                      ": trainer.save_interval and trainer.resume need a "
                      "trainer.save_dir");
  }
  // The directories a resume reads (this rank's own first: its random-generator states), and
  // whether there is anything to resume from.
  auto resume_dirs = [&](const std::string& tag) {
    std::vector<std::string> dirs = checkpoint_dirs(save_root, tag);
    if (dirs.empty()) return std::vector<std::string>{save_dir};  // load_checkpoint says why
    const auto own = std::find(dirs.begin(), dirs.end(), save_dir);
    if (own != dirs.end()) std::rotate(dirs.begin(), own, own + 1);
    return dirs;
  };
  auto nothing_to_resume = [&] { return save_root.empty() || checkpoint_dirs(save_root).empty(); };
  auto report_io = [&](const char* verb, const std::string& dir, const std::string& tag,
                       double seconds) {
    if (rank != 0) return;
    uintmax_t bytes = 0;  // the checkpoint's files, shared by the ranks that wrote or read them
    for (const auto& f : std::filesystem::directory_iterator(dir + "/" + tag)) {
      bytes += f.file_size();
    }
    const double mb = static_cast<double>(bytes) / dp_size / 1e6;
    std::printf("checkpoint: %s %s/%s in %.3f s: %.1f MB per rank, %.1f MB/s per rank\n", verb,
                dir.c_str(), tag.c_str(), seconds, mb, mb / std::max(seconds, 1e-9));
    std::fflush(stdout);
  };
  // Outputs are checked before training time is spent; every rank learns whether any failed.
  std::unique_ptr<MonitorWriter> monitors;  // tensorboard, csv_monitor: rank 0 writes
  {
    std::string problem;
    try {
      if (!save_dir.empty()) require_writable_dir(save_dir, "trainer.save_dir");
      if (rank == 0) {
        const std::string metrics_path = cfg.extra_string("trainer.metrics_file");
        if (!metrics_path.empty()) require_writable_file(metrics_path, "trainer.metrics_file");
        if (!summary_path.empty()) require_writable_file(summary_path, "--summary-json");
        monitors = std::make_unique<MonitorWriter>(monitor_config(c, "tensorboard"),
                                                   monitor_config(c, "csv_monitor"), true);
        if (monitors->enabled()) std::printf("monitors: %s\n", monitors->describe().c_str());
      }
      if (resume == "auto" && nothing_to_resume()) {
        refuse_orphaned_checkpoints(save_dir, config_path);
      }
    } catch (const std::exception& e) {
      problem = e.what();
    }
    // Over every process, not the engine's group (one data-parallel group under tensor
    // parallelism): reduce_from_region is an all-reduce over any group.
    const double failed =
        tensor_parallel::reduce_from_region(
            at::full({1}, problem.empty() ? 0.0 : 1.0, at::TensorOptions().device(device)), group)
            .item<double>();
    if (!problem.empty()) throw ConfigError(problem);
    if (failed > 0) {
      throw ConfigError(
          "another rank refused its start-up checks (its error names the file); "
          "stopping");
    }
  }
  int64_t start_step = 0;
  if (resume != "false" && !(resume == "auto" && nothing_to_resume())) {
    const auto t = Clock::now();
    const std::vector<std::string> dirs =
        resume_dirs(resume == "true" || resume == "auto" ? "" : resume);
    const std::string tag =
        engine.load_checkpoint(dirs, resume == "true" || resume == "auto" ? "" : resume);
    report_io("loaded", dirs.front(), tag, since(t));
    const size_t saved_tp = dirs.front() == save_root ? 1 : dirs.size();
    if (rank == 0 && saved_tp != static_cast<size_t>(tp_size)) {
      std::printf("checkpoint: resharded the save of autotp_size %zu to autotp_size %d\n", saved_tp,
                  tp_size);
      std::fflush(stdout);
    }
    start_step = engine.stats().optimizer_steps;
    for (int64_t i = 0; i < start_step * ga; ++i) loader.next();
  }

  MetricsLog metrics(rank == 0 ? cfg.extra_string("trainer.metrics_file") : "");
  const double flops_token = flops_per_token(mc, seq);
  const double tokens_per_step = static_cast<double>(c.train_batch_size * seq);
  TrainSummary sum;
  sum.record_startup(engine, startup_peak, after_initialize);
  const auto t0 = Clock::now();
  UtilisationMeter utilisation(device);  // rank 0's device, per print interval
  // Losses stay on the device until a print step: then the window's losses are averaged over
  // ranks in one collective and read once, so the host never waits for the device mid-window.
  std::vector<StepRecord> window;
  std::vector<at::Tensor> window_losses;
  const bool cuda = device.is_cuda();
  // A launcher's death goes unnoticed at most this long (a quarter of comm_timeout_s leaves the
  // rest for the last checkpoint; an all-reduce of two numbers and a host sync every 2 s are a
  // negligible share of the training time).
  const double comm_timeout_s = std::chrono::duration<double>(c.comm_timeout).count();
  LauncherCheck launcher_check(std::min(2.0, comm_timeout_s / 4), c.steps_per_print);
  auto last_check = Clock::now();
  int64_t checked_step = start_step;
  for (int64_t step = start_step; step < steps; ++step) {
    const auto step_start = Clock::now();
    StepRecord rec;
    at::Tensor loss_sum = at::zeros({}, at::TensorOptions().device(device));
    const double comm_before = engine.stats().comm_wait_seconds;
    for (int64_t m = 0; m < ga; ++m) {
      auto t = Clock::now();
      auto batch = loader.next();
      rec.data_s += since(t);
      phases.begin();
      t = Clock::now();
      // Pinned host memory lets the copies run asynchronously to the host; a pageable
      // host-to-device copy would synchronise the stream.
      at::Tensor tokens = cuda ? batch.tokens.pin_memory() : batch.tokens;
      at::Tensor targets = cuda ? batch.targets.pin_memory() : batch.targets;
      tokens = tokens.to(device, /*non_blocking=*/cuda);
      targets = targets.to(device, cuda);
      at::Tensor loss = tp_model ? tp_model->loss(tokens, targets) : model->loss(tokens, targets);
      loss_sum += loss.detach().to(at::kFloat);
      rec.forward_s += since(t);
      phases.end(Phase::kForward);
      phases.begin();
      t = Clock::now();
      engine.backward(loss);
      rec.backward_s += since(t);
      phases.end(Phase::kBackward);
      phases.begin();
      t = Clock::now();
      engine.step();
      rec.optimizer_s += since(t);
      phases.end(Phase::kStep);
    }
    rec.comm_exposed_s = engine.stats().comm_wait_seconds - comm_before;
    rec.allgather_wait_s = engine.stats().allgather_wait_seconds;
    rec.backward_s -= rec.comm_exposed_s;
    rec.step_s = since(step_start);
    rec.step = step + 1;
    rec.total_steps = steps;
    rec.lr = engine.lr();
    rec.tokens_per_s = tokens_per_step / rec.step_s;
    rec.mfu = peak > 0 ? rec.tokens_per_s * flops_token / (peak * world) : -1;
    rec.eta_s = since(t0) / static_cast<double>(rec.step) * static_cast<double>(steps - rec.step);
    window.push_back(rec);
    window_losses.push_back((loss_sum / static_cast<double>(ga)).reshape({1}));
    // Save on any step (the save reads the last step's outcome itself), log at print steps.
    const bool log = rec.step % c.steps_per_print == 0 || step == 0 || rec.step == steps;
    const bool saved = save_interval > 0 && rec.step % save_interval == 0;
    if (saved) {
      const auto t = Clock::now();
      phases.begin();
      engine.save_checkpoint(save_dir, "", keep_last);
      phases.end(Phase::kSave);
      report_io("saved", save_dir, "step" + std::to_string(engine.stats().optimizer_steps),
                since(t));
    }
    // Ranks whose launcher died would train on unsupervised (nobody would stop or restart
    // them): they agree to stop at the same step, after a last checkpoint when saving is on.
    // Agreeing costs an all-reduce and a host sync: at print steps, and often enough between
    // them to stop within a few seconds (LauncherCheck), not at every step.
    if (launcher_check.due(rec.step, log)) {
      const at::Tensor agreed =
          engine
              .all_reduce_mean(
                  at::tensor({launcher_exited() ? 1.0 : 0.0,
                              since(last_check) / static_cast<double>(rec.step - checked_step)},
                             at::kDouble))
              .cpu();
      launcher_check.checked(rec.step, agreed[1].item<double>());
      last_check = Clock::now();
      checked_step = rec.step;
      if (agreed[0].item<double>() > 0) {
        std::string what = "stopping at step " + std::to_string(rec.step);
        if (save_interval > 0) {
          if (!saved) engine.save_checkpoint(save_dir, "", keep_last);
          what += " after saving " + save_dir + "/step" +
                  std::to_string(engine.stats().optimizer_steps) +
                  " (continue with trainer.resume: auto)";
        }
        throw LaunchError(
            "the launcher" +
            (launcher_pid() > 0 ? " (pid " + std::to_string(launcher_pid()) + ")" : std::string()) +
            " exited during training; " + what);
      }
    }
    if (!log) continue;
    // Print step: the one read-back of the window (losses, the norm and scale of this step).
    const at::Tensor losses = engine.all_reduce_mean(at::cat(window_losses)).cpu();
    const double grad_norm = engine.settled_stats().last_grad_norm;
    const bool skipped = engine.settled_stats().last_step_skipped;
    const double loss_scale = engine.loss_scale();
    const DeviceMemory dm = device_memory(device);
    const double busy = utilisation.sample();
    for (size_t i = 0; i < window.size(); ++i) {
      StepRecord& r = window[i];
      r.loss = losses[static_cast<int64_t>(i)].item<double>();
      r.grad_norm = grad_norm;  // known at print steps; earlier records repeat it
      r.skipped = skipped && i + 1 == window.size();
      r.loss_scale = loss_scale;
      r.utilisation = busy;
      // The allocator's peak restarts with each phase: the run's is the phases'.
      r.memory_bytes = dm.available ? std::max(dm.peak_allocated, phases.overall())
                                    : reports[0].measured.total();
      sum.add(r);
      metrics.write(r);
      if (monitors) monitors->write(r, r.step * c.train_batch_size);  // DeepSpeed's x: samples
    }
    rec = window.back();
    window.clear();
    window_losses.clear();
    if (rank == 0) {
      std::printf("%s\n", format_progress(rec).c_str());
      if (step == 0 && model && model->offloader) {
        // What checkpointing kept between forward and backward went to host memory.
        const OffloadStats os = model->offloader->stats();
        std::printf(
            "activations: %s of block inputs offloaded to host memory at peak, %s left "
            "on the device; %lld blocks offloaded, %lld prefetched\n",
            format_bytes(os.peak_host_bytes).c_str(), format_bytes(os.device_bytes_kept).c_str(),
            (long long)os.offloaded, (long long)os.prefetched);
      }
      std::fflush(stdout);
    }
  }

  RunShape run;
  run.stage = engine.stage();
  run.world_size = world;
  run.grad_accum = ga;
  run.micro_batch = micro;
  run.checkpointing = policy.enabled;
  run.cpu = device.is_cpu();
  run.memory_baseline = device.is_cuda() ? 0 : rss_before_model;
  {
    const auto& q = c.zero_optimization.quantized_gradients;
    const Dtype comm = c.communication_data_type.value_or(c.param_dtype());
    run.comm_bits = q.enabled ? q.bits : comm == Dtype::kFloat32 ? 32 : 16;
  }
  {
    PlanInput pi;  // the planner's bucket order is the engine's
    pi.shape = {mc.layers, mc.dim, mc.heads, mc.ffn_dim(), mc.vocab, mc.tied};
    pi.num_params = mc.num_params();
    pi.bucket_elements = c.zero_optimization.reduce_bucket_size;
    run.buckets = static_cast<int64_t>(bucket_sizes(pi).size());
  }
  {
    // The planner's figure for each phase, beside the allocator's (the summary's phase_peaks).
    PlanInput pp = plan_input_for(c, mc.num_params(), world);
    pp.shape = {mc.layers, mc.dim, mc.heads, mc.ffn_dim(), mc.vocab, mc.tied};
    pp.seq_len = seq;
    pp.micro_batch = micro;
    const int stage = engine.stage();
    const int64_t states = plan_model_states(pp, stage).total() - plan_host_states(pp, stage);
    const Recompute rc = !policy.enabled      ? Recompute::kNone
                         : policy.cpu_offload ? Recompute::kCheckpointOffload
                                              : Recompute::kCheckpoint;
    const ActivationEstimate a = predict_activations(pp, rc);
    sum.record_phases(engine, phases,
                      {plan_startup_peak(pp, stage), states + a.blocks + a.head + a.loss,
                       states + a.peak(), states, states});
  }
  const DeviceMemory dm = device_memory(device);
  run.memory_budget = dm.total > 0 ? dm.total : c.zero_optimization.auto_device_memory;
  sum.finish(engine, trained, model ? model->offloader.get() : nullptr, policy, data->describe(),
             loader.wait_seconds(), run);
  if (rank == 0) {
    std::printf("done: loss %.4f -> %.4f, parameter L2 norm %.6f, median step %.3f s\n",
                sum.first_loss, sum.final_loss, sum.param_norm, sum.median_step_s());
    std::printf("%s\n", sum.verdict.line().c_str());
    if (monitors && monitors->enabled()) {
      std::printf(
          "monitors: %lld steps handed to the writer thread, %.1f us per step on the "
          "training thread\n",
          (long long)monitors->records(),
          1e6 * monitors->enqueue_seconds() / std::max<int64_t>(1, monitors->records()));
    }
    if (!summary_path.empty()) sum.write_json(summary_path, engine, preset, mc, seq, reports);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return zero::run_main("zero-train", [&] { return run(argc, argv); });
}
