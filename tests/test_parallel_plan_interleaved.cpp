// The planner with the interleaved 1F1B schedule (pipeline.schedule: interleaved,
// pipeline.virtual_stages v): its bubble against Megatron-LM's (P - 1)/(v·m), the activations
// stage 0 holds against Megatron's count of warm-up micro-batches, the sends per chunk, and the
// layouts it refuses.
#include <gtest/gtest.h>

#include <cmath>
#include <stdexcept>

#include "zero/parallel_plan.hpp"

namespace zero {
namespace {

// 8 layers: P = 4 stages of v = 2 chunks of one layer each; m = 8 micro-batches.
PlanInput interleaved(int p, int v, int64_t m) {
  PlanInput in;
  in.shape = {8, 64, 4, 160, 100, false};
  in.num_params = in.shape.num_params();
  in.world_size = p;
  in.pipeline_stages = p;
  in.micro_batch = 2;
  in.seq_len = 16;
  in.param_bytes = 2;
  in.comm_bytes = 2;
  in.accumulation = m;
  in.schedule = PlanInput::Schedule::kInterleaved;
  in.virtual_stages = v;
  return in;
}

// Free links (so the bubble is the schedule's alone), round compute.
ParallelHardware free_links() {
  Hardware hw;
  hw.peak_flops = 100e12;
  hw.efficiency = 1;
  hw.memory_bw = 1e12;
  hw.all_reduce_bw = hw.reduce_scatter_bw = hw.all_gather_bw = 1e30;
  return {hw, hw, hw};
}

TEST(InterleavedPlan, BubbleIsMegatronsOverVirtualStages) {
  for (int p : {2, 4}) {
    for (int64_t m : {4, 8, 16}) {
      PlanInput one = interleaved(p, 1, m), two = interleaved(p, 2, m);
      one.schedule = PlanInput::Schedule::kOneFOneB;
      const ParallelTime a = predict_parallel_step_time(one, 0, Recompute::kNone, free_links());
      const ParallelTime b = predict_parallel_step_time(two, 0, Recompute::kNone, free_links());
      // Megatron: bubble time / ideal time = (P - 1) / (v·m); as a share of the step,
      // (P - 1) / (v·m + P - 1).
      const double want1 = (p - 1.0) / (m + p - 1.0), want2 = (p - 1.0) / (2.0 * m + p - 1.0);
      EXPECT_NEAR(a.bubble_fraction, want1, 1e-9) << "P " << p << " m " << m;
      EXPECT_NEAR(b.bubble_fraction, want2, 1e-9) << "P " << p << " m " << m;
      EXPECT_LT(b.step_s, a.step_s);
    }
  }
}

TEST(InterleavedPlan, StageZeroHoldsMegatronsWarmUpChunks) {
  // Megatron-LM's interleaved schedule runs (P - s - 1)·2 + (v - 1)·P warm-up chunk forwards
  // on stage s before its first backward, so it holds that plus one chunk's activations; a
  // chunk is 1/v of the stage's layers.
  const int p = 4, v = 2;
  const PlanInput in = interleaved(p, v, 8);
  for (int s = 0; s < p; ++s) {
    const int chunks = (p - s - 1) * 2 + (v - 1) * p + 1;
    EXPECT_EQ(in_flight_micro_batches(in, s), static_cast<int>(std::ceil(chunks / double(v))))
        << "stage " << s;
  }
}

TEST(InterleavedPlan, EachChunkBoundarySends) {
  Hardware hw = free_links().dp;
  hw.all_gather_bw = 1e9;  // the stage link: a send of B bytes takes B / 1e9 s
  const ParallelHardware slow{hw, hw, hw};
  PlanInput one = interleaved(4, 1, 8);
  one.schedule = PlanInput::Schedule::kOneFOneB;
  const double p2p1 = predict_parallel_step_time(one, 0, Recompute::kNone, slow).p2p_s;
  const double p2p2 =
      predict_parallel_step_time(interleaved(4, 2, 8), 0, Recompute::kNone, slow).p2p_s;
  // One activation of b·s·h·p bytes each way per micro-batch, per chunk.
  EXPECT_NEAR(p2p1, 8 * 2 * (2.0 * 16 * 64 * 2 / 1e9), 1e-15);
  EXPECT_NEAR(p2p2, 2 * p2p1, 1e-15);
}

TEST(InterleavedPlan, LayoutsItCannotRunAreRefused) {
  EXPECT_THROW(parallel_layout(interleaved(4, 3, 8)), std::invalid_argument)
      << "4 x 3 chunks do not divide 8 layers";
  EXPECT_THROW(parallel_layout(interleaved(4, 2, 6)), std::invalid_argument)
      << "6 micro-batches are not groups of 4";
  PlanInput cut = interleaved(4, 2, 8);
  cut.partition = PlanInput::Partition::kCompute;
  EXPECT_THROW(predict_parallel_step_time(cut, 0, Recompute::kNone, free_links()),
               std::invalid_argument);
  EXPECT_EQ(parse_schedule("interleaved"), PlanInput::Schedule::kInterleaved);
  EXPECT_STREQ(schedule_name(PlanInput::Schedule::kInterleaved), "interleaved");
}

TEST(InterleavedPlan, SearchKeepsToLayoutsTheScheduleRuns) {
  PlanInput in = interleaved(1, 2, 8);
  in.world_size = 8;
  PlanLimits lim;
  lim.device_bytes = 80'000'000'000;
  const ParallelSearch s = search_parallel(
      in, lim, [](const ParallelLayout& l) { return parallel_hardware("h100", "ib400", l, 8); });
  ASSERT_TRUE(s.found);
  bool pipelined = false;
  for (const ParallelCandidate& c : s.fits) {
    if (c.layout.pp == 1) continue;
    pipelined = true;
    EXPECT_EQ(8 % (c.layout.pp * 2), 0) << "pp " << c.layout.pp;
  }
  EXPECT_TRUE(pipelined);
}

}  // namespace
}  // namespace zero
