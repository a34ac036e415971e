// "auto" reaching ZeRO stage 3 through initialize: with a budget (auto_device_memory) between
// what stage 3 and stage 2 need for the model's states, every rank chooses stage 3, the engine
// runs it (blocks gathered on use), and training equals single-process training with torch's
// optimizer on the concatenated batch. With room for stage 2, stage 2 is chosen.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <mutex>

#include "support/stage3_net.hpp"
#include "support/thread_group.hpp"
#include "support/tiny_net.hpp"
#include "zero/auto_strategy.hpp"
#include "zero/engine.hpp"
#include "zero/parallel_plan.hpp"

namespace zero::testing {
namespace {

constexpr int kWorld = 2, kSteps = 3;
constexpr int64_t kRows = 16;

Config auto_config(int64_t device_bytes) {
  Config cfg = test_config(3, kRows / kWorld, 1, 0);
  cfg.zero_optimization.stage_auto = true;
  cfg.zero_optimization.auto_device_memory = device_bytes;
  cfg.zero_optimization.stage3.param_persistence_threshold = 0;
  // No prefetch, no reuse: one unit gathered at a time (with DeepSpeed's defaults this tiny
  // model would be gathered whole ahead, and stage 3 would need more than stage 2).
  cfg.zero_optimization.stage3.prefetch_bucket_size = 0;
  cfg.zero_optimization.stage3.max_reuse_distance = 0;
  return cfg;
}

// What initialize plans with (model states only: no shape), for `stage`.
int64_t planned(const Config& cfg, int64_t num_params, int stage) {
  const PlanInput in = plan_input_for(cfg, num_params, kWorld);
  return rank_device_peak(in, stage, Recompute::kNone);
}

struct AutoRun {
  std::vector<int> stages;
  std::vector<at::Tensor> params;
};

AutoRun train(const Config& cfg) {
  AutoRun out;
  out.stages.resize(kWorld);
  out.params.resize(kWorld);
  std::mutex mu;
  run_ranks(kWorld, [&](std::shared_ptr<comm::Group> group) {
    auto net = make_stage3_net(3, /*mark=*/true);
    auto engine = initialize(net, cfg, group);
    const int r = group->rank();
    for (int s = 0; s < kSteps; ++s) {
      Batch b = rank_micro_batch(global_batch(s, kRows), r, kWorld, 0, 1);
      engine.backward(mse(net->forward(b.x), b.y));
      engine.step();
    }
    at::Tensor flat = engine.flat_parameters();
    std::lock_guard<std::mutex> lock(mu);
    out.stages[r] = engine.stage();
    out.params[r] = flat;
  });
  return out;
}

TEST(Stage3Auto, ChosenWhenOnlyItFitsAndTrainsAsOneProcess) {
  const Config probe = auto_config(1);
  int64_t psi = 0;
  for (const auto& p : make_stage3_net(3, false)->parameters()) psi += p.numel();
  const int64_t s2 = planned(probe, psi, 2), s3 = planned(probe, psi, 3);
  ASSERT_LT(s3, s2) << "stage 3 must need less than stage 2 for this test to mean anything";
  for (int s = 0; s < 2; ++s) ASSERT_GE(planned(probe, psi, s), s2);
  // A budget (90% of the device) half-way between the two.
  const auto device = static_cast<int64_t>(static_cast<double>(s3 + s2) / 2 / 0.9);
  const Config cfg = auto_config(device);

  auto ref_net = make_stage3_net(3, /*mark=*/false);
  Config ref_cfg = cfg;
  ref_cfg.zero_optimization.stage_auto = false;
  const ReferenceResult ref = train_reference(
      ref_cfg, kSteps, kRows, *ref_net, [&](const at::Tensor& x) { return ref_net->forward(x); });
  const AutoRun run = train(cfg);
  ASSERT_FALSE(HasFailure());
  for (int r = 0; r < kWorld; ++r) {
    EXPECT_EQ(run.stages[r], 3) << "rank " << r;
    const double rel =
        ((run.params[r] - ref.params).abs().max() / ref.params.abs().max()).item<double>();
    EXPECT_LT(rel, 1e-6) << "rank " << r;
  }
  EXPECT_GT((ref.params - flatten(*make_stage3_net(3, false))).abs().max().item<double>(), 1e-2)
      << "training moved the parameters";

  // With room for stage 2 "auto" does not go to stage 3.
  const AutoRun roomy =
      train(auto_config(static_cast<int64_t>(static_cast<double>(s2) / 0.9) + 4096));
  for (int r = 0; r < kWorld; ++r) EXPECT_LT(roomy.stages[r], 3) << "rank " << r;
}

}  // namespace
}  // namespace zero::testing
