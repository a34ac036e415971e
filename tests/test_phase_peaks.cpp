// Peak memory through the whole run, read from the allocator (PeakCpuAllocator: every CPU
// storage counted, the peak kept): initialize, the first step, the second (where the buckets
// switch to the first pass's arrival order), a steady step, checkpoint save and load. Each
// phase's peak must stay within the steady model states plus two buckets per rank (plus the
// activations a step makes): DeepSpeed and FSDP move no optimizer state after start-up, and a
// transient of a whole second copy of the states is what decides a run's peak.
//
// The model is a LLaMA block as transformers registers it (attention, MLP, then the two norms):
// laid out in reverse registration order, each block's input norm comes first in the layout but
// its gradient arrives after q/k/v, so the buckets do not fill in layout order.
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <map>
#include <mutex>
#include <string>
#include <thread>

#include <unistd.h>

#include "support/peak_allocator.hpp"
#include "support/thread_group.hpp"
#include "zero/engine.hpp"
#include "zero/models/gpt.hpp"

namespace zero::testing {
namespace {

using models::Gpt;
using models::GptConfig;

constexpr int kWorld = 2;
constexpr int64_t kBucket = 40'000;  // elements: several buckets per block
constexpr int kSteps = 3;

GptConfig model_shape() {
  GptConfig c;
  c.vocab = 128;
  c.dim = 128;
  c.layers = 2;
  c.heads = 4;
  c.max_seq = 16;
  c.tied = false;
  return c;  // ~0.56 M parameters; the largest, the MLP's 128 x 512 matrices
}
constexpr int64_t kLargestParam = 128 * 512;

struct Case {
  bool bf16;
  bool offload;
  bool checkpointing;
};

std::string case_name(const ::testing::TestParamInfo<Case>& info) {
  const Case& c = info.param;
  return std::string(c.bf16 ? "bf16" : "fp32") + (c.offload ? "_offload" : "") +
         (c.checkpointing ? "_checkpointing" : "");
}

struct DropGrad : torch::autograd::PostAccumulateGradHook {
  void operator()(const torch::autograd::Variable& p) override {
    const_cast<torch::autograd::Variable&>(p).mutable_grad().reset();
  }
};

class PhasePeaks : public ::testing::TestWithParam<Case> {};

TEST_P(PhasePeaks, EveryPhaseStaysWithinSteadyStatesPlusTwoBuckets) {
  const Case c = GetParam();
  PeakCpuAllocator& alloc = PeakCpuAllocator::get();
  Config cfg;
  cfg.zero_optimization.stage = 2;
  cfg.zero_optimization.reduce_bucket_size = kBucket;
  // The parameters' all-gather keeps this many elements in flight (DeepSpeed's meaning); its
  // default, 5e8, would let every bucket's gather staging be in flight at once.
  cfg.zero_optimization.allgather_bucket_size = kBucket;
  cfg.zero_optimization.offload_optimizer.enabled = c.offload;
  cfg.zero_optimization.offload_optimizer.threads = 1;
  cfg.train_micro_batch_size_per_gpu = 2;
  cfg.optimizer.type = "AdamW";
  cfg.optimizer.lr = 1e-3;
  cfg.bf16 = c.bf16;
  const std::string dir =
      (std::filesystem::temp_directory_path() /
       ("zero_phase_peaks_" + case_name({c, 0}) + "_" + std::to_string(::getpid())))
          .string();

  std::atomic<int64_t> user_param_bytes{0};
  int64_t before = 0, steady = 0;
  std::atomic<int64_t> activations{0};   // summed over ranks, see below
  std::map<std::string, int64_t> peaks;  // phase -> process-wide peak, bytes in use
  std::vector<std::string> phases;
  run_ranks(kWorld, [&](std::shared_ptr<comm::Group> group) {
    const int r = group->rank();
    // The rank threads share torch's global generator: each draws from its own instead (the
    // module's own initialisation is overwritten; initialize broadcasts rank 0's anyway).
    Gpt model(model_shape());
    if (c.checkpointing) apply_activation_checkpointing(model, {true, false, 1});
    {
      at::NoGradGuard no_grad;
      auto init = at::detail::createCPUGenerator(7);
      for (auto& p : model->parameters()) p.copy_(at::randn(p.sizes(), init) * 0.02);
    }
    auto gen = at::detail::createCPUGenerator(100 + r);
    std::vector<at::Tensor> x, y;
    for (int s = 0; s < kSteps + 1; ++s) {
      x.push_back(at::randint(model_shape().vocab, {2, 16}, gen, at::kLong));
      y.push_back(at::randint(model_shape().vocab, {2, 16}, gen, at::kLong));
    }
    for (const auto& p : model->parameters()) user_param_bytes += p.nbytes();

    // The activations a step makes, measured on the model itself before the engine exists: the
    // peak of one plain forward and backward whose parameter gradients are dropped as they are
    // made (what the engine does with them once they are in its buckets).
    for (const auto& p : model->parameters()) {
      torch::autograd::impl::set_post_acc_grad_hooks(p, std::make_unique<DropGrad>());
    }
    // One rank at a time (how two ranks' peaks overlap is up to the scheduler); their sum
    // bounds the ranks' peaks together.
    for (int turn = 0; turn < kWorld; ++turn) {
      group->barrier("reference turn");
      if (r != turn) continue;
      const int64_t start = settled_in_use();
      alloc.reset_peak();
      model->loss(x.back(), y.back()).backward();
      activations += alloc.peak() - start;
    }
    for (const auto& p : model->parameters()) {
      torch::autograd::impl::set_post_acc_grad_hooks(p, nullptr);
    }
    group->barrier("reference end");
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
      if (r == 0) {
        peaks[name] = alloc.peak();
        phases.push_back(name);
      }
    };
    std::unique_ptr<Engine> engine;
    phase("initialize",
          [&] { engine = std::make_unique<Engine>(initialize(model.ptr(), cfg, group)); });
    for (int s = 0; s < kSteps; ++s) {
      const std::string name = s == 0   ? "first step"
                               : s == 1 ? "second step (bucket order)"
                                        : "steady step";
      phase(name, [&] {
        engine->backward(model->loss(x[s], y[s]));
        engine->step();
      });
    }
    group->barrier("steady");
    if (r == 0) steady = settled_in_use();
    group->barrier("steady read");
    phase("checkpoint save", [&] { engine->save_checkpoint(dir, "t"); });
    phase("checkpoint load", [&] { engine->load_checkpoint(dir, "t"); });
  });
  std::filesystem::remove_all(dir);

