// Stages 0, 1 and 2 on 1, 2 and 4 real gloo ranks (threads) against single-process training on
// the concatenated batch: same parameters after K steps, with accumulation and with clipping.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <mutex>

#include "support/thread_group.hpp"
#include "support/tiny_net.hpp"
#include "zero/engine.hpp"

namespace zero::testing {
namespace {

struct Case {
  int stage;
  int world;
  int accumulation;
  double clip;
  // reduce_bucket_size: every TinyNet weight matrix (120..576 elements) is larger than 64, so
  // its bucket is reduced in chunks through buffers bounded by the bucket size.
  int64_t bucket = 200;
  bool bf16_comm = false;  // gradients travel in bf16 (the chunked path of stages 0/1 too)
  // DeepSpeed's torch_adam: the op-by-op AdamW and DeepSpeed's norm and clip arithmetic.
  bool torch_adam = false;
};

std::string name_of(const ::testing::TestParamInfo<Case>& info) {
  const Case& c = info.param;
  return "stage" + std::to_string(c.stage) + "_world" + std::to_string(c.world) + "_ga" +
         std::to_string(c.accumulation) + (c.clip > 0 ? "_clip" : "") +
         (c.bucket != 200 ? "_bucket" + std::to_string(c.bucket) : "") +
         (c.bf16_comm ? "_bf16comm" : "") + (c.torch_adam ? "_torchadam" : "");
}

class Equivalence : public ::testing::TestWithParam<Case> {};

constexpr int kSteps = 5;
constexpr int64_t kGlobalRows = 48;  // divisible by world x accumulation for every case

TEST_P(Equivalence, MatchesSingleProcessTraining) {
  const Case c = GetParam();
  const int64_t micro = kGlobalRows / (c.world * c.accumulation);
  Config cfg = test_config(c.stage, micro, c.accumulation, c.clip, c.bucket);
  cfg.optimizer.torch_adam = c.torch_adam;
  if (c.bf16_comm) {
    // AdamW turns a gradient that is ~0 into a full +-lr step whose sign bf16 rounding can flip;
    // SGD's update is proportional to the gradient, so the rounding stays a rounding.
    cfg.optimizer.type = "SGD";
    cfg.optimizer.lr = 0.05;
    cfg.optimizer.momentum = 0.9;
  }
  const ReferenceResult ref = train_reference(cfg, kSteps, kGlobalRows, /*seed=*/3);
  if (c.bf16_comm) cfg.communication_data_type = Dtype::kBFloat16;
  // bf16 gradients carry 8 mantissa bits: ~0.4 % per reduced gradient. A misplaced chunk would
  // be off by the size of a gradient, not by its rounding.
  const double tol = c.bf16_comm ? 2e-3 : 2e-5, norm_tol = c.bf16_comm ? 1e-2 : 1e-5;

  std::mutex mu;
  std::vector<at::Tensor> finals(c.world);
  std::vector<std::vector<double>> norms(c.world);
  run_ranks(c.world, [&](std::shared_ptr<comm::Group> group) {
    auto net = make_tiny_net(3);
    auto engine = initialize(net, cfg, group);
    const int r = group->rank();
    for (int s = 0; s < kSteps; ++s) {
      Batch global = global_batch(s, kGlobalRows);
      for (int m = 0; m < c.accumulation; ++m) {
        Batch b = rank_micro_batch(global, r, c.world, m, c.accumulation);
        engine.backward(mse(net->forward(b.x), b.y));
        EXPECT_EQ(engine.step(), m == c.accumulation - 1);
      }
      std::lock_guard<std::mutex> lock(mu);
      norms[r].push_back(engine.stats().last_grad_norm);
    }
    std::lock_guard<std::mutex> lock(mu);
    finals[r] = engine.flat_parameters();
  });

  for (int r = 0; r < c.world; ++r) {
    ASSERT_EQ(finals[r].numel(), ref.params.numel());
    const double diff = (finals[r] - ref.params).abs().max().item<double>();
    EXPECT_LT(diff, tol) << "rank " << r;
    for (int s = 0; s < kSteps; ++s) {
      EXPECT_NEAR(norms[r][s], ref.grad_norms[s], norm_tol * ref.grad_norms[s]) << "step " << s;
    }
  }
  // Training moved the parameters, so equality is not trivial.
  EXPECT_GT((ref.params - flatten(*make_tiny_net(3))).abs().max().item<double>(), 1e-2);
  if (c.clip > 0) {
    // The clip threshold is below the first norms: clipping really was active.
    EXPECT_GT(ref.grad_norms.front(), c.clip);
  }
}

INSTANTIATE_TEST_SUITE_P(
    AllStages, Equivalence,
    ::testing::Values(Case{0, 1, 1, 0}, Case{1, 1, 1, 0}, Case{2, 1, 1, 0},  //
                      Case{0, 2, 1, 0}, Case{1, 2, 1, 0}, Case{2, 2, 1, 0},  //
                      Case{0, 4, 1, 0}, Case{1, 4, 1, 0}, Case{2, 4, 1, 0},  //
                      Case{0, 2, 3, 0}, Case{1, 2, 3, 0}, Case{2, 2, 3, 0},  //
                      Case{0, 4, 2, 0.3}, Case{1, 4, 2, 0.3}, Case{2, 4, 2, 0.3},
                      Case{2, 3, 2, 0.3},
                      // Parameters larger than a bucket, and stage 1
                      // with accumulation (its full accumulator).
                      Case{1, 2, 1, 0, 64}, Case{2, 4, 1, 0.3, 64}, Case{1, 4, 2, 0.3, 64},
                      Case{1, 3, 2, 0, 64}, Case{0, 2, 1, 0, 64, true}, Case{1, 2, 2, 0, 64, true},
                      Case{1, 4, 1, 0, 64, true}, Case{2, 2, 2, 0, 64, true},
                      Case{0, 2, 1, 0.3, 200, false, true}, Case{1, 4, 2, 0.3, 64, false, true},
                      Case{2, 4, 1, 0.3, 64, false, true}, Case{2, 2, 3, 0, 200, false, true},
                      // reduce_bucket_size 0 (DeepSpeed accepts it): one parameter per bucket.
                      Case{2, 2, 1, 0.3, 0}, Case{1, 4, 2, 0, 0}, Case{0, 2, 1, 0, 0}),
    name_of);

// SGD with momentum goes through the same engine path.
TEST(EquivalenceSgd, Stage2MatchesTorchSgd) {
  Config cfg = test_config(2, 12, 1, 0);
  cfg.optimizer.type = "SGD";
  cfg.optimizer.lr = 0.05;
  cfg.optimizer.momentum = 0.9;
  cfg.optimizer.weight_decay = 0.01;
  const ReferenceResult ref = train_reference(cfg, kSteps, kGlobalRows, 5);
  std::vector<at::Tensor> finals(4);
  run_ranks(4, [&](std::shared_ptr<comm::Group> group) {
    auto net = make_tiny_net(5);
    auto engine = initialize(net, cfg, group);
    for (int s = 0; s < kSteps; ++s) {
      Batch b = rank_micro_batch(global_batch(s, kGlobalRows), group->rank(), 4, 0, 1);
      engine.backward(mse(net->forward(b.x), b.y));
      engine.step();
    }
    finals[group->rank()] = engine.flat_parameters();
  });
  for (auto& f : finals) EXPECT_LT((f - ref.params).abs().max().item<double>(), 2e-5);
}

// SGD is scale-sensitive: a gradient counted twice, or missed, in a chunk or in the accumulator
// shows at once. Stage 1 with and without accumulation, buckets smaller than every weight.
TEST(EquivalenceSgd, Stage1SplitBucketsMatchTorchSgd) {
  for (const int accumulation : {1, 2}) {
    constexpr int kWorld = 4;
    Config cfg = test_config(1, kGlobalRows / (kWorld * accumulation), accumulation, 0, 64);
    cfg.optimizer.type = "SGD";
    cfg.optimizer.lr = 0.05;
    cfg.optimizer.momentum = 0.9;
    cfg.optimizer.weight_decay = 0.01;
    const ReferenceResult ref = train_reference(cfg, kSteps, kGlobalRows, 5);
    std::vector<at::Tensor> finals(kWorld);
    run_ranks(kWorld, [&](std::shared_ptr<comm::Group> group) {
      auto net = make_tiny_net(5);
      auto engine = initialize(net, cfg, group);
      for (int s = 0; s < kSteps; ++s) {
        for (int m = 0; m < accumulation; ++m) {
          Batch b = rank_micro_batch(global_batch(s, kGlobalRows), group->rank(), kWorld, m,
                                     accumulation);
          engine.backward(mse(net->forward(b.x), b.y));
          engine.step();
        }
      }
      finals[group->rank()] = engine.flat_parameters();
    });
    for (auto& f : finals) {
      EXPECT_LT((f - ref.params).abs().max().item<double>(), 2e-5)
          << "accumulation " << accumulation;
    }
  }
}

// Each of 2 ranks runs one micro-step's backward under `cfg`; returns their engine stats.
std::vector<EngineStats> one_backward_stats(const Config& cfg) {
  std::vector<EngineStats> stats(2);
  run_ranks(2, [&](std::shared_ptr<comm::Group> group) {
    auto net = make_tiny_net(1);
    auto engine = initialize(net, cfg, group);
    Batch b = rank_micro_batch(global_batch(0, kGlobalRows), group->rank(), 2, 0, 1);
    engine.backward(mse(net->forward(b.x), b.y));
    stats[group->rank()] = engine.stats();
  });
  return stats;
}

// Stage 2 launches reductions from inside backward, before autograd has finished.
TEST(Overlap, Stage2LaunchesBucketsDuringBackward) {
  for (const auto& s : one_backward_stats(test_config(2, 24, 1, 0, /*bucket=*/100))) {
    // 100-element buckets give this model 3 buckets; all complete during backward.
    EXPECT_GE(s.buckets_launched_in_backward, 2);
    EXPECT_EQ(s.buckets_launched_after_backward, 0);
  }
}

// Without accumulation stage 1 keeps no full gradient: it reduces from the hooks as stage 2 does.
TEST(Overlap, Stage1WithoutAccumulationLaunchesBucketsDuringBackward) {
  for (const auto& s : one_backward_stats(test_config(1, 24, 1, 0, /*bucket=*/100))) {
    EXPECT_GE(s.buckets_launched_in_backward, 2);
    EXPECT_EQ(s.buckets_launched_after_backward, 0);
  }
}

// overlap_comm off: stage 1 reduces after backward, as DeepSpeed's ZeRO-1 does then.
TEST(Overlap, OverlapOffDefersStage1ReductionToTheEnd) {
  Config cfg = test_config(1, 24, 1, 0, 100);
  cfg.zero_optimization.overlap_comm = false;
  for (const auto& s : one_backward_stats(cfg)) {
    EXPECT_EQ(s.buckets_launched_in_backward, 0);
    EXPECT_GE(s.buckets_launched_after_backward, 2);
  }
}

TEST(Engine, StageThreeFromTheApiRefusesWhatItDoesNotSupportYet) {
  // A Config built in C++ skips the file checks: the engine refuses the same things, alike on
  // every rank (nothing collective has run yet).
  auto refused = [](const Config& cfg, const std::string& expect) {
    auto net = make_tiny_net(1);
    try {
      (void)initialize(net, cfg, comm::Group::single());
      ADD_FAILURE() << "accepted; expected: " << expect;
    } catch (const c10::Error& e) {
      EXPECT_NE(std::string(e.what()).find(expect), std::string::npos) << e.what();
    }
  };
  Config cfg = test_config(3, 48, 1, 0);
  cfg.zero_optimization.stage = 4;
  refused(cfg, "zero_optimization.stage 4 is not a ZeRO stage; set 0, 1, 2 or 3");
  cfg = test_config(3, 48, 1, 0);
  cfg.zero_optimization.stage3.param_persistence_threshold_auto = true;
  refused(cfg,
          "stage3_param_persistence_threshold is \"auto\", which needs the model's hidden "
          "size: call cfg.zero_optimization.stage3.resolve_auto(hidden)");
}

TEST(Engine, PlainLossBackwardIsRejectedWithAHint) {
  Config cfg = test_config(2, 48, 1, 0);
  auto net = make_tiny_net(1);
  auto engine = initialize(net, cfg, comm::Group::single());
  Batch b = global_batch(0, kGlobalRows);
  try {
    mse(net->forward(b.x), b.y).backward();
    FAIL() << "expected an error";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("engine.backward(loss)"), std::string::npos);
  }
}

}  // namespace
}  // namespace zero::testing
