// Stage 3 in the planner: a pass's gathers as the engine's trace decides them (cases worked out
// by hand from DeepSpeed's rules: prefetch ahead within stage3_prefetch_bucket_size and
// stage3_max_live_parameters, keep within stage3_max_reuse_distance), the step time's unit
// gathers, the bytes they hold, and "auto" reaching stage 3 only when nothing else fits.
#include <gtest/gtest.h>

#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "zero/auto_strategy.hpp"
#include "zero/parallel_plan.hpp"
#include "zero/time_plan.hpp"

namespace zero {
namespace {

PlanInput limits(int64_t prefetch, int64_t live, int64_t reuse) {
  PlanInput in;
  in.prefetch_bucket_size = prefetch;
  in.max_live_parameters = live;
  in.max_reuse_distance = reuse;
  return in;
}

// Three units of 100 elements; each gather takes 1 s, each forward 2 s, each backward 4 s.
const std::vector<int64_t> kUnits{100, 100, 100};
const std::vector<double> kGather{1, 1, 1}, kForward{2, 2, 2}, kBackward{4, 4, 4};

TEST(Stage3Plan, WithoutPrefetchEveryGatherIsExposed) {
  // Each unit gathered at its entry, released after each use: forward [0,1] gather, [1,3]
  // compute, and so on: 3 s per unit forward, 5 s backward.
  const Stage3Pass p =
      stage3_pass(kUnits, kGather, kForward, kBackward, limits(0, 1'000'000'000, 0));
  EXPECT_DOUBLE_EQ(p.forward_s, 9);
  EXPECT_DOUBLE_EQ(p.backward_s, 15);
  EXPECT_DOUBLE_EQ(p.exposed_s, 6);
  EXPECT_EQ(p.gathers, 6);
  EXPECT_EQ(p.peak_live, 100);
  EXPECT_DOUBLE_EQ(p.forward_gather_s, 3);
  EXPECT_DOUBLE_EQ(p.backward_gather_s, 3);
}

TEST(Stage3Plan, ReduceScattersShareTheLinkWithBackwardsGathers) {
  // Each unit's reduce-scatter (1 s) starts when its backward is done and holds the link:
  //   b2: gather [9,10], compute [10,14], reduce [14,15]
  //   b1: gather waits for the link [15,16], compute [16,20], reduce [20,21]
  //   b0: gather [21,22], compute [22,26], reduce [26,27]
  const Stage3Pass p =
      stage3_pass(kUnits, kGather, kForward, kBackward, limits(0, 1'000'000'000, 0), {1, 1, 1});
  EXPECT_DOUBLE_EQ(p.forward_s, 9);
  EXPECT_DOUBLE_EQ(p.backward_s, 17);
  EXPECT_DOUBLE_EQ(p.exposed_s, 8);
  EXPECT_DOUBLE_EQ(p.link_free_s, 27);
  EXPECT_THROW(stage3_pass(kUnits, kGather, kForward, kBackward, limits(0, 1, 0), {1}),
               std::invalid_argument);
}

TEST(Stage3Plan, PrefetchOneUnitAheadHidesAllButTheFirstGathers) {
  // Prefetch 100 elements: at each entry the next unit not gathered is issued.
  //   f0: gather 0 [0,1], prefetch 1 [1,2]; compute [1,3]
  //   f1: prefetch 2 [3,4]; compute [3,5]
  //   f2: prefetch b1 (unit 2 is the current one) [5,6]; compute [5,7]; unit 2 released
  //   b2: gather 2 again [7,8], prefetch 0 [8,9]; compute [8,12]
  //   b1: compute [12,16]; b0: compute [16,20]
  const Stage3Pass p =
      stage3_pass(kUnits, kGather, kForward, kBackward, limits(100, 1'000'000'000, 0));
  EXPECT_DOUBLE_EQ(p.forward_s, 7);
  EXPECT_DOUBLE_EQ(p.backward_s, 13);
  EXPECT_DOUBLE_EQ(p.exposed_s, 2);
  EXPECT_EQ(p.gathers, 6);
  EXPECT_EQ(p.peak_live, 300) << "at b2: unit 2, the prefetched unit 1, and unit 0";
}

TEST(Stage3Plan, LiveParametersCapThePrefetch) {
  // max_live 200: at f0 unit 0 is live (100), so 100 more may be chosen; at b2 units 2 and 1
  // are live and nothing more is prefetched: unit 0 waits for its entry.
  const Stage3Pass p = stage3_pass(kUnits, kGather, kForward, kBackward, limits(1000, 200, 0));
  EXPECT_EQ(p.peak_live, 200);
  EXPECT_EQ(p.gathers, 6);
  // f0 [0,1] + prefetch 1 [1,2], compute [1,3]; f1 prefetch 2 [3,4] compute [3,5]; f2 prefetch
  // b1 [5,6], compute [5,7]; b2 gather [7,8], nothing prefetched (200 live), compute [8,12];
  // b1 (unit 2 released: 100 live) prefetches 0 [12,13], computes [12,16]; b0 [16,20].
  EXPECT_DOUBLE_EQ(p.forward_s + p.backward_s, 20);
  EXPECT_DOUBLE_EQ(p.exposed_s, 2);
}

TEST(Stage3Plan, ReuseDistanceKeepsTheLastUnitsGathered) {
  // Unit 2 is used again at once (distance 0), unit 1 after 200 elements (f2, b2), unit 0 after
  // 400. max_reuse_distance 250 keeps units 2 and 1 after forward: 4 gathers, not 6.
  const Stage3Pass p =
      stage3_pass(kUnits, kGather, kForward, kBackward, limits(0, 1'000'000'000, 250));
  EXPECT_EQ(p.gathers, 4);
  EXPECT_EQ(p.peak_live, 200);
  // Forward as without prefetch (9 s); backward: b2 and b1 compute at once, b0 gathers first.
  EXPECT_DOUBLE_EQ(p.forward_s, 9);
  EXPECT_DOUBLE_EQ(p.backward_s, 13);
  EXPECT_DOUBLE_EQ(p.exposed_s, 4);
}

TEST(Stage3Plan, TiedHeadGathersTheEmbeddingsUnitAgain) {
  // Unit 0 runs again as a tied head (3 s forward, 6 s backward), nothing kept or prefetched:
  //   f0 gather [0,1] compute [1,3]; f1 [3,4] [4,6]; f2 [6,7] [7,9]; head: unit 0 again,
  //   gather [9,10] compute [10,13]
  //   head backward: gather [13,14] compute [14,20], kept (the embedding's backward follows);
  //   b2 [20,21] [21,25]; b1 [25,26] [26,30]; b0 still gathered, compute [30,34]
  const TiedHead head{3, 6};
  const Stage3Pass p =
      stage3_pass(kUnits, kGather, kForward, kBackward, limits(0, 1'000'000'000, 0), {}, &head);
  EXPECT_DOUBLE_EQ(p.forward_s, 13);
  EXPECT_DOUBLE_EQ(p.backward_s, 21);
  EXPECT_EQ(p.gathers, 7) << "2 per unit, and the head's in forward";
  EXPECT_DOUBLE_EQ(p.forward_gather_s, 4);
  EXPECT_DOUBLE_EQ(p.backward_gather_s, 3);
  EXPECT_DOUBLE_EQ(p.exposed_s, 7);
  EXPECT_EQ(p.peak_live, 200) << "unit 0 held from the head's backward on";
  // Its reduce-scatter waits for its last backward (the embedding's), not the head's:
  //   b2 compute [21,25] reduce [25,26]; b1 gather [26,27] compute [27,31] reduce [31,32];
  //   b0 compute [31,35] reduce [35,36]
  const Stage3Pass r = stage3_pass(kUnits, kGather, kForward, kBackward,
                                   limits(0, 1'000'000'000, 0), {1, 1, 1}, &head);
  EXPECT_DOUBLE_EQ(r.backward_s, 22);
  EXPECT_DOUBLE_EQ(r.link_free_s, 36);
  // Kept within the reuse distance (the blocks between are 200 elements), the head finds the
  // unit gathered: one gather fewer, as the engine's trace decides.
  const Stage3Pass k =
      stage3_pass(kUnits, kGather, kForward, kBackward, limits(0, 1'000'000'000, 1000), {}, &head);
  EXPECT_LT(k.gathers, p.gathers);
}

// Ψ = 1e9 without a shape: four units of 2.5e8 (reduce_bucket_size), bf16, 8 ranks.
PlanInput billion() {
  PlanInput in;
  in.num_params = 1'000'000'000;
  in.world_size = 8;
  in.micro_batch = 1;
  in.seq_len = 1000;
  in.bucket_elements = 250'000'000;
  return in;
}

Hardware round_hw() {
  Hardware hw;
  hw.peak_flops = 1e15;
  hw.efficiency = 0.5;
  hw.memory_bw = 1e12;
  hw.all_reduce_bw = hw.reduce_scatter_bw = hw.all_gather_bw = 100e9;
  return hw;
}

TEST(Stage3Plan, StepTimeAddsTwoGathersPerUnitAndDropsTheParameterAllGather) {
  PlanInput in = billion();
  in.prefetch_bucket_size = 0;
  in.max_reuse_distance = 0;
  const Hardware hw = round_hw();
  // Without overlap both stages expose every reduce-scatter: only the gathers differ.
  const TimeEstimate s2 = predict_step_time(in, {.stage = 2, .overlap_comm = false}, hw);
  const TimeEstimate s3 = predict_step_time(in, {.stage = 3, .overlap_comm = false}, hw);
  // One unit's all-gather: 2.5e8 bf16 elements on 8 ranks, 7/8 of 5e8 bytes at 100 GB/s.
  const double unit = 7.0 / 8 * 5e8 / 100e9;
  EXPECT_EQ(s3.unit_gathers, 8);
  EXPECT_NEAR(s3.unit_gather_s, 8 * unit, 1e-12);
  EXPECT_NEAR(s3.unit_gather_exposed_s, 8 * unit, 1e-12) << "nothing prefetched";
  // No shape: no root unit; the step's all-gather is only the norm's scalar.
  EXPECT_NEAR(s3.param_gather_s, all_reduce_s(4, 8, hw), 1e-15);
  EXPECT_NEAR(s2.param_gather_s, all_gather_s(2e9, 8, hw) + all_reduce_s(4, 8, hw), 1e-12);
  EXPECT_DOUBLE_EQ(s3.grad_comm_s, s2.grad_comm_s) << "the same reduce-scatters";
  EXPECT_DOUBLE_EQ(s3.optimizer_s, s2.optimizer_s);
  EXPECT_NEAR(s3.step_s - s2.step_s, 8 * unit - all_gather_s(2e9, 8, hw), 1e-12);
  // Accumulation repeats the gathers every micro-step, as the reduce-scatters.
  const TimeEstimate a3 = predict_step_time(in, {.stage = 3, .grad_accum = 2}, hw);
  // With overlap, what of the reduce-scatters is exposed comes from the shared link: here the
  // gathers leave the last unit's (and there is no root) right at backward's end.
  const TimeEstimate o3 = predict_step_time(in, {.stage = 3}, hw);
  EXPECT_NEAR(o3.grad_comm_exposed_s, reduce_scatter_s(2.5e8 * 2, 8, hw), 1e-12);
  EXPECT_NEAR(a3.unit_gather_s, 16 * unit, 1e-12);
  EXPECT_NE(describe_time(s3).find("unit gathers"), std::string::npos) << describe_time(s3);
}

TEST(Stage3Plan, StepTimeCountsTheTiedHeadsSecondGather) {
  // The example GPT at stage 3, nothing kept or prefetched: every gathered unit twice (forward,
  // backward) and the embedding's once more for the tied head in forward, each all-gather
  // (N-1)/N of its bf16 bytes at the bus bandwidth.
  PlanInput in;
  in.shape.layers = 4;
  in.shape.hidden = 512;
  in.shape.vocab = 32000;
  in.world_size = 8;
  in.seq_len = 256;
  in.prefetch_bucket_size = 0;
  in.max_reuse_distance = 0;
  const Hardware hw = round_hw();
  const auto with = [&](bool tied) {
    PlanInput x = in;
    x.shape.tied = tied;
    x.num_params = x.shape.num_params();
    return x;
  };
  const auto step = [&](bool tied) {
    return predict_step_time(with(tied), {.stage = 3, .overlap_comm = false}, hw);
  };
  // The units and the sum of their all-gathers.
  const auto gathers = [&](bool tied) {
    double s = 0;
    const std::vector<int64_t> units = stage3_gathered_units(with(tied));
    for (int64_t u : units) s += all_gather_s(2.0 * static_cast<double>(u), 8, hw);
    return std::pair{static_cast<int64_t>(units.size()), s};
  };
  const TimeEstimate tied = step(true), untied = step(false);
  const auto [k, sum] = gathers(true);
  ASSERT_EQ(stage3_gathered_units(with(true)).front(), 32000 * 512) << "the embedding's unit";
  const double table = all_gather_s(2.0 * 32000 * 512, 8, hw);
  EXPECT_EQ(tied.unit_gathers, 2 * k + 1);
  EXPECT_NEAR(tied.unit_gather_s, 2 * sum + table, 1e-12);
  EXPECT_NEAR(tied.unit_gather_exposed_s, 2 * sum + table, 1e-12) << "nothing prefetched";
  // Untied, the head is a unit of its own, gathered twice like the others.
  const auto [ku, sum_u] = gathers(false);
  EXPECT_EQ(untied.unit_gathers, 2 * ku);
  EXPECT_NEAR(untied.unit_gather_s, 2 * sum_u, 1e-12);
}

TEST(Stage3Plan, PrefetchHidesGathersBehindCompute) {
  // A slow network beside fast compute cannot hide; compute that outlasts each gather hides
  // every gather but the first of each pass direction's chain.
  PlanInput in = billion();
  in.max_reuse_distance = 0;
  Hardware hw = round_hw();
  hw.peak_flops = 1e13;  // forward 0.4 s: 0.1 s per unit, gathers 4.4 ms
  const TimeEstimate off = [&] {
    PlanInput x = in;
    x.prefetch_bucket_size = 0;
    return predict_step_time(x, {.stage = 3}, hw);
  }();
  const TimeEstimate on = predict_step_time(in, {.stage = 3}, hw);
  const double unit = 7.0 / 8 * 5e8 / 100e9;
  // Without prefetch every gather waits, and in backward units 2, 1 and 0 also wait for the
  // reduce-scatter of the unit before them (as many bytes as a gather: bf16 both ways).
  EXPECT_NEAR(off.unit_gather_exposed_s, 8 * unit + 3 * unit, 1e-12);
  // Two gathers wait: the first, and the last unit's again at the start of backward (released
  // after its forward; the prefetch at its entry skipped it, as it was gathered then).
  EXPECT_NEAR(on.unit_gather_exposed_s, 2 * unit, 1e-12);
  EXPECT_LT(on.step_s, off.step_s);
  // Kept for a reuse 1 element away, the last unit is not gathered again: only the first waits.
  in.max_reuse_distance = 1;
  const TimeEstimate kept = predict_step_time(in, {.stage = 3}, hw);
  EXPECT_NEAR(kept.unit_gather_exposed_s, unit, 1e-12);
  EXPECT_EQ(kept.unit_gathers, 7);
}

TEST(Stage3Plan, TransientBytesAreTheLiveUnitsOneUnitsGradientsAndTheGradientPath) {
  PlanInput in = billion();
  in.prefetch_bucket_size = 0;
  in.max_reuse_distance = 0;
  EXPECT_EQ(stage3_transient_bytes(in, 2), 0);
  EXPECT_EQ(stage3_gradient_path_bytes(in, 2), 0);
  // The gradient path stage 3 allocates for backward and the step only: the fp32 gradient shard
  // (1e9 x 4 B / 8) and two bucket buffers with their 1/8 shards, in bf16.
  const int64_t b = bucket_buffer_elements(in, 3);
  const int64_t path = 4 * int64_t{1'000'000'000} / 8 + 2 * 2 * (b + b / 8);
  EXPECT_EQ(stage3_gradient_path_bytes(in, 3), path);
  // Neither is a model state between steps.
  EXPECT_EQ(plan_model_states(in, 3).grads, 0);
  EXPECT_EQ(plan_model_states(in, 3).comm_buffers, 0);
  // One unit gathered, one unit's gradients: 2 x 2.5e8 bf16 elements.
  EXPECT_EQ(stage3_transient_bytes(in, 3), 2 * 2 * 250'000'000 + path);
  in.prefetch_bucket_size = 250'000'000;  // one unit ahead: up to three live (see above)
  EXPECT_EQ(stage3_transient_bytes(in, 3), 2 * (3 + 1) * int64_t{250'000'000} + path);
  // Under optimizer offload the fp32 host shard stays (a model state), the device's buckets go.
  in.offload_optimizer = true;
  EXPECT_EQ(stage3_gradient_path_bytes(in, 3), 2 * 2 * (b + b / 8));
  EXPECT_EQ(plan_model_states(in, 3).grads, 4 * int64_t{1'000'000'000} / 8);
}

PlanInput llama7b(int world) {
  PlanInput in;
  in.shape = {32, 4096, 32, 11008, 32000, false};
  in.num_params = in.shape.num_params();
  in.world_size = world;
  in.micro_batch = 1;
  in.seq_len = 2048;
  return in;
}

TEST(Stage3Plan, AutoReachesStageThreeOnlyWhenNothingElseFits) {
  const PlanInput in = llama7b(8);
  AutoRequest req;
  req.micro_batch = 1;
  // 24 GB: no stage 0-2 setting fits, even with checkpointing; stage 3 does.
  PlanLimits lim;
  lim.device_bytes = 24'000'000'000;
  for (int s = 0; s < 3; ++s)
    ASSERT_GT(rank_device_peak(in, s, Recompute::kCheckpoint), lim.budget()) << s;
  const AutoChoice c = choose_strategy(in, lim, req);
  EXPECT_EQ(c.stage, 3) << c.line;
  EXPECT_EQ(c.bytes, rank_device_peak(in, 3, c.recompute));
  EXPECT_GE(c.bytes, plan_model_states(in, 3).total() + stage3_transient_bytes(in, 3))
      << "the gathered units count";
  EXPECT_NE(c.line.find("no stage 0-2 setting fits"), std::string::npos) << c.line;
  // Where stage 2 fits, stage 3 is not chosen even though it needs less.
  lim.device_bytes = 80'000'000'000;
  EXPECT_LT(choose_strategy(in, lim, req).stage, 3);
  // With stage 3 out (a stage-3 "auto" key unresolved), nothing fits at 24 GB.
  AutoRequest out = req;
  out.stage3_allowed = false;
  lim.device_bytes = 24'000'000'000;
  EXPECT_THROW(choose_strategy(in, lim, out), ConfigError);
  // Stage 3 fixed by the user: the micro-batch is planned for it.
  AutoRequest fixed;
  fixed.stage = 3;
  fixed.checkpointing = true;
  const AutoChoice f = choose_strategy(in, lim, fixed);
  EXPECT_EQ(f.stage, 3);
  EXPECT_GE(f.micro_batch, 1);
}

TEST(Stage3Plan, ParallelSearchOffersStageThreeWithoutPipelines) {
  PlanInput in = llama7b(8);
  in.accumulation = 4;
  PlanLimits lim;
  lim.device_bytes = 80'000'000'000;
  const ParallelSearch s = search_parallel(
      in, lim, [](const ParallelLayout& l) { return parallel_hardware("h100", "ib400", l, 8); });
  bool stage3 = false;
  for (const ParallelCandidate& c : s.fits) {
    if (c.stage != 3) continue;
    stage3 = true;
    EXPECT_EQ(c.layout.pp, 1) << "DeepSpeed refuses ZeRO-3 with pipelines";
    if (c.layout.dp > 1) EXPECT_GT(c.time.unit_gather_s, 0) << "tp " << c.layout.tp;
    PlanInput x = in;
    x.tensor_parallel = c.layout.tp;
    x.micro_batch = c.micro_batch;
    EXPECT_EQ(c.memory.gathered, stage3_transient_bytes(rank_states_input(x, 0), 3));
  }
  EXPECT_TRUE(stage3);
}

}  // namespace
}  // namespace zero
