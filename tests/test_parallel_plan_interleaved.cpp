// The planner with the interleaved 1F1B schedule (pipeline.schedule: interleaved,
// pipeline.virtual_stages v): its bubble against Megatron-LM's (P - 1)/(v·m), the activations
// stage 0 holds against Megatron's count of warm-up micro-batches, the sends per chunk, the
// layouts it refuses, and chunks cut by compute (pipeline.partition) timed each by its layers
// against the hand-written schedule of support/interleaved_by_hand.hpp.
#include <gtest/gtest.h>

#include <cmath>
#include <stdexcept>
#include <string>
#include <vector>

#include "support/interleaved_by_hand.hpp"
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
  // With a runtime partition the chunks need not be equal: P·v need not divide the 8 blocks,
  // but each of the P·v chunks of [embedding, 8 blocks, head] needs a layer (the runtime's rule).
  PlanInput cut = interleaved(2, 3, 8);
  EXPECT_THROW(parallel_layout(cut), std::invalid_argument) << "6 equal chunks of 8 blocks";
  cut.partition = PlanInput::Partition::kCompute;
  EXPECT_NO_THROW(predict_parallel_step_time(cut, 0, Recompute::kNone, free_links()));
  cut = interleaved(4, 3, 8);
  cut.partition = PlanInput::Partition::kParameters;
  try {
    parallel_layout(cut);
    FAIL() << "12 chunks of 10 layers";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("every chunk needs a layer"), std::string::npos)
        << e.what();
  }
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
  // Cut by compute, the chunks are timed as cut: the search plans them too (before, the time
  // model refused the interleaved schedule with any partition but equal).
  in.partition = PlanInput::Partition::kCompute;
  const ParallelSearch cut = search_parallel(
      in, lim, [](const ParallelLayout& l) { return parallel_hardware("h100", "ib400", l, 8); });
  ASSERT_TRUE(cut.found);
  pipelined = false;
  for (const ParallelCandidate& c : cut.fits) pipelined = pipelined || c.layout.pp > 1;
  EXPECT_TRUE(pipelined);
}

// P = 2, v = 2 cut by compute: [embedding, 8 blocks, head] into 4 chunks by the FLOPs per token
// of test_parallel_plan.cpp (a block 295680, the head with its loss 39584, the embedding 64).
// The largest chunk cannot be under 2 blocks + head (630944: any chunk of 3 blocks is 887040),
// and under that cap the first chunks take embedding + 2 blocks, 2, 2: bounds 0, 3, 5, 7, 10.
// Stage 0 runs virtual stages 0 and 2 (e + 2b, 2b), stage 1 virtual stages 1 and 3 (2b,
// 2b + head). Each chunk's forward is its FLOPs x tokens / 3 / peak plus one send, its backward
// twice the compute plus one send; the step is the hand-written schedule's makespan over those
// times, and the bubble the slower stage 1's idle time in it.
TEST(InterleavedPlan, ChunksCutByComputeAreTimedByTheirOwnLayers) {
  const double e = 64, b = 295680, hd = 39584, peak = 100e12, bw = 100e9, lat = 1e-6;
  Hardware hw;
  hw.peak_flops = peak;
  hw.efficiency = 1;
  hw.memory_bw = 1e12;
  hw.all_reduce_bw = hw.reduce_scatter_bw = hw.all_gather_bw = bw;
  hw.latency_s = lat;
  for (int64_t m : {2, 4}) {
    PlanInput in = interleaved(2, 2, m);  // D = 1: no data-parallel collectives
    in.partition = PlanInput::Partition::kCompute;
    EXPECT_EQ(pipeline_stage_bounds(in), (std::vector<int>{0, 3, 5, 7, 10}));
    EXPECT_EQ(stage_flops_per_token(in), (std::vector<double>{e + 4 * b, 4 * b + hd}));
    const double tokens = 2 * 16, send = tokens * 64 * 2 / bw + lat;
    const std::vector<double> flops = {e + 2 * b, 2 * b, 2 * b, 2 * b + hd};  // by virtual stage
    std::vector<double> f, bw_;
    for (double x : flops) {
      f.push_back(tokens * x / 3 / peak + send);
      bw_.push_back(2 * tokens * x / 3 / peak + send);
    }
    const double makespan =
        testing::hand_timing(testing::interleaved_p2v2_by_hand(static_cast<int>(m)), f, bw_)
            .makespan;
    const ParallelTime got = predict_parallel_step_time(in, 0, Recompute::kNone, {hw, hw, hw});
    const double tol = 1e-12 * makespan;
    EXPECT_EQ(got.slowest_stage, 1);
    ASSERT_EQ(got.stage_compute_s.size(), 2u);
    EXPECT_NEAR(got.stage_compute_s[0], m * tokens * (e + 4 * b) / peak, tol);
    EXPECT_NEAR(got.stage_compute_s[1], m * tokens * (4 * b + hd) / peak, tol);
    EXPECT_NEAR(got.forward_s + got.backward_s, m * tokens * (4 * b + hd) / peak, tol);
    EXPECT_NEAR(got.p2p_s, m * 2 * 2 * send, tol) << "one send each way per chunk";
    EXPECT_NEAR(got.bubble_s, makespan - m * (f[1] + f[3] + bw_[1] + bw_[3]), tol);
    EXPECT_NEAR(got.step_s - got.optimizer_s, makespan, tol) << "m " << m;
    // The equal-chunk plan of the same layout times L / (P·v) blocks per chunk and nothing
    // else: the compute cut's step is longer by the embedding and the head it counts.
    PlanInput equal = in;
    equal.partition = PlanInput::Partition::kEqual;
    EXPECT_LT(predict_parallel_step_time(equal, 0, Recompute::kNone, {hw, hw, hw}).step_s,
              got.step_s);
  }
}

}  // namespace
}  // namespace zero
