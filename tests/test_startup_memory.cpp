// Start-up memory per rank (issue 33, docs/start-up.md), measured by allocators, eager against
// deferred: the example GPT built and zero::initialize'd on real gloo thread-ranks, N = 2 and 4.
// The bound is the planner's formula (zero/plan, from the model's shape alone, not the engine):
// the model states initialize leaves (own shard, the root unit whole, the declared bucket
// buffers) plus one unit, plus per-bucket padding. Device: the fake accelerator's allocator, per
// rank (tests/support/fake_device.hpp). Host: every CPU storage counted (HostCountingAllocator)
// with the ranks on the CPU, summed over the ranks of the process.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <mutex>
#include <string>
#include <vector>

#include "support/fake_device.hpp"
#include "support/thread_group.hpp"
#include "support/tiny_net.hpp"
#include "zero/deferred_init.hpp"
#include "zero/engine.hpp"
#include "zero/host_counting.hpp"
#include "zero/memory_plan.hpp"
#include "zero/models/gpt.hpp"

namespace zero::testing {
namespace {

// Elements per gradient bucket: a unit (a block, 164k elements) fits one.
constexpr int64_t kBucket = 1 << 18;

models::GptConfig model() {
  models::GptConfig c;
  c.vocab = 256;
  c.dim = 128;
  c.layers = 8;
  c.heads = 4;
  c.ffn = 256;
  c.max_seq = 32;
  return c;
}

PlanInput plan_of(const models::GptConfig& c, int world, int param_bytes, int states) {
  PlanInput in;
  in.shape = {c.layers, c.dim, c.heads, c.ffn_dim(), c.vocab, c.tied, c.kv_heads};
  in.num_params = c.num_params();
  in.world_size = world;
  in.param_bytes = param_bytes;
  in.comm_bytes = param_bytes;
  in.grad_accum_bytes = param_bytes;
  in.optimizer_states = states;
  in.bucket_elements = kBucket;
  in.param_persistence_threshold = 0;
  return in;
}

int64_t largest_unit(const PlanInput& in) {
  int64_t unit = 0;
  for (const auto& u : stage3_units(in)) {
    int64_t n = 0;
    for (int64_t p : u) n += p;
    unit = std::max(unit, n);
  }
  return unit;
}

// The per-bucket padding: at most 64 elements per rank and bucket, in each of the parameters,
// the master, the optimizer states and the gradient shard.
int64_t pad_bytes(const models::GptConfig& c, int world, int param_bytes, int states) {
  const PlanInput in = plan_of(c, world, param_bytes, states);
  int64_t buckets = 0;
  for (const auto& u : stage3_units(in)) {
    int64_t n = 0;
    for (int64_t p : u) n += p;
    buckets += n / kBucket + 1;
  }
  return buckets * 64 * world * (param_bytes + 4 + 4 * states + 4);
}

// The model states initialize leaves (own shard of master, gradients and optimizer states; the
// root unit whole at stage 3, every parameter below it; the declared bucket buffers; at stage 3
// no gradient shard and no bucket buffer, which backward allocates), the padding (at most 64
// elements per rank and bucket), and at stage 3 one unit more.
int64_t bound_bytes(const models::GptConfig& c, int world, int param_bytes, int states, int stage) {
  const PlanInput in = plan_of(c, world, param_bytes, states);
  const int64_t pad = pad_bytes(c, world, param_bytes, states);
  const int64_t unit = stage == 3 ? largest_unit(in) * param_bytes : 0;
  return plan_model_states(in, stage).total() + unit + pad;
}

std::string mib(int64_t b) {
  char s[32];
  std::snprintf(s, sizeof s, "%.2f MiB", static_cast<double>(b) / (1 << 20));
  return s;
}

// The planner's start-up figure (plan_startup_peak) is the measured peak of each rank, within
// what it leaves out: the padding above, the model's buffers (RoPE tables, on the device in both
// builds) and the engine's scalars (a one-element placeholder per dtype and per released
// parameter, the loss scaler), a few KiB.
void expect_planned(const models::GptConfig& c, int world, int param_bytes, int states, int stage,
                    bool deferred, const std::vector<int64_t>& measured) {
  PlanInput in = plan_of(c, world, param_bytes, states);
  in.deferred_start = deferred;
  const int64_t planned = plan_startup_peak(in, stage);
  int64_t buffers = 0;
  for (const auto& b : models::GptImpl(c).buffers()) buffers += static_cast<int64_t>(b.nbytes());
  const int64_t scalars = 16 * 1024;
  const int64_t pad = pad_bytes(c, world, param_bytes, states);
  // The eager figure counts the largest fp32 staging bucket; the peak comes at the first bucket,
  // which may be smaller.
  const int64_t staging = deferred || param_bytes == 4 ? 0 : 4 * max_bucket_elements(in);
  for (size_t r = 0; r < measured.size(); ++r) {
    std::printf("stage %d %s N=%d rank %zu: measured %s, planned %s (%+lld B)\n", stage,
                deferred ? "deferred" : "eager", world, r, mib(measured[r]).c_str(),
                mib(planned).c_str(), static_cast<long long>(measured[r] - planned));
    EXPECT_GE(measured[r], planned - staging - scalars)
        << (deferred ? "deferred" : "eager") << " rank " << r;
    EXPECT_LE(measured[r], planned + pad + buffers + scalars)
        << (deferred ? "deferred" : "eager") << " rank " << r;
  }
}

struct StartupRun {
  std::vector<int64_t> peak;  // per rank (device), or [0]: every rank's together (host)
  std::vector<double> first_loss;
};

std::mutex build_mutex;  // the ranks share the global generator

// Builds the model (deferred or eagerly, then moved) and initialises the engine on `world`
// thread-ranks; the peak of the allocator over both, above what it held before. `sgd`: plain
// SGD (no optimizer state), else AdamW.
StartupRun start(int world, int stage, bool bf16, bool sgd, bool deferred, bool on_fake) {
  const models::GptConfig c = model();
  Config cfg = test_config(stage, 1, 1, 0.0, kBucket);
  cfg.zero_optimization.stage3.param_persistence_threshold = 0;
  cfg.bf16 = bf16;
  if (sgd) cfg.optimizer.type = "SGD";
  StartupRun run;
  run.peak.assign(world, 0);
  run.first_loss.assign(world, 0);
  HostCountingAllocator& host = HostCountingAllocator::get();
  const int64_t host_before = host.in_use();
  host.reset_peak();
  run_ranks(
      world,
      [&](std::shared_ptr<comm::Group> group) {
        const int r = group->rank();
        const c10::Device d = on_fake ? fake::device(r) : c10::Device(c10::kCPU);
        const int64_t before = on_fake ? fake::allocated_bytes(r) : 0;
        if (on_fake) fake::reset_peak(r);
        std::shared_ptr<models::GptImpl> gpt;
        InitialValues values;
        {
          std::lock_guard<std::mutex> lock(build_mutex);
          at::manual_seed(5);
          if (deferred) {
            gpt = std::make_shared<models::GptImpl>(c, Deferred{d});
            values = gpt->initial_values();
          } else {
            gpt = std::make_shared<models::GptImpl>(c);
            gpt->to(d);
          }
        }
        auto engine = initialize(gpt, cfg, group, values);
        if (on_fake) run.peak[r] = fake::peak_bytes(r) - before;
        // The host's counter is the process's: every rank waits between two collectives while
        // rank 0 reads it, so that none has begun the step.
        engine.all_reduce_mean(0.0);
        if (!on_fake && r == 0) run.peak = {host.peak() - host_before};
        engine.all_reduce_mean(0.0);
        // It trains: the first loss is the model's (every start-up gives the same).
        const at::Tensor tokens = at::arange(17, at::kLong).remainder(c.vocab).view({1, 17});
        const at::Tensor loss =
            gpt->loss(tokens.narrow(1, 0, 16).to(d), tokens.narrow(1, 1, 16).to(d));
        run.first_loss[r] = loss.item<double>();
        engine.backward(loss);
        engine.step();
      },
      std::chrono::seconds(120), on_fake ? fake::device().type() : c10::DeviceType::CPU);
  return run;
}

TEST(StartupMemory, Stage3DevicePeakIsOwnShardPlusOneUnit) {
  const models::GptConfig c = model();
  for (int world : {2, 4}) {
    const int64_t bound = bound_bytes(c, world, 4, 2, 3);
    const StartupRun eager = start(world, 3, false, false, false, true);
    const StartupRun deferred = start(world, 3, false, false, true, true);
    for (int r = 0; r < world; ++r) {
      std::printf("stage 3 fp32 AdamW N=%d rank %d: device peak eager %s, deferred %s; bound %s "
                  "(model %s)\n",
                  world, r, mib(eager.peak[r]).c_str(), mib(deferred.peak[r]).c_str(),
                  mib(bound).c_str(), mib(4 * c.num_params()).c_str());
      EXPECT_LE(deferred.peak[r], bound) << "N=" << world << " rank " << r;
      // The bound discriminates: the eager start-up holds the whole model on every rank.
      EXPECT_GT(eager.peak[r], bound) << "N=" << world << " rank " << r;
      EXPECT_EQ(deferred.first_loss[r], eager.first_loss[r]);
    }
    expect_planned(c, world, 4, 2, 3, true, deferred.peak);
    expect_planned(c, world, 4, 2, 3, false, eager.peak);
  }
}

TEST(StartupMemory, Stage2Bf16WritesTheFlatBufferOnceInTheComputeDtype) {
  // Stages 0-2 hold every parameter: the deferred peak is the model states initialize leaves
  // (bf16 parameters, the fp32 master shard, the gradient shard, the buckets; plain SGD keeps no
  // optimizer state), with no fp32 copy of the model on the device before them.
  const models::GptConfig c = model();
  const int world = 2;
  const int64_t bound = bound_bytes(c, world, 2, 0, 2);
  const StartupRun eager = start(world, 2, true, true, false, true);
  const StartupRun deferred = start(world, 2, true, true, true, true);
  for (int r = 0; r < world; ++r) {
    std::printf("stage 2 bf16 SGD N=%d rank %d: device peak eager %s, deferred %s; bound %s\n",
                world, r, mib(eager.peak[r]).c_str(), mib(deferred.peak[r]).c_str(),
                mib(bound).c_str());
    EXPECT_LE(deferred.peak[r], bound) << "rank " << r;
    EXPECT_GT(eager.peak[r], bound) << "rank " << r;
    EXPECT_EQ(deferred.first_loss[r], eager.first_loss[r]);
  }
  expect_planned(c, world, 2, 0, 2, true, deferred.peak);
  expect_planned(c, world, 2, 0, 2, false, eager.peak);
}

TEST(StartupMemory, Stage3HostPeakIsOwnShardPlusOneUnitPerRank) {
  // Ranks on the CPU: what each rank's host memory holds, summed over the process's ranks, and
  // beside it the host-side transients of a deferred build (a block while it is constructed,
  // one parameter drawn in fp32 and the piece kept of it): one unit more per rank.
  const models::GptConfig c = model();
  for (int world : {2, 4}) {
    const int64_t per_rank = bound_bytes(c, world, 4, 2, 3);
    const int64_t unit = largest_unit(plan_of(c, world, 4, 2));
    const int64_t bound = world * (per_rank + 4 * unit);
    const StartupRun eager = start(world, 3, false, false, false, false);
    const StartupRun deferred = start(world, 3, false, false, true, false);
    std::printf("stage 3 fp32 AdamW N=%d, host (all ranks): peak eager %s, deferred %s; bound %s\n",
                world, mib(eager.peak[0]).c_str(), mib(deferred.peak[0]).c_str(),
                mib(bound).c_str());
    EXPECT_LE(deferred.peak[0], bound) << "N=" << world;
    EXPECT_GT(eager.peak[0], bound) << "N=" << world;
  }
}

}  // namespace
}  // namespace zero::testing
