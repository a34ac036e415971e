// ZeRO-Offload (zero_optimization.offload_optimizer): stages 1 and 2 on 1, 2 and 4 real gloo
// ranks (threads) train to the same parameters as the engine without offload and as
// single-process torch::optim on the concatenated batch, with accumulation, clipping, SGD and
// AdamW; bf16; the fp16 overflow skip; checkpoints moving between offload on and off; the host
// side of the memory report.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>

#include <sched.h>

#include <cstdlib>
#include <filesystem>
#include <mutex>

#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>

#include "support/allocator_run.hpp"
#include "support/thread_group.hpp"
#include "support/tiny_net.hpp"
#include "support/tiny_net_layout.hpp"
#include "zero/auto_strategy.hpp"
#include "zero/checkpoint_io.hpp"
#include "zero/device.hpp"
#include "zero/engine.hpp"
#include "zero/grads/grad_buckets.hpp"
#include "zero/grads/grad_to_host.hpp"
#include "zero/params/shard_info.hpp"
#include "zero/step/optimizer_offload.hpp"

namespace zero::testing {
namespace {

constexpr int kSteps = 5;
constexpr int64_t kRows = 48;

struct Trained {
  std::vector<at::Tensor> params;   // per rank: flat_parameters() after training
  std::vector<at::Tensor> masters;  // per rank: the fp32 master weights, gathered
  std::vector<std::vector<double>> norms;
};

Trained train(Config cfg, bool offload, int world, int accumulation, uint64_t seed,
              at::ScalarType input = at::kFloat) {
  cfg.zero_optimization.offload_optimizer.enabled = offload;
  cfg.zero_optimization.offload_optimizer.threads = 2;
  Trained out;
  out.params.resize(world);
  out.masters.resize(world);
  out.norms.resize(world);
  std::mutex mu;
  run_ranks(world, [&](std::shared_ptr<comm::Group> group) {
    auto net = make_tiny_net(seed);
    auto engine = initialize(net, cfg, group);
    const int r = group->rank();
    for (int s = 0; s < kSteps; ++s) {
      Batch global = global_batch(s, kRows);
      for (int m = 0; m < accumulation; ++m) {
        Batch b = rank_micro_batch(global, r, world, m, accumulation);
        engine.backward(mse(net->forward(b.x.to(input)).to(at::kFloat), b.y));
        EXPECT_EQ(engine.step(), m == accumulation - 1);
      }
      std::lock_guard<std::mutex> lock(mu);
      out.norms[r].push_back(engine.stats().last_grad_norm);
    }
    std::vector<at::Tensor> parts;
    for (auto& [name, t] : engine.state_dict()) parts.push_back(t.reshape(-1));
    std::lock_guard<std::mutex> lock(mu);
    out.params[r] = engine.flat_parameters();
    out.masters[r] = at::cat(parts);
  });
  return out;
}

// Per parameter of the tiny net: max |a - b| within `rel` of the parameter's largest magnitude.
void expect_close_per_parameter(const at::Tensor& a, const at::Tensor& b, double rel,
                                const std::string& what) {
  ASSERT_EQ(a.numel(), b.numel()) << what;
  int64_t at = 0;
  for (const auto& p : make_tiny_net(1)->parameters()) {
    const int64_t n = p.numel();
    const at::Tensor x = a.narrow(0, at, n), y = b.narrow(0, at, n);
    EXPECT_LE((x - y).abs().max().item<double>(), rel * y.abs().max().item<double>())
        << what << ", parameter at " << at;
    at += n;
  }
}

struct Case {
  int stage, world, accumulation;
  double clip;
  const char* optimizer;
};

class OffloadEquivalence : public ::testing::TestWithParam<Case> {};

TEST_P(OffloadEquivalence, MatchesTheEngineWithoutOffloadAndTorch) {
  const Case c = GetParam();
  const int64_t micro = kRows / (c.world * c.accumulation);
  Config cfg = test_config(c.stage, micro, c.accumulation, c.clip);
  cfg.optimizer.type = c.optimizer;
  if (cfg.optimizer.type == "SGD") {
    cfg.optimizer.lr = 0.05;
    cfg.optimizer.momentum = 0.9;
    cfg.optimizer.weight_decay = 0.01;
  }
  const ReferenceResult ref = train_reference(cfg, kSteps, kRows, 3);
  const Trained on = train(cfg, true, c.world, c.accumulation, 3);
  const Trained off = train(cfg, false, c.world, c.accumulation, 3);
  for (int r = 0; r < c.world; ++r) {
    const std::string rank = "rank " + std::to_string(r);
    // Same reductions in the same order, the optimizer rounding as ATen's fused kernels: bit for
    // bit (tests/test_cpu_optim.cpp BitIdenticalToTheFusedShardOptimizer).
    EXPECT_TRUE(at::equal(on.params[r], off.params[r])) << rank << " vs no offload";
    EXPECT_TRUE(at::equal(on.masters[r], off.masters[r])) << rank << " vs no offload, masters";
    // Against torch::optim per parameter (the reduction order differs from one process).
    EXPECT_LT((on.params[r] - ref.params).abs().max().item<double>(), 2e-5) << rank;
    for (int s = 0; s < kSteps; ++s) {
      EXPECT_NEAR(on.norms[r][s], ref.grad_norms[s], 1e-5 * ref.grad_norms[s]) << rank;
      EXPECT_NEAR(on.norms[r][s], off.norms[r][s], 1e-6 * off.norms[r][s]) << rank;
    }
  }
  // Training moved the parameters; with clipping, clipping was active.
  EXPECT_GT((ref.params - flatten(*make_tiny_net(3))).abs().max().item<double>(), 1e-2);
  if (c.clip > 0) EXPECT_GT(ref.grad_norms.front(), c.clip);
}

INSTANTIATE_TEST_SUITE_P(Stages, OffloadEquivalence,
                         ::testing::Values(Case{1, 1, 1, 0, "AdamW"}, Case{2, 1, 1, 0, "AdamW"},
                                           Case{1, 2, 1, 0, "AdamW"}, Case{2, 2, 1, 0, "AdamW"},
                                           Case{1, 4, 2, 0.3, "AdamW"}, Case{2, 4, 2, 0.3, "AdamW"},
                                           Case{2, 2, 3, 0, "AdamW"}, Case{1, 2, 3, 0.3, "SGD"},
                                           Case{2, 4, 1, 0, "SGD"}, Case{2, 2, 2, 0.3, "SGD"}),
                         [](const ::testing::TestParamInfo<Case>& info) {
                           const Case& c = info.param;
                           return std::string(c.optimizer) + "_stage" + std::to_string(c.stage) +
                                  "_world" + std::to_string(c.world) + "_ga" +
                                  std::to_string(c.accumulation) + (c.clip > 0 ? "_clip" : "");
                         });

// bf16 with clipping: the offloaded masters are the non-offloaded engine's bit for bit. Close is
// not enough in bf16: a master one fp32 ulp away that lies at a bf16 rounding boundary makes
// another bf16 weight, and a run that trains on other weights for a step ends 1e-5 .. 4e-4 of the
// parameters' magnitude away four steps later (measured by tipping one bf16 weight by an ulp).
// That is what failed here once in a few hundred runs (issue 21), on whichever initial weights,
// CPU (ATen's AVX-512, AVX2 or baseline kernels) and data put a master there: the host AdamW
// rounded the second moment with two roundings where ATen's vector kernel has one, and ATen's
// remainder loop otherwise again (both now as ATen, optim/cpu_adamw.cpp), and the offloaded
// run's gradient norm was summed over the whole host shard where the bf16 one sums bucket by
// bucket (now both by bucket, zero/engine/grad_norm.cpp). Several initial weights, so that a
// difference anywhere shows: before the fix none of 200 seeds gave equal masters.
TEST(OffloadBf16, MastersMatchTheEngineWithoutOffload) {
  Config cfg = test_config(2, kRows / 2, 1, 1.0);
  cfg.bf16 = true;
  double first_norm = 0;
  for (const uint64_t seed : {4, 5, 6}) {
    const Trained on = train(cfg, true, 2, 1, seed, at::kBFloat16);
    const Trained off = train(cfg, false, 2, 1, seed, at::kBFloat16);
    first_norm = off.norms[0].front();
    for (int r = 0; r < 2; ++r) {
      const std::string at_rank = "seed " + std::to_string(seed) + ", rank " + std::to_string(r);
      EXPECT_TRUE(at::equal(on.masters[r], off.masters[r]))
          << at_rank << ": " << on.masters[r].ne(off.masters[r]).sum().item<int64_t>()
          << " masters differ";
      EXPECT_TRUE(at::equal(on.params[r], off.params[r])) << at_rank << ", bf16 weights";
      // The module's bf16 weights are the masters rounded.
      EXPECT_TRUE(at::equal(on.params[r], on.masters[r].to(at::kBFloat16).to(at::kFloat)));
      for (int s = 0; s < kSteps; ++s) {
        EXPECT_EQ(on.norms[r][s], off.norms[r][s]) << at_rank << ", step " << s;
      }
    }
  }
  EXPECT_GT(first_norm, 1.0) << "clipping was active";
}

// The host step's threads: the configured count, or this rank's share of the cores it may run
// on among the node's ranks (torchrun's OMP_NUM_THREADS=1 is not it).
TEST(OffloadThreads, ConfiguredCountOrThisRanksShareOfTheCores) {
  cpu_set_t set;
  CPU_ZERO(&set);
  ASSERT_EQ(sched_getaffinity(0, sizeof set, &set), 0);
  const int cores = CPU_COUNT(&set);
  const char* saved = std::getenv("LOCAL_WORLD_SIZE");
  const std::string keep = saved ? saved : "";
  EXPECT_EQ(host_step_threads(3), 3);
  setenv("LOCAL_WORLD_SIZE", "1", 1);
  EXPECT_EQ(host_step_threads(0), cores);
  setenv("LOCAL_WORLD_SIZE", std::to_string(cores * 4).c_str(), 1);
  EXPECT_EQ(host_step_threads(0), 1) << "never 0";
  if (cores >= 2) {
    setenv("LOCAL_WORLD_SIZE", "2", 1);
    EXPECT_EQ(host_step_threads(0), cores / 2);
  }
  if (saved) {
    setenv("LOCAL_WORLD_SIZE", keep.c_str(), 1);
  } else {
    unsetenv("LOCAL_WORLD_SIZE");
  }
}

class OffloadFp16 : public ::testing::TestWithParam<int> {};

TEST_P(OffloadFp16, OverflowSkipsTheSameStepEverywhere) {
  Config cfg = test_config(GetParam(), kRows / 2, 1, 0);
  cfg.fp16.enabled = true;
  cfg.fp16.initial_scale_power = 8;
  cfg.fp16.hysteresis = 1;
  cfg.zero_optimization.offload_optimizer.enabled = true;
  std::mutex mu;
  std::vector<std::vector<int>> applied(2);
  run_ranks(2, [&](std::shared_ptr<comm::Group> group) {
    const int r = group->rank();
    auto net = make_tiny_net(5);
    auto engine = initialize(net, cfg, group);
    for (int s = 0; s < 5; ++s) {
      Batch b = rank_micro_batch(global_batch(s, kRows), r, 2, 0, 1);
      at::Tensor x = b.x.to(at::kHalf);
      if (s == 2 && r == 1) x.fill_(std::numeric_limits<float>::infinity());
      const at::Tensor before = engine.flat_parameters();
      engine.backward(mse(net->forward(x).to(at::kFloat), b.y));
      const bool ok = engine.step();
      if (s == 2) {
        EXPECT_TRUE(engine.flat_parameters().equal(before)) << "skipped: nothing changed";
        EXPECT_EQ(engine.loss_scale(), 128) << "the scale was halved";
      } else {
        EXPECT_FALSE(engine.flat_parameters().equal(before)) << "step " << s << " applied";
      }
      std::lock_guard<std::mutex> lock(mu);
      applied[r].push_back(ok ? 1 : 0);
    }
    EXPECT_EQ(engine.stats().skipped_steps, 1);
    EXPECT_EQ(engine.stats().optimizer_steps, 4);
  });
  const std::vector<int> want = {1, 1, 0, 1, 1};
  EXPECT_EQ(applied[0], want);
  EXPECT_EQ(applied[1], want);
}

INSTANTIATE_TEST_SUITE_P(Stages, OffloadFp16, ::testing::Values(1, 2));

// Saves after 2 steps with offload `save_offload`, resumes with `load_offload`: the loaded
// masters are the saved ones bit for bit, and 2 more steps land where an uninterrupted run with
// the saving side's setting does (1e-6 per parameter: the kernels differ by an ulp).
void resume_across(bool save_offload, bool load_offload) {
  const std::string dir = (std::filesystem::temp_directory_path() /
                           ("zero_offload_ckpt_" + std::to_string(save_offload) +
                            std::to_string(load_offload) + "_" + std::to_string(::getpid())))
                              .string();
  std::filesystem::remove_all(dir);
  Config cfg = test_config(2, kRows / 2, 1, 1.0);
  const auto steps = [&](Engine& e, std::shared_ptr<TinyNetImpl>& net, int from, int to, int r) {
    for (int s = from; s < to; ++s) {
      Batch b = rank_micro_batch(global_batch(s, kRows), r, 2, 0, 1);
      e.backward(mse(net->forward(b.x), b.y));
      e.step();
    }
  };
  const auto masters = [](Engine& e) {
    std::vector<at::Tensor> parts;
    for (auto& [name, t] : e.state_dict()) parts.push_back(t.reshape(-1));
    return at::cat(parts);
  };
  std::vector<at::Tensor> saved(2), straight(2), resumed(2), loaded(2);
  run_ranks(2, [&](std::shared_ptr<comm::Group> group) {
    const int r = group->rank();
    Config c = cfg;
    c.zero_optimization.offload_optimizer.enabled = save_offload;
    auto net = make_tiny_net(6);
    auto engine = initialize(net, c, group);
    steps(engine, net, 0, 2, r);
    engine.save_checkpoint(dir, "two");
    saved[r] = masters(engine);
    steps(engine, net, 2, 4, r);
    straight[r] = masters(engine);
  });
  run_ranks(2, [&](std::shared_ptr<comm::Group> group) {
    const int r = group->rank();
    Config c = cfg;
    c.zero_optimization.offload_optimizer.enabled = load_offload;
    auto net = make_tiny_net(99);  // other weights: the checkpoint must replace them
    auto engine = initialize(net, c, group);
    EXPECT_EQ(engine.load_checkpoint(dir, "two"), "two");
    loaded[r] = masters(engine);
    steps(engine, net, 2, 4, r);
    resumed[r] = masters(engine);
  });
  for (int r = 0; r < 2; ++r) {
    EXPECT_TRUE(at::equal(loaded[r], saved[r])) << "rank " << r;
    expect_close_per_parameter(resumed[r], straight[r], 1e-6, "resumed");
  }
  std::filesystem::remove_all(dir);
}

TEST(OffloadCheckpoint, SavedWithOffloadResumesWithout) { resume_across(true, false); }
TEST(OffloadCheckpoint, SavedWithoutOffloadResumesWith) { resume_across(false, true); }

// Another world size: a checkpoint saved by 2 ranks with offload is loaded by 1 and 4 ranks,
// with offload and without. The loaded masters are the saved ones bit for bit and a re-save
// from the new layout consolidates to the same master and AdamW states element for element;
// 2 more steps land where the same load without offload does (only the optimizer kernel
// differs: 1e-6 per parameter) and where single-process torch::optim does over all 4 steps.
TEST(OffloadCheckpoint, ResumesOnAnotherWorldSizeWithAndWithoutOffload) {
  constexpr int kSaveWorld = 2, kK = 2;
  const std::string base = (std::filesystem::temp_directory_path() /
                            ("zero_offload_reshard_" + std::to_string(::getpid())))
                               .string();
  std::filesystem::remove_all(base);
  const auto config = [](int world, bool offload) {
    Config c = test_config(2, kRows / world, 1, 0.3);
    c.zero_optimization.offload_optimizer.enabled = offload;
    c.zero_optimization.offload_optimizer.threads = 1;
    return c;
  };
  const auto steps = [](Engine& e, TinyNetImpl& net, int from, int to) {
    for (int s = from; s < to; ++s) {
      Batch b = rank_micro_batch(global_batch(s, kRows), e.rank(), e.world_size(), 0, 1);
      e.backward(mse(net.forward(b.x), b.y));
      e.step();
    }
  };
  const auto masters = [](Engine& e) {
    std::vector<at::Tensor> parts;
    for (auto& [name, t] : e.state_dict()) parts.push_back(t.reshape(-1));
    return at::cat(parts);
  };
  at::Tensor saved;
  run_ranks(kSaveWorld, [&](std::shared_ptr<comm::Group> group) {
    auto net = make_tiny_net(8);
    auto engine = initialize(net, config(kSaveWorld, true), group);
    steps(engine, *net, 0, kK);
    engine.save_checkpoint(base + "/saved");
    at::Tensor m = masters(engine);  // collective: every rank gathers
    if (group->rank() == 0) saved = m;
  });
  const ReferenceResult ref = train_reference(config(1, false), 2 * kK, kRows, 8);
  for (const int world : {1, 4}) {
    at::Tensor resumed[2];  // [offload]
    for (const bool offload : {true, false}) {
      const std::string what =
          std::to_string(world) + " ranks, offload " + (offload ? "on" : "off");
      const std::string resaved =
          base + "/resaved_" + std::to_string(world) + "_" + std::to_string(offload);
      std::vector<at::Tensor> loaded(world), after(world);
      run_ranks(world, [&](std::shared_ptr<comm::Group> group) {
        const int r = group->rank();
        auto net = make_tiny_net(99);  // other weights: the checkpoint must replace them
        auto engine = initialize(net, config(world, offload), group);
        engine.load_checkpoint(base + "/saved");
        loaded[r] = masters(engine);
        EXPECT_EQ(engine.stats().optimizer_steps, kK);
        engine.save_checkpoint(resaved);
        steps(engine, *net, kK, 2 * kK);
        after[r] = masters(engine);
      });
      for (int r = 0; r < world; ++r) {
        EXPECT_TRUE(at::equal(loaded[r], saved)) << what << ", rank " << r;
        EXPECT_TRUE(at::equal(after[r], after[0])) << what << ": ranks agree";
      }
      EXPECT_EQ(read_checkpoint_info(resaved).world_size, world);
      for (const std::string kind : {"master", "exp_avg", "exp_avg_sq"}) {
        const auto a = read_consolidated(base + "/saved", "", kind);
        const auto b = read_consolidated(resaved, "", kind);
        ASSERT_EQ(a.size(), b.size()) << what << ", " << kind;
        for (size_t i = 0; i < a.size(); ++i) {
          EXPECT_EQ(a[i].first, b[i].first);
          EXPECT_TRUE(at::equal(a[i].second, b[i].second))
              << what << ", " << kind << " of " << a[i].first;
        }
      }
      // The master in state_dict() order is named_parameters() order, as the reference's.
      EXPECT_LT((after[0] - ref.params).abs().max().item<double>(), 2e-5) << what;
      resumed[offload] = after[0];
    }
    expect_close_per_parameter(resumed[1], resumed[0], 1e-6,
                               std::to_string(world) + " ranks: offload on vs off");
  }
  EXPECT_GT((ref.params - saved).abs().max().item<double>(), 1e-3) << "the resumed steps moved";
  std::filesystem::remove_all(base);
}

TEST(OffloadMemory, HostHoldsMasterStatesAndGradientShard) {
  Config cfg = test_config(2, kRows / 2, 1, 0);
  cfg.bf16 = true;
  cfg.zero_optimization.offload_optimizer.enabled = true;
  run_ranks(2, [&](std::shared_ptr<comm::Group> group) {
    auto net = make_tiny_net(2);
    auto engine = initialize(net, cfg, group);
    Batch b = rank_micro_batch(global_batch(0, kRows), group->rank(), 2, 0, 1);
    engine.backward(mse(net->forward(b.x.to(at::kBFloat16)).to(at::kFloat), b.y));
    engine.step();
    const MemoryReport r = engine.memory_report();
    const int64_t shard = r.padded_params / 2;
    // fp32 master + 2 AdamW states + fp32 gradient shard + the bf16 copy, all 1/N; and the
    // three bf16 slots (one bucket shard each) the reduced gradients land in on the host.
    const int64_t ring =
        3 * 2 * tiny_net_layout(2, cfg.zero_optimization.reduce_bucket_size).chunk_numel();
    EXPECT_EQ(r.host_measured, shard * (4 + 8 + 4 + 2) + ring);
    EXPECT_EQ(r.host_predicted, r.host_measured);
    // Nothing is page-locked without CUDA; with it, the pinned blocks are rounded up.
    if (at::hasCUDA()) {
      EXPECT_GE(r.host_pinned, r.host_measured);
    } else {
      EXPECT_EQ(r.host_pinned, r.host_measured);
    }
    // What stays on the device: the bf16 parameters and the bucket buffers.
    EXPECT_EQ(r.measured.total() - r.host_measured,
              r.measured.params + r.measured.comm_buffers - shard * 2 - ring);
    EXPECT_NE(format_memory_report(r).find("in host mem"), std::string::npos);
  });
}

// The planner (zero-memory, torch-free) predicts what the engine holds with offload, on the
// device and in host memory, byte for byte, given the engine's padded parameter count.
TEST(OffloadMemory, PlannerPredictsTheEnginesDeviceAndHostBytes) {
  constexpr int kWorld = 2;
  for (const auto& [stage, accumulation, bf16] :
       {std::tuple{1, 1, true}, std::tuple{2, 1, true}, std::tuple{1, 2, true},
        std::tuple{2, 1, false}, std::tuple{1, 2, false}}) {
    Config cfg = test_config(stage, kRows / (kWorld * accumulation), accumulation, 0);
    cfg.bf16 = bf16;
    cfg.zero_optimization.offload_optimizer.enabled = true;
    std::vector<MemoryReport> reports(kWorld);
    run_ranks(kWorld, [&](std::shared_ptr<comm::Group> group) {
      auto net = make_tiny_net(2);
      auto engine = initialize(net, cfg, group);
      reports[group->rank()] = engine.memory_report();
    });
    const MemoryReport& r = reports[0];
    PlanInput in = plan_input_for(cfg, r.padded_params, kWorld);
    ASSERT_TRUE(in.offload_optimizer);
    const std::string what = "stage " + std::to_string(stage) + ", accumulation " +
                             std::to_string(accumulation) + (bf16 ? ", bf16" : ", fp32");
    const MemoryBreakdown st = plan_model_states(in, stage);
    const int64_t host = plan_host_states(in, stage);
    EXPECT_EQ(host, r.host_measured) << what;
    EXPECT_EQ(st.params, r.measured.params) << what;
    EXPECT_EQ(st.grads, r.measured.grads) << what;
    EXPECT_EQ(st.master, r.measured.master) << what;
    EXPECT_EQ(st.optimizer, r.measured.optimizer) << what;
    EXPECT_EQ(st.comm_buffers, r.measured.comm_buffers) << what;
    EXPECT_EQ(st.total() - host, r.measured.total() - r.host_measured) << what << ": device";
  }
}

// Measured by the allocator, not the report: what initialize adds (mallinfo2, process-wide: on a
// CPU run host and device are one pool) is the report's total, host part included, and steps
// keep nothing new (a leaked host gradient or copy buffer would show).
class OffloadAllocator : public ::testing::TestWithParam<std::tuple<int, bool>> {};

TEST_P(OffloadAllocator, InitializeAddsTheReportedBytesAndStepsNothing) {
  const auto [stage, bf16] = GetParam();
  constexpr int kWorld = 2;
  Config cfg = test_config(stage, 4, 1, 0, /*bucket=*/200'000);
  cfg.bf16 = bf16;
  cfg.zero_optimization.offload_optimizer.enabled = true;
  const AllocatorRun run = run_with_allocator_readings(cfg, kWorld);
  int64_t expected = 0;
  for (const MemoryReport& r : run.reports) {
    EXPECT_EQ(r.host_measured, r.host_predicted);
    EXPECT_GT(r.host_measured, 0);
    expected += r.measured.total() - r.replaced_param_bytes;
  }
  const int64_t init = run.after_init - run.before;
  std::printf(
      "offload stage %d %s: allocator +%lld B over initialize, report %lld B (host %lld B "
      "per rank); steps 3-10 +%lld B\n",
      stage, bf16 ? "bf16" : "fp32", static_cast<long long>(init), static_cast<long long>(expected),
      static_cast<long long>(run.reports[0].host_measured),
      static_cast<long long>(run.after_steps - run.after_warm));
  EXPECT_NEAR(static_cast<double>(init), static_cast<double>(expected),
              0.02 * static_cast<double>(expected) + 512 * 1024);
  EXPECT_LT(std::abs(run.after_steps - run.after_warm), 1024 * 1024) << "steps keep nothing new";
}

INSTANTIATE_TEST_SUITE_P(StagesAndDtypes, OffloadAllocator,
                         ::testing::Combine(::testing::Values(1, 2),
                                            ::testing::Values(false, true)));

// The DeepSpeed offload configs of the corpus (trained by test_deepspeed_semantics) turn it on.
TEST(OffloadConfig, DeepSpeedCorpusConfigsEnableIt) {
  for (const char* name : {"hf_zero2_offload_cpu.json", "accelerate_zero2_offload.json",
                           "ds_cifar_cpu_offload.json"}) {
    const Config c =
        Config::from_file(std::string(ZERO_SOURCE_DIR) + "/tests/data/ds_corpus/" + name);
    EXPECT_TRUE(c.zero_optimization.offload_optimizer.enabled) << name;
    EXPECT_TRUE(c.zero_optimization.offload_optimizer.pin_memory) << name;
    EXPECT_EQ(c.zero_optimization.stage, 2) << name;
  }
}

TEST(OffloadConfig, StageZeroSetInCodeIsRefusedAtInitialize) {
  Config cfg = test_config(0, kRows, 1, 0);
  cfg.zero_optimization.offload_optimizer.enabled = true;
  auto net = make_tiny_net(1);
  try {
    initialize(net, cfg, comm::Group::single());
    FAIL() << "expected an error";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("offload_optimizer needs ZeRO stage 1, 2 or 3"),
              std::string::npos);
  }
}

// The gradient shard's trip to the host (zero/grads/grad_to_host.hpp), on the host copy engine. In
// an accumulation window the first piece to reach a range of the shard overwrites it (the old
// values count as zeros: zero_grad leaves the shard alone), later ones add through the ring of
// slots (more pieces than slots: it wraps), the source may be rewritten once the ticket was
// waited for, and finish() zeroes what no piece wrote.
TEST(OffloadGradToHost, FirstPieceOverwritesLaterOnesAddAndFinishZeroesTheRest) {
  GradToHost to_host(at::kCPU, /*slot_numel=*/4, at::kBFloat16, at::kFloat);
  at::Tensor shard = at::arange(24, at::kFloat).add_(100);  // last window's values
  at::Tensor src = at::empty({4}, at::kBFloat16);
  std::vector<at::Tensor> want(6, at::zeros({4}));
  const auto send = [&](int range, double value, bool add) {
    src.copy_(at::full({4}, value, at::kFloat));
    want[range] = add ? want[range] + src.to(at::kFloat) : src.to(at::kFloat);
    const auto ticket = to_host.send(src, shard.narrow(0, 4 * range, 4), add);
    to_host.wait(ticket);
    src.fill_(-1000);  // the next bucket reuses the buffer
  };
  to_host.new_window();
  for (int k = 0; k < 5; ++k) send(k, 0.5 * (k + 1), /*add=*/k != 2);
  for (int k : {0, 1, 3, 4}) send(k, 0.25 * (k + 1), /*add=*/true);  // 4 adds through 3 slots
  to_host.finish(shard);
  for (int k = 0; k < 6; ++k) {
    EXPECT_TRUE(at::equal(shard.narrow(0, 4 * k, 4), want[k])) << "range " << k;
  }
  EXPECT_EQ(to_host.bytes(), 3 * 4 * 2) << "three bf16 slots of 4 elements";
  // As accumulate() into a zeroed shard gives: a first sum of -0 is +0; a copy keeps -0.
  to_host.new_window();
  to_host.send(at::full({4}, -0.0f), shard.narrow(0, 0, 4), /*add=*/true);
  to_host.send(at::full({4}, -0.0f), shard.narrow(0, 4, 4), /*add=*/false);
  to_host.finish(shard);
  EXPECT_FALSE(std::signbit(shard[0].item<float>()));
  EXPECT_TRUE(std::signbit(shard[4].item<float>()));
}

TEST(OffloadGradToHost, AccumulatesInGradAccumDtypeAndAbortDropsPending) {
  GradToHost to_host(at::kCPU, 3, at::kFloat, at::kBFloat16);
  at::Tensor shard = at::full({3}, 5.0f);
  const at::Tensor x = at::full({3}, 1.0f / 512);  // lost when added to 1 and rounded to bf16
  to_host.new_window();
  to_host.send(x, shard, /*add=*/true);
  to_host.send(at::ones({3}), shard, /*add=*/true);
  to_host.finish(shard);
  EXPECT_TRUE(at::equal(shard, (x + 1).to(at::kBFloat16).to(at::kFloat)));
  const at::Tensor before = shard.clone();
  to_host.send(at::ones({3}), shard, /*add=*/true);  // a second piece: through a slot
  to_host.abort();  // a failed backward: the pending piece never reaches the shard
  EXPECT_TRUE(at::equal(shard, before));
}

// The fence a buffer carries (the wait for a copy still reading it) runs when the buffer is next
// acquired, once, and not for another buffer; an aborted pass forgets it.
TEST(OffloadGradToHost, BucketBufferFenceRunsAtItsNextAcquire) {
  BucketPipeline pool(8, 4, at::TensorOptions().dtype(at::kFloat), 2);
  int fenced = 0;
  const int a = pool.acquire();
  pool.before_reuse(a, [&] { ++fenced; });
  pool.release(a);
  const int b = pool.acquire();
  const int c = pool.acquire();
  EXPECT_EQ(fenced, 1);
  EXPECT_TRUE((b == a) != (c == a));
  pool.release(b);
  pool.release(c);
  pool.acquire();
  pool.acquire();
  EXPECT_EQ(fenced, 1) << "a fence runs once";
  pool.before_reuse(a, [&] { ++fenced; });
  pool.abort();
  pool.acquire();
  pool.acquire();
  EXPECT_EQ(fenced, 1) << "abort forgets fences";
}

}  // namespace
}  // namespace zero::testing
