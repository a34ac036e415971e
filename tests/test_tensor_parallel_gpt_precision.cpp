// The tensor-parallel example GPT (models::TpGpt, tiny preset) through the ZeRO engine in reduced
// precision and at stage 3, against the fp32 single-process reference of
// support/tp_gpt_training.hpp: bf16 at T = 2 within the distance T = 1 measures, stage 3 equal to
// stage 2 within 1e-6, and an fp16 overflow on one tensor-parallel rank skipping the step on all.
#include <gtest/gtest.h>
#include <torch/utils.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "comm/group.hpp"
#include "support/thread_group.hpp"
#include "support/tp_compare.hpp"
#include "support/tp_gpt_training.hpp"
#include "tp_trainer.hpp"
#include "zero/engine.hpp"
#include "zero/models/gpt.hpp"
#include "zero/models/tp_gpt.hpp"
#include "zero/tensor_parallel.hpp"

namespace zero::testing {
namespace {

using namespace tp_gpt;

// Stage 3's trained parameters at full shape: the fp32 masters gathered over dp (state_dict,
// this tp rank's shards) in an engine-free twin of the model, gathered over tp. A collective.
std::vector<std::pair<std::string, at::Tensor>> stage3_full(const Engine& engine,
                                                            const tensor_parallel::GroupPtr& tp,
                                                            bool sp) {
  models::TpGpt twin(tp, shape(), sp);
  auto named = twin->named_parameters();
  {
    torch::NoGradGuard no_grad;
    for (const auto& [name, value] : engine.state_dict()) {
      if (auto* p = named.find(name)) p->copy_(value);
    }
  }
  return twin->gather_full();
}

// What an engine run leaves: the loss of every step and the trained parameters at full shape,
// in fp32 (world rank 0's; every rank's are the same).
struct EngineRun {
  std::vector<double> losses;
  std::map<std::string, at::Tensor> params;
};

EngineRun train_engine(const EngineCase& c, int tp, const Config& cfg, const models::Gpt& init,
                       int steps) {
  EngineRun out;
  run_ranks(tp * c.dp, [&](std::shared_ptr<comm::Group> world) {
    const auto groups = tensor_parallel::make_groups(world, tp);
    models::TpGpt model(groups.tp, shape(), c.sp);
    model->load_full(*init);
    Engine engine =
        initialize(model.ptr(), cfg, examples::engine_groups(groups, model->placements()));
    std::vector<double> losses;
    for (int step = 0; step < steps; ++step) {
      losses.push_back(engine_step(engine, *model, step, groups.dp_rank(), c.dp, c.accumulation));
    }
    // Collectives over tp (and at stage 3 over dp first): every rank.
    const auto full = cfg.zero_optimization.stage == 3 ? stage3_full(engine, groups.tp, c.sp)
                                                       : model->gather_full();
    if (world->rank() != 0) return;
    out.losses = losses;
    for (const auto& [name, value] : full) out.params[name] = value.to(at::kFloat);
  });
  return out;
}

// How far a run is from the fp32 reference: the losses' relative error, root mean square over
// the steps (one step's error is bf16 rounding noise: its maximum over a few steps varied 2x from
// one layout to the next, the RMS over kBf16Steps much less), and the worst parameter (L2
// relative) at the end.
struct Distance {
  double loss = 0, param = 0;
};

Distance distance(const EngineRun& run, const Reference& ref) {
  Distance d;
  EXPECT_EQ(run.losses.size(), ref.losses.size());
  const size_t n = std::min(run.losses.size(), ref.losses.size());
  for (size_t i = 0; i < n; ++i) {
    const double rel = (run.losses[i] - ref.losses[i]) / ref.losses[i];
    d.loss += rel * rel / static_cast<double>(n);
  }
  d.loss = std::sqrt(d.loss);
  EXPECT_EQ(run.params.size(), ref.params.size());
  for (const auto& [name, want] : ref.params) {
    const at::Tensor& got = run.params.at(name);
    d.param = std::max(d.param, (got - want).norm().item<double>() / want.norm().item<double>());
  }
  return d;
}

// bf16 under tensor parallelism: the bf16 engine against the fp32 single-process reference. The
// bf16 tolerance is what T = 1 measures (the same engine, config and data-parallel size, the
// model unsplit): bf16 keeps 8 significant bits, so the losses and the weights drift from
// fp32's. T = 2 splits the matmuls and sums their partial results over tp in bf16 (each partial
// rounded before the sum, where T = 1 rounds the whole once): rounding in other places, of the
// same size, not a bias. Measured (20 steps, clipping, accumulation, sequence parallelism):
// T = 2's loss RMS 0.96 .. 1.4x T = 1's, its parameters 1.0 .. 1.2x. A wrong split (a norm's
// partial gradient left partial, counted twice) is off by the fp32 tests' 1e-5 .. 1 on top,
// orders beyond. kBf16Slack allows T = 2 twice T = 1's distance: the one number here the test
// does not measure itself.
constexpr double kBf16Slack = 2.0;
constexpr int kBf16Steps = 20;  // the 20 steps

class TpGptBf16 : public ::testing::TestWithParam<Opt> {};

TEST_P(TpGptBf16, T2StaysWithinTheT1Bf16Tolerance) {
  const Opt opt = GetParam();
  const models::Gpt init = initial_model();
  const Reference ref = train_plain(opt, init, kClip, kBf16Steps);
  for (const int dp : {1, 2}) {
    // Sequence parallelism on (the engine's partial sums in bf16 too), clipping and
    // accumulation: the fp32 tests' hardest case.
    EngineCase c{opt, dp == 1 ? 2 : 1, dp, true, kClip, 2};
    Config cfg = engine_config(c);
    cfg.bf16 = true;
    const Distance t1 = distance(train_engine(c, 1, cfg, init, kBf16Steps), ref);
    const Distance t2 = distance(train_engine(c, 2, cfg, init, kBf16Steps), ref);
    std::printf(
        "%s bf16 vs fp32 reference, D = %d, stage %d: T = 1 loss %.2e params %.2e; "
        "T = 2 loss %.2e (%.2fx) params %.2e (%.2fx)\n",
        opt == Opt::kSgd ? "SGD" : "AdamW", dp, c.stage, t1.loss, t1.param, t2.loss,
        t2.loss / t1.loss, t2.param, t2.param / t1.param);
    // bf16 is not fp32: a T = 1 distance of 0 would mean the run was not bf16.
    EXPECT_GT(t1.param, 0);
    EXPECT_LE(t2.loss, kBf16Slack * t1.loss) << "D = " << dp;
    EXPECT_LE(t2.param, kBf16Slack * t1.param) << "D = " << dp;
  }
}

// Stage 3 against stage 2 on the same T = 2 x D = 2 config (sequence parallelism, clipping,
// accumulation): the second check beside the single-process reference. Each step's loss and
// every parameter within 1e-6 relative.
class TpGptStage3 : public ::testing::TestWithParam<Opt> {};

TEST_P(TpGptStage3, EqualsStage2) {
  const models::Gpt init = initial_model();
  EngineCase c{GetParam(), 2, 2, true, kClip, 2};
  const EngineRun s2 = train_engine(c, 2, engine_config(c), init, kSteps);
  c.stage = 3;
  const EngineRun s3 = train_engine(c, 2, engine_config(c), init, kSteps);
  ASSERT_EQ(s3.losses.size(), s2.losses.size());
  for (size_t i = 0; i < s2.losses.size(); ++i) {
    EXPECT_NEAR(s3.losses[i], s2.losses[i], 1e-6 * std::abs(s2.losses[i])) << "step " << i;
  }
  ASSERT_EQ(s3.params.size(), s2.params.size());
  double worst = 0;
  for (const auto& [name, want] : s2.params) {
    const double rel = max_rel_err(s3.params.at(name), want);
    EXPECT_LT(rel, 1e-6) << name;
    worst = std::max(worst, rel);
  }
  std::printf("stage 3 vs stage 2, T = 2 x D = 2: worst parameter max rel err %.2g\n", worst);
}

INSTANTIATE_TEST_SUITE_P(Optimizers, TpGptStage3, ::testing::Values(Opt::kSgd, Opt::kAdamW),
                         [](const auto& info) {
                           return std::string(info.param == Opt::kSgd ? "SGD" : "AdamW");
                         });

INSTANTIATE_TEST_SUITE_P(Optimizers, TpGptBf16, ::testing::Values(Opt::kSgd, Opt::kAdamW),
                         [](const auto& info) {
                           return std::string(info.param == Opt::kSgd ? "SGD" : "AdamW");
                         });

// fp16 under tensor parallelism: an inf in one tensor-parallel rank's shard (world rank 1: tp
// rank 1 of data-parallel rank 0) reaches the global norm through the tp norm group, so every
// rank, tp and dp, skips that step and halves the loss scale; the weights stay as they were.
TEST(TpGptFp16, OneTpRanksOverflowSkipsTheStepOnEveryRank) {
  constexpr int kBad = 2;
  const models::Gpt init = initial_model();
  EngineCase c{Opt::kSgd, 2, 2, true, 0, 1};
  Config cfg = engine_config(c);
  cfg.optimizer.lr = 1e-2;  // fp16 steps: a small lr keeps every other step finite
  cfg.fp16.enabled = true;
  cfg.fp16.initial_scale_power = 8;
  cfg.fp16.hysteresis = 1;
  std::mutex mu;
  std::vector<std::vector<int>> applied(4);
  std::vector<double> scale_after(4);
  run_ranks(4, [&](std::shared_ptr<comm::Group> world) {
    const auto groups = tensor_parallel::make_groups(world, 2);
    models::TpGpt model(groups.tp, shape(), c.sp);
    model->load_full(*init);
    Engine engine =
        initialize(model.ptr(), cfg, examples::engine_groups(groups, model->placements()));
    // A sharded weight (a column-parallel one): its gradient on this rank is this rank's alone.
    at::Tensor sharded;
    for (const auto& p : model->placements()) {
      if (p.placement.sharded && p.param.dim() == 2 && p.name.find("blocks") == 0) {
        sharded = p.param;
        break;
      }
    }
    ASSERT_TRUE(sharded.defined());
    bool poison = false;
    sharded.register_hook([&poison](const at::Tensor& g) {
      return poison ? at::full_like(g, std::numeric_limits<float>::infinity()) : g;
    });
    std::vector<int> mine;
    for (int step = 0; step < 5; ++step) {
      poison = step == kBad && world->rank() == 1;
      at::Tensor before;
      if (step == kBad) before = engine.flat_parameters().clone();
      bool ok = false;
      engine_step(engine, *model, step, groups.dp_rank(), c.dp, c.accumulation, &ok);
      if (step == kBad) {
        EXPECT_TRUE(engine.flat_parameters().equal(before)) << "skipped: nothing changed";
        EXPECT_EQ(engine.loss_scale(), 128) << "the scale was halved";
      }
      mine.push_back(ok ? 1 : 0);
    }
    EXPECT_EQ(engine.stats().skipped_steps, 1);
    std::lock_guard<std::mutex> lock(mu);
    applied[world->rank()] = mine;
    scale_after[world->rank()] = engine.loss_scale();
  });
  const std::vector<int> want = {1, 1, 0, 1, 1};
  for (int r = 0; r < 4; ++r) {
    EXPECT_EQ(applied[r], want) << "world rank " << r;
    EXPECT_EQ(scale_after[r], scale_after[0]) << "world rank " << r;
  }
}

}  // namespace
}  // namespace zero::testing
