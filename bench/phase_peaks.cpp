// Peak memory per phase of a run, from the allocator: the example GPT on N ranks (threads, each
// with its own gloo group, as the tests run them), every CPU storage counted by a wrapper around
// c10's CPU allocator (tests/support/peak_allocator). Phases: initialize, the first step, the
// second (where the engine switches to the first pass's arrival order), a steady step,
// checkpoint save and load. Prints one JSON object; bench/phase_peaks.py runs the matrix.
//
//   phase-peaks --model gpt-25m --ranks 4 --dtype bf16 --offload 1 --checkpointing 1
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <unistd.h>

#include "support/peak_allocator.hpp"
#include "support/thread_group.hpp"
#include "zero/engine.hpp"
#include "zero/models/gpt.hpp"

namespace {

using zero::testing::PeakCpuAllocator;

// The allocator's figure once gloo's threads let go of finished collectives' tensors.
int64_t settled_in_use() {
  const PeakCpuAllocator& a = PeakCpuAllocator::get();
  int64_t last = a.in_use();
  int same = 0;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(2);
  while (same < 2 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
    const int64_t now = a.in_use();
    same = now == last ? same + 1 : 0;
    last = now;
  }
  return last;
}

}  // namespace

int main(int argc, char** argv) {
  std::map<std::string, std::string> arg{
      {"--model", "gpt-25m"},   {"--ranks", "4"},       {"--dtype", "fp32"}, {"--offload", "0"},
      {"--checkpointing", "0"}, {"--bucket", "500000"}, {"--micro", "1"},    {"--seq", "128"}};
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!arg.count(argv[i])) {
      std::fprintf(stderr,
                   "phase-peaks: unknown option %s (known: --model --ranks --dtype "
                   "--offload --checkpointing --bucket --micro --seq)\n",
                   argv[i]);
      return 2;
    }
    arg[argv[i]] = argv[i + 1];
  }
  const int world = std::stoi(arg["--ranks"]);
  const int64_t micro = std::stoll(arg["--micro"]), seq = std::stoll(arg["--seq"]);
  const zero::models::GptConfig shape = zero::models::gpt_preset(arg["--model"]);
  zero::Config cfg;
  cfg.zero_optimization.stage = 2;
  cfg.zero_optimization.reduce_bucket_size = std::stoll(arg["--bucket"]);
  cfg.zero_optimization.offload_optimizer.enabled = arg["--offload"] == "1";
  cfg.zero_optimization.offload_optimizer.threads = 1;
  cfg.train_micro_batch_size_per_gpu = micro;
  cfg.optimizer.type = "AdamW";
  cfg.optimizer.lr = 1e-4;
  cfg.bf16 = arg["--dtype"] == "bf16";
  const std::string dir =
      (std::filesystem::temp_directory_path() / ("zero_phase_peaks_" + std::to_string(::getpid())))
          .string();

  PeakCpuAllocator& alloc = PeakCpuAllocator::get();
  std::atomic<int64_t> user_param_bytes{0};
  int64_t before = 0, steady = 0;
  std::vector<std::pair<std::string, int64_t>> peaks;
  zero::testing::run_ranks(
      world,
      [&](std::shared_ptr<zero::comm::Group> group) {
        const int r = group->rank();
        // The rank threads share torch's global generator: each draws from its own instead.
        zero::models::Gpt model(shape);
        if (arg["--checkpointing"] == "1") apply_activation_checkpointing(model, {true, false, 1});
        for (const auto& p : model->parameters()) user_param_bytes += p.nbytes();
        auto gen = at::detail::createCPUGenerator(100 + r);
        std::vector<at::Tensor> x, y;
        for (int s = 0; s < 3; ++s) {
          x.push_back(at::randint(shape.vocab, {micro, seq}, gen, at::kLong));
          y.push_back(at::randint(shape.vocab, {micro, seq}, gen, at::kLong));
        }
        group->barrier("start");
        if (r == 0) before = settled_in_use();
        auto phase = [&](const std::string& name, const std::function<void()>& fn) {
          group->barrier(name + ": start");
          if (r == 0) {
            settled_in_use();
            alloc.reset_peak();
          }
          group->barrier(name + ": go");
          fn();
          group->barrier(name + ": end");
          if (r == 0) peaks.emplace_back(name, alloc.peak());
        };
        std::unique_ptr<zero::Engine> engine;
        phase("initialize", [&] {
          engine = std::make_unique<zero::Engine>(zero::initialize(model.ptr(), cfg, group));
        });
        const char* names[] = {"first step", "second step", "steady step"};
        for (int s = 0; s < 3; ++s) {
          phase(names[s], [&] {
            engine->backward(model->loss(x[s], y[s]));
            engine->step();
          });
        }
        group->barrier("steady");
        if (r == 0) steady = settled_in_use();
        group->barrier("steady read");
        phase("checkpoint save", [&] { engine->save_checkpoint(dir, "t"); });
        phase("checkpoint load", [&] { engine->load_checkpoint(dir, "t"); });
      },
      std::chrono::minutes(30));
  std::filesystem::remove_all(dir);

  // What the run holds beyond the process before it, less the user's parameters initialize
  // replaced: the engine's (and, in a step, the activations').
  const int64_t base = before - user_param_bytes.load();
  std::printf(
      "{\"model\": \"%s\", \"ranks\": %d, \"dtype\": \"%s\", \"offload\": %s, "
      "\"checkpointing\": %s, \"steady_states\": %lld, \"peaks\": {",
      arg["--model"].c_str(), world, arg["--dtype"].c_str(),
      arg["--offload"] == "1" ? "true" : "false", arg["--checkpointing"] == "1" ? "true" : "false",
      static_cast<long long>(steady - base));
  for (size_t i = 0; i < peaks.size(); ++i) {
    std::printf("%s\"%s\": %lld", i ? ", " : "", peaks[i].first.c_str(),
                static_cast<long long>(peaks[i].second - base));
  }
  std::printf("}}\n");
  return 0;
}
