// zero-train: trains the example GPT with the ZeRO engine, on the built-in synthetic corpus, a
// text file (bytes) or a pre-tokenized uint16 .bin file.
//
//   torchrun --no-python --nproc-per-node 2 build/examples/zero-train \
//       --config configs/zero2.yaml --summary-json out/summary.json
#include <ATen/ATen.h>
#include <torch/nn/module.h>
#include <boost/program_options.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <vector>

#include "data.hpp"
#include "gpt.hpp"
#include "hf_llama.hpp"
#include "metrics.hpp"
#include "train_summary.hpp"
#include "zero/checkpoint_io.hpp"
#include "zero/device.hpp"
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
      {"data", T::kString, "synthetic", "synthetic, text:PATH (bytes) or bin:PATH (uint16)"},
      {"activation_checkpointing", T::kBool, "false",
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

int run(int argc, char** argv) {
  po::options_description desc("zero-train options");
  std::string config_path, summary_path;
  std::vector<std::string> sets;
  desc.add_options()("help,h", "show this help")("config", po::value(&config_path)->required(),
                                                 "YAML or DeepSpeed JSON config file")(
      "set", po::value(&sets)->composing(), "override a key: --set zero_optimization.stage=1")(
      "summary-json", po::value(&summary_path), "rank 0 writes a JSON summary here");
  po::variables_map vm;
  po::store(po::parse_command_line(argc, argv, desc), vm);
  if (vm.count("help")) {
    std::cout << desc << "\n";
    return 0;
  }
  po::notify(vm);

  const auto ext = trainer_keys();
  Config cfg = Config::from_file(config_path, sets, &ext);
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

  at::manual_seed(cfg.seed);
  Gpt model(mc);
  // Every rank reads the weights (ZeRO-1/2 replicate parameters), each tensor alone.
  if (!hf_dir.empty()) load_hf_llama(*model, hf_dir);
  model->to(device);
  CheckpointPolicy policy;
  policy.enabled = cfg.extra_bool("trainer.activation_checkpointing");
  policy.cpu_offload = cfg.extra_bool("activation_checkpointing.cpu_checkpointing");
  if (policy.cpu_offload && !policy.enabled) {
    throw ConfigError(config_path +
                      ": activation_checkpointing.cpu_checkpointing offloads what checkpointing "
                      "keeps; also set trainer.activation_checkpointing: true");
  }
  apply_activation_checkpointing(model, policy);
  Engine engine = initialize(model, cfg);
  const Config& c = engine.config();  // batch sizes resolved for the world size
  const int rank = engine.rank(), world = engine.world_size();
  const int64_t micro = c.train_micro_batch_size_per_gpu;
  const int64_t ga = c.gradient_accumulation_steps;
  BatchLoader loader(data, DistributedSampler(data->size(), rank, world, cfg.seed), micro);

  const auto reports = engine.gather_memory_reports();
  const std::string dev_name = device_name(device);
  double peak = cfg.extra_float("trainer.peak_tflops") * 1e12;
  if (peak <= 0) peak = known_peak_flops(dev_name);
  if (rank == 0) {
    std::printf(
        "zero-train: %s (%lld parameters), %d ranks on %s, ZeRO stage %d, %s%s, micro-batch "
        "%lld x accumulation %lld x %d ranks = %lld sequences of %lld tokens, data: %s\n",
        preset.c_str(), (long long)mc.num_params(), world, dev_name.c_str(), engine.stage(),
        c.bf16 ? "bf16" : (c.fp16.enabled ? "fp16" : "fp32"),
        policy.enabled ? (policy.cpu_offload ? ", checkpointing + CPU offload" : ", checkpointing")
                       : "",
        (long long)micro, (long long)ga, world, (long long)c.train_batch_size, (long long)seq,
        data->describe().c_str());
    std::printf("%s", format_memory_reports(reports).c_str());
    std::fflush(stdout);
  }

  // Checkpoints. Resuming replays the loader to the saved step, so the run sees the batches the
  // interrupted one would have seen next (the same global batches on another world size).
  const std::string save_dir = cfg.extra_string("trainer.save_dir");
  const int64_t save_interval = cfg.extra_int("trainer.save_interval");
  const int keep_last = static_cast<int>(cfg.extra_int("trainer.keep_last"));
  const std::string resume = cfg.extra_string("trainer.resume");
  if ((save_interval > 0 || resume != "false") && save_dir.empty()) {
    throw ConfigError(config_path +
                      ": trainer.save_interval and trainer.resume need a "
                      "trainer.save_dir");
  }
  auto report_io = [&](const char* verb, const std::string& tag, double seconds) {
    if (rank != 0) return;
    uintmax_t bytes = 0;  // the checkpoint's files, shared by the ranks that wrote or read them
    for (const auto& f : std::filesystem::directory_iterator(save_dir + "/" + tag)) {
      bytes += f.file_size();
    }
    const double mb = static_cast<double>(bytes) / world / 1e6;
    std::printf("checkpoint: %s %s/%s in %.3f s: %.1f MB per rank, %.1f MB/s per rank\n", verb,
                save_dir.c_str(), tag.c_str(), seconds, mb, mb / std::max(seconds, 1e-9));
    std::fflush(stdout);
  };
  int64_t start_step = 0;
  if (resume != "false" && !(resume == "auto" && latest_checkpoint_tag(save_dir).empty())) {
    const auto t = Clock::now();
    const std::string tag =
        engine.load_checkpoint(save_dir, resume == "true" || resume == "auto" ? "" : resume);
    report_io("loaded", tag, since(t));
    start_step = engine.stats().optimizer_steps;
    for (int64_t i = 0; i < start_step * ga; ++i) loader.next();
  }

  MetricsLog metrics(rank == 0 ? cfg.extra_string("trainer.metrics_file") : "");
  const double flops_token = flops_per_token(mc, seq);
  const double tokens_per_step = static_cast<double>(c.train_batch_size * seq);
  TrainSummary sum;
  const auto t0 = Clock::now();
  for (int64_t step = start_step; step < steps; ++step) {
    const auto step_start = Clock::now();
    StepRecord rec;
    double loss_sum = 0;
    const double comm_before = engine.stats().comm_wait_seconds;
    for (int64_t m = 0; m < ga; ++m) {
      auto t = Clock::now();
      auto batch = loader.next();
      rec.data_s += since(t);
      t = Clock::now();
      at::Tensor loss = model->loss(batch.tokens.to(device), batch.targets.to(device));
      loss_sum += loss.item<double>();  // also waits for the forward pass to finish
      rec.forward_s += since(t);
      t = Clock::now();
      engine.backward(loss);
      rec.backward_s += since(t);
      t = Clock::now();
      engine.step();
      rec.optimizer_s += since(t);
    }
    rec.comm_exposed_s = engine.stats().comm_wait_seconds - comm_before;
    rec.backward_s -= rec.comm_exposed_s;
    rec.loss = engine.all_reduce_mean(loss_sum / static_cast<double>(ga));
    rec.step_s = since(step_start);
    rec.step = step + 1;
    rec.total_steps = steps;
    rec.lr = engine.lr();
    rec.grad_norm = engine.stats().last_grad_norm;
    rec.loss_scale = engine.loss_scale();
    rec.tokens_per_s = tokens_per_step / rec.step_s;
    rec.mfu = peak > 0 ? rec.tokens_per_s * flops_token / (peak * world) : -1;
    rec.eta_s = since(t0) / static_cast<double>(rec.step) * static_cast<double>(steps - rec.step);
    const DeviceMemory dm = device_memory(device);
    rec.memory_bytes = dm.available ? dm.peak_allocated : reports[0].measured.total();
    sum.add(rec);
    metrics.write(rec);
    const bool log = rec.step % c.steps_per_print == 0 || step == 0 || rec.step == steps;
    if (rank == 0 && log) {
      std::printf("%s\n", format_progress(rec).c_str());
      if (step == 0 && model->offloader) {
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
    if (save_interval > 0 && rec.step % save_interval == 0) {
      const auto t = Clock::now();
      engine.save_checkpoint(save_dir, "", keep_last);
      report_io("saved", "step" + std::to_string(engine.stats().optimizer_steps), since(t));
    }
  }

  sum.finish(engine, *model, policy, data->describe(), loader.wait_seconds());
  if (rank == 0) {
    std::printf("done: loss %.4f -> %.4f, parameter L2 norm %.6f, median step %.3f s\n",
                sum.first_loss, sum.final_loss, sum.param_norm, sum.median_step_s());
    if (!summary_path.empty()) sum.write_json(summary_path, engine, preset, mc, seq, reports);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return zero::run_main("zero-train", [&] { return run(argc, argv); });
}
