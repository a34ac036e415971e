// The trainer's bottleneck verdict from synthetic timings: one case per verdict, the fractions
// it reports, and the knob it names.
#include <ATen/Parallel.h>
#include <gtest/gtest.h>

#include <time.h>

#include <chrono>
#include <string>
#include <thread>

#include "bottleneck.hpp"
#include "utilisation.hpp"

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

// Issue 25: a communication-bound run is told to compress its gradients first, with the key to
// set and what it costs; a run already at int8 is told int4; int4 and one rank get no such advice.
TEST(Bottleneck, CommunicationBoundRecommendsQuantizedGradients) {
  RunShape r = shape(2);
  r.comm_bits = 16;
  const Verdict v = diagnose(times(0.0, 0.1, 0.2, 0.6, 0.1), r);
  EXPECT_EQ(v.kind, Bottleneck::kCommunication);
  EXPECT_EQ(v.knob.rfind("zero_optimization.zero_quantized_gradients: true", 0), 0u) << v.knob;
  EXPECT_TRUE(has(v.knob, "2.0x fewer gradient bytes than the 16 bits")) << v.knob;
  EXPECT_TRUE(has(v.knob, "4 bytes per parameter of residual memory")) << v.knob;
  EXPECT_TRUE(has(v.knob, "gradient_accumulation_steps")) << v.knob;  // the older advice stays
  r.comm_bits = 32;
  EXPECT_TRUE(has(diagnose(times(0.0, 0.1, 0.2, 0.6, 0.1), r).knob, "4.0x fewer")) << v.knob;
  r.stage = 0;
  EXPECT_TRUE(has(diagnose(times(0.0, 0.1, 0.2, 0.6, 0.1), r).knob,
                  "zero_optimization.stage: 1 or 2 with zero_quantized_gradients: true"));
  r.stage = 2;
  r.comm_bits = 8;
  EXPECT_TRUE(
      has(diagnose(times(0.0, 0.1, 0.2, 0.6, 0.1), r).knob, "zero_quantized_gradients_bits: 4"));
  r.comm_bits = 4;
  EXPECT_FALSE(has(diagnose(times(0.0, 0.1, 0.2, 0.6, 0.1), r).knob, "zero_quantized"));
  // Not communication-bound: no compression advice.
  r.comm_bits = 32;
  EXPECT_FALSE(has(diagnose(times(0.0, 0.4, 0.5, 0.05, 0.05), r).knob, "zero_quantized"));
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

TEST(Bottleneck, AComputeBoundRunWithAnIdleDeviceSaysSo) {
  StepTimes t = times(0.0, 0.3, 0.6, 0.02, 0.02);
  t.utilisation = 0.6;
  const Verdict v = diagnose(t, shape(2));
  EXPECT_EQ(v.kind, Bottleneck::kCompute);
  EXPECT_NE(v.reason.find("busy only 60% of the time (< 85%)"), std::string::npos) << v.reason;
  EXPECT_NE(v.knob.find("larger micro-batch (now 8)"), std::string::npos) << v.knob;
  EXPECT_NE(v.line().find("utilisation 60%"), std::string::npos) << v.line();
  RunShape on_cpu = shape(2);
  on_cpu.cpu = true;
  EXPECT_NE(diagnose(t, on_cpu).knob.find("OMP_NUM_THREADS"), std::string::npos);
  // A busy device keeps the plain compute advice; unknown utilisation is not printed.
  t.utilisation = 0.95;
  EXPECT_EQ(diagnose(t, shape(2)).reason.find("busy only"), std::string::npos);
  t.utilisation = -1;
  EXPECT_EQ(diagnose(t, shape(2)).line().find("utilisation"), std::string::npos);
}

// The CPU meter against an independent clock (CLOCK_PROCESS_CPUTIME_ID over the same interval):
// a thread spinning reads as what the clock says it got (on a loaded machine less than a core),
// the same thread asleep as idle (one intra-op thread, so the fraction is of one core).
TEST(Utilisation, CpuMeterFollowsTheProcessClock) {
  at::set_num_threads(1);
  auto cpu_clock = [] {
    timespec ts{};
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
  };
  auto wall = [] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
        .count();
  };
  UtilisationMeter m(c10::Device(c10::kCPU));
  EXPECT_EQ(m.source(), "cpu (1 threads)");
  m.sample();
  const double c0 = cpu_clock(), w0 = wall();
  volatile double x = 0;
  while (wall() < w0 + 0.5) x = x + 1;
  const double busy = m.sample();
  const double want = (cpu_clock() - c0) / (wall() - w0);
  std::this_thread::sleep_for(std::chrono::milliseconds(400));
  const double idle = m.sample();
  std::printf("spinning: %.3f (process clock %.3f), sleeping: %.3f\n", busy, want, idle);
  EXPECT_NEAR(busy, want, 0.05);  // getrusage ticks are coarser than the clock
  EXPECT_LT(idle, 0.05);
  EXPECT_GT(busy, idle);
}

}  // namespace
}  // namespace zero::examples
