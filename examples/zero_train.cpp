// zero-train: trains the example GPT on the built-in synthetic corpus with the ZeRO engine.
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
#include <fstream>
#include <iostream>
#include <vector>

#include "gpt.hpp"
#include "synthetic_data.hpp"
#include "zero/zero.hpp"

namespace po = boost::program_options;
using namespace zero;
using namespace zero::examples;

namespace {

Config::Extension trainer_keys() {
  using T = Config::Extension::Type;
  Config::Extension ext;
  ext.section = "trainer";
  ext.keys = {
      {"model", T::kString, "small", "GPT preset: tiny, small, gpt-25m, gpt-50m, gpt-100m, ..."},
      {"steps", T::kInt, "100", "optimizer steps to train"},
      {"seq_len", T::kInt, "64", "tokens per sample"},
      {"data", T::kString, "synthetic", "synthetic (the built-in corpus)"},
  };
  return ext;
}

std::string json_breakdown(const MemoryBreakdown& b) {
  char buf[256];
  std::snprintf(buf, sizeof buf,
                "{\"params\": %lld, \"grads\": %lld, \"master\": %lld, \"optimizer\": %lld, "
                "\"comm_buffers\": %lld, \"total\": %lld}",
                (long long)b.params, (long long)b.grads, (long long)b.master,
                (long long)b.optimizer, (long long)b.comm_buffers, (long long)b.total());
  return buf;
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
  const GptConfig mc = gpt_preset(cfg.extra_string("trainer.model"));
  const int64_t steps = cfg.extra_int("trainer.steps");
  const int64_t seq = cfg.extra_int("trainer.seq_len");
  if (cfg.extra_string("trainer.data") != "synthetic") {
    throw ConfigError(config_path + ": trainer.data: only 'synthetic' is built in");
  }
  if (seq > mc.max_seq || seq < 1) {
    throw ConfigError(config_path + ": trainer.seq_len " + std::to_string(seq) +
                      " must be in [1, " + std::to_string(mc.max_seq) + "] for this model");
  }

  at::manual_seed(cfg.seed);
  Gpt model(mc);
  Engine engine = initialize(model, cfg);
  const Config& c = engine.config();  // batch sizes resolved for the world size
  const int rank = engine.rank(), world = engine.world_size();
  const int64_t micro = c.train_micro_batch_size_per_gpu;
  const int64_t ga = c.gradient_accumulation_steps;
  SyntheticCorpus corpus(mc.vocab, cfg.seed);

  auto reports = engine.gather_memory_reports();
  if (rank == 0) {
    std::printf(
        "zero-train: %s (%lld parameters), %d ranks, ZeRO stage %d, %s, micro-batch %lld "
        "x accumulation %lld x %d ranks = %lld sequences of %lld tokens\n",
        cfg.extra_string("trainer.model").c_str(), (long long)mc.num_params(), world,
        engine.stage(), c.bf16 ? "bf16" : "fp32", (long long)micro, (long long)ga, world,
        (long long)c.train_batch_size, (long long)seq);
    std::printf("%s", format_memory_reports(reports).c_str());
    std::fflush(stdout);
  }

  double final_loss = NAN, first_loss = NAN;
  std::vector<double> step_seconds;
  auto t0 = std::chrono::steady_clock::now();
  auto last = t0;
  for (int64_t step = 0; step < steps; ++step) {
    const auto step_start = std::chrono::steady_clock::now();
    double loss_sum = 0;
    for (int64_t m = 0; m < ga; ++m) {
      // Rows of the global batch are dealt out so ranks never share a sample.
      const int64_t first = ((step * ga + m) * world + rank) * micro;
      auto [x, y] = corpus.batch(first, micro, seq);
      at::Tensor loss = model->loss(x, y);
      loss_sum += loss.item<double>();
      engine.backward(loss);
      engine.step();
    }
    const double loss = engine.all_reduce_mean(loss_sum / ga);
    step_seconds.push_back(
        std::chrono::duration<double>(std::chrono::steady_clock::now() - step_start).count());
    if (step == 0) first_loss = loss;
    final_loss = loss;
    const bool log = (step + 1) % c.steps_per_print == 0 || step == 0 || step + 1 == steps;
    if (rank == 0 && log) {
      auto now = std::chrono::steady_clock::now();
      const double dt = std::chrono::duration<double>(now - last).count();
      const double elapsed = std::chrono::duration<double>(now - t0).count();
      const int64_t done = step + 1;
      const double tokens = static_cast<double>(c.train_batch_size * seq) *
                            (step == 0 ? 1 : std::min<int64_t>(c.steps_per_print, done));
      std::printf("step %5lld/%lld  loss %.4f  lr %.3e  grad_norm %.3f  tokens/s %.0f  eta %.0fs\n",
                  (long long)done, (long long)steps, loss, engine.lr(),
                  engine.stats().last_grad_norm, tokens / std::max(dt, 1e-9),
                  elapsed / done * (steps - done));
      std::fflush(stdout);
      last = now;
    }
  }

  at::Tensor flat = engine.flat_parameters();
  const double checksum = flat.sum().item<double>();
  const double norm = flat.norm().item<double>();
  if (rank == 0) {
    std::printf("done: loss %.4f -> %.4f (corpus entropy %.4f), parameter L2 norm %.6f\n",
                first_loss, final_loss, corpus.entropy(), norm);
  }
  // The first step pays for allocations and gloo connection set-up: leave it out of the median.
  std::vector<double> timed(step_seconds.begin() + (step_seconds.size() > 1 ? 1 : 0),
                            step_seconds.end());
  std::sort(timed.begin(), timed.end());
  const double median_step = timed.empty() ? NAN : timed[timed.size() / 2];
  if (rank == 0 && !summary_path.empty()) {
    std::ofstream out(summary_path);
    if (!out) throw std::runtime_error("cannot write --summary-json file '" + summary_path + "'");
    out.precision(17);
    out << "{\n  \"world_size\": " << world << ",\n  \"stage\": " << engine.stage()
        << ",\n  \"steps\": " << steps << ",\n  \"model\": \"" << cfg.extra_string("trainer.model")
        << "\",\n  \"num_params\": " << mc.num_params() << ",\n  \"first_loss\": " << first_loss
        << ",\n  \"final_loss\": " << final_loss << ",\n  \"param_checksum\": " << checksum
        << ",\n  \"param_norm\": " << norm << ",\n  \"step_seconds_median\": " << median_step
        << ",\n  \"comm_wait_seconds\": " << engine.stats().comm_wait_seconds
        << ",\n  \"seq_len\": " << seq << ",\n  \"train_batch_size\": " << c.train_batch_size
        << ",\n  \"memory\": [";
    for (size_t r = 0; r < reports.size(); ++r) {
      out << (r ? ",\n" : "\n") << "    {\"rank\": " << r
          << ", \"measured\": " << json_breakdown(reports[r].measured)
          << ", \"predicted\": " << json_breakdown(reports[r].predicted) << "}";
    }
    out << "\n  ]\n}\n";
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    // c10::Error carries a C++ backtrace after the message: the first line is the useful part.
    std::string msg = e.what();
    if (dynamic_cast<const c10::Error*>(&e) != nullptr) {
      msg = static_cast<const c10::Error&>(e).what_without_backtrace();
    }
    const char* rank = std::getenv("RANK");
    std::fprintf(stderr, "zero-train%s%s: error: %s\n", rank ? " rank " : "", rank ? rank : "",
                 msg.c_str());
    return 1;
  }
}
