// The trainer's bottleneck verdict from synthetic timings: one case per verdict, the fractions
// it reports, and the knob it names.
#include <gtest/gtest.h>

#include <string>

#include "bottleneck.hpp"

namespace zero::examples {
namespace {

StepTimes times(double data, double fwd, double bwd, double comm, double opt) {
  StepTimes t;
  t.data_s = data, t.forward_s = fwd, t.backward_s = bwd, t.comm_exposed_s = comm;
  t.optimizer_s = opt;
  t.step_s = data + fwd + bwd + comm + opt;
  return t;
}

RunShape shape(int stage, int64_t used = 0, int64_t budget = 0) {
  RunShape r;
  r.stage = stage;
  r.world_size = 4;
  r.grad_accum = 1;
  r.micro_batch = 8;
  r.buckets = 6;
  r.memory_used = used;
  r.memory_budget = budget;
  return r;
}

bool has(const std::string& text, const std::string& what) {
  return text.find(what) != std::string::npos;
}

TEST(Bottleneck, WaitingForDataIsIoBound) {
  const Verdict v = diagnose(times(0.3, 0.2, 0.4, 0.05, 0.05), shape(2));
  EXPECT_EQ(v.kind, Bottleneck::kIo);
  EXPECT_DOUBLE_EQ(v.data, 0.3);
  EXPECT_DOUBLE_EQ(v.compute, 0.6);
  EXPECT_NEAR(v.other, 0.0, 1e-12);
  EXPECT_TRUE(has(v.knob, "loader workers")) << v.knob;
  EXPECT_TRUE(has(v.line(), "IO-bound")) << v.line();
  EXPECT_TRUE(has(v.line(), "memory headroom unknown")) << v.line();
}

TEST(Bottleneck, ExposedCommunicationIsCommunicationBound) {
  const Verdict v = diagnose(times(0.0, 0.1, 0.2, 0.6, 0.1), shape(1));
  EXPECT_EQ(v.kind, Bottleneck::kCommunication);
  EXPECT_DOUBLE_EQ(v.comm, 0.6);
  EXPECT_TRUE(has(v.knob, "gradient_accumulation_steps")) << v.knob;
  EXPECT_TRUE(has(v.knob, "bigger reduce_bucket_size")) << v.knob;
  // Stage 2 under accumulation reduces every micro-step: the advice names stage 1.
  RunShape r = shape(2);
  r.grad_accum = 4;
  r.buckets = 1;
  const Verdict v2 = diagnose(times(0.0, 0.1, 0.2, 0.6, 0.1), r);
  EXPECT_TRUE(has(v2.knob, "stage 1")) << v2.knob;
  EXPECT_TRUE(has(v2.knob, "one gradient bucket")) << v2.knob;
}

TEST(Bottleneck, ASlowOptimizerStepIsMemoryBoundAndStage0ShouldShard) {
  const Verdict v = diagnose(times(0.0, 0.2, 0.4, 0.0, 0.4), shape(0));
  EXPECT_EQ(v.kind, Bottleneck::kMemory);
  EXPECT_NEAR(v.optimizer, 0.4, 1e-12);
  EXPECT_TRUE(has(v.reason, "memory bandwidth")) << v.reason;
  EXPECT_TRUE(has(v.knob, "1/4 of the parameters")) << v.knob;
  // Already sharded: amortise it instead.
  EXPECT_TRUE(
      has(diagnose(times(0.0, 0.2, 0.4, 0.0, 0.4), shape(2)).knob, "gradient_accumulation_steps"));
}

TEST(Bottleneck, AFullDeviceIsMemoryBound) {
  // Compute dominates the time, but 95 of 100 GB are used: no room for a larger micro-batch.
  const Verdict v = diagnose(times(0.0, 0.3, 0.6, 0.05, 0.05), shape(1, 95, 100));
  EXPECT_EQ(v.kind, Bottleneck::kMemory);
  EXPECT_NEAR(v.memory_headroom, 0.05, 1e-12);
  EXPECT_TRUE(has(v.knob, "ZeRO stage 2")) << v.knob;
  RunShape r = shape(2, 95, 100);
  EXPECT_TRUE(has(diagnose(times(0.0, 0.3, 0.6, 0.05, 0.05), r).knob, "checkpointing"));
  // On CPU the process's RSS before the model (libraries) is not the run's: 45 of 100 used.
  r.memory_baseline = 50;
  const Verdict cpu = diagnose(times(0.0, 0.3, 0.6, 0.05, 0.05), r);
  EXPECT_NEAR(cpu.memory_headroom, 0.55, 1e-12);
  EXPECT_EQ(cpu.kind, Bottleneck::kCompute);
}

TEST(Bottleneck, OtherwiseComputeBound) {
  const Verdict v = diagnose(times(0.01, 0.3, 0.6, 0.05, 0.04), shape(2, 20, 100));
  EXPECT_EQ(v.kind, Bottleneck::kCompute);
  EXPECT_NEAR(v.compute, 0.9, 1e-12);
  EXPECT_NEAR(v.memory_headroom, 0.8, 1e-12);
  EXPECT_TRUE(has(v.knob, "larger micro-batch")) << v.knob;
  EXPECT_TRUE(has(v.line(), "80% of memory free")) << v.line();
  // The largest share above its threshold decides: communication 30% beats data 12%.
  EXPECT_EQ(diagnose(times(0.12, 0.2, 0.3, 0.3, 0.08), shape(2)).kind, Bottleneck::kCommunication);
}

}  // namespace
}  // namespace zero::examples