  // The user's parameters are gone once initialize returns: what the run holds beyond `base`
  // is the engine's.
  const int64_t base = before - user_param_bytes.load();
  const int64_t states = steady - base;
  // A bucket holds at most reduce_bucket_size - 1 elements plus the parameter that closes it,
  // 4 bytes each (fp32 masters, states and gradients; bf16 ones take half).
  const int64_t two_buckets = kWorld * 2 * (kBucket + kLargestParam) * 4;
  std::printf("%s: steady states %.2f MiB, two buckets x %d ranks %.2f MiB, activations %.2f MiB\n",
              case_name({c, 0}).c_str(), states / 1048576.0, kWorld, two_buckets / 1048576.0,
              activations.load() / 1048576.0);
  ASSERT_GT(states, 0);
  for (const std::string& name : phases) {
    const bool step = name.find("step") != std::string::npos;
    const int64_t bound = states + two_buckets + (step ? activations.load() : 0);
    const int64_t peak = peaks[name] - base;
    std::printf("  %-28s peak %.2f MiB = %.2fx steady states (bound %.2f MiB)\n", name.c_str(),
                peak / 1048576.0, static_cast<double>(peak) / static_cast<double>(states),
                bound / 1048576.0);
    EXPECT_LE(peak, bound) << name << ": " << (peak - states) / 1048576.0
                           << " MiB above the steady states";
  }
}

INSTANTIATE_TEST_SUITE_P(DtypesOffloadCheckpointing, PhasePeaks,
                         ::testing::Values(Case{false, false, false}, Case{true, false, false},
                                           Case{false, true, false}, Case{true, true, false},
                                           Case{false, false, true}, Case{true, false, true},
                                           Case{false, true, true}, Case{true, true, true}),
                         case_name);

}  // namespace
}  // namespace zero::testing
