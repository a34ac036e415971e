// The time model's numbers for cases worked out by hand (include/zero/time_plan.hpp has the
// formulas), the hardware presets, and the step-time chart's structure.
#include <gtest/gtest.h>

#include <cstdio>
#include <stdexcept>
#include <string>

#include "zero/time_plan.hpp"

namespace zero {
namespace {

// Round numbers: 1e15 FLOP/s at half efficiency, 1 TB/s memory, 100 GB/s bus, no latency.
Hardware round_hw() {
  Hardware hw;
  hw.name = "round";
  hw.peak_flops = 1e15;
  hw.efficiency = 0.5;
  hw.memory_bw = 1e12;
  hw.all_reduce_bw = hw.reduce_scatter_bw = hw.all_gather_bw = 100e9;
  hw.host_bw = 10e9;
  return hw;
}

// Ψ = 1e9 without a shape: 6Ψ FLOPs per token, four equal 2.5e8-element buckets.
PlanInput billion(int world) {
  PlanInput in;
  in.num_params = 1'000'000'000;
  in.world_size = world;
  in.micro_batch = 1;
  in.seq_len = 1000;
  in.bucket_elements = 250'000'000;
  return in;  // bf16 (p = 2, gradients travel in 2 bytes), fp32 accumulation, AdamW
}

TEST(TimePlan, RingCollectivesMoveTheNcclFractions) {
  Hardware hw = round_hw();
  // 1 GB on 8 ranks at 100 GB/s: all-reduce 2·7/8 GB, the others 7/8 GB.
  EXPECT_DOUBLE_EQ(all_reduce_s(1e9, 8, hw), 0.0175);
  EXPECT_DOUBLE_EQ(reduce_scatter_s(1e9, 8, hw), 0.00875);
  EXPECT_DOUBLE_EQ(all_gather_s(1e9, 8, hw), 0.00875);
  EXPECT_EQ(all_reduce_s(1e9, 1, hw), 0.0) << "one rank talks to nobody";
  hw.latency_s = 1e-3;
  EXPECT_DOUBLE_EQ(reduce_scatter_s(1e9, 2, hw), 0.5e9 / 100e9 + 1e-3);
}

TEST(TimePlan, PresetsPickNvlinkInsideANodeAndTheNicAcrossNodes) {
  const Hardware a100 = hardware_preset("a100", "ib200", 8);
  EXPECT_DOUBLE_EQ(a100.peak_flops, 312e12);
  EXPECT_DOUBLE_EQ(a100.all_reduce_bw, 0.8 * 300e9) << "8 ranks fit one node: NVLink";
  const Hardware h100 = hardware_preset("h100", "ib400", 64);
  EXPECT_DOUBLE_EQ(h100.all_reduce_bw, 0.9 * 50e9) << "64 ranks span 8 nodes: 400 Gb/s NICs";
  EXPECT_DOUBLE_EQ(h100.reduce_scatter_bw, h100.all_gather_bw);
  EXPECT_DOUBLE_EQ(hardware_preset("h200", "ib100", 16).all_gather_bw, 0.9 * 12.5e9);
  EXPECT_GT(hardware_preset("h200", "nvlink", 8).memory_bw, h100.memory_bw);
  try {
    hardware_preset("b300", "nvlink", 8);
    FAIL() << "an unknown device must be refused";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("a100, h100, h200"), std::string::npos) << e.what();
  }
  EXPECT_THROW(hardware_preset("h100", "ethernet", 16), std::invalid_argument);
}

TEST(TimePlan, Llama7bFlopsPerToken) {
  PlanInput in;
  in.shape = {32, 4096, 32, 11008, 32000, false};
  in.num_params = in.shape.num_params();
  in.seq_len = 2048;
  // 6·(6,738,415,616 - 32000·4096) + 12·32·4096·2048
  EXPECT_DOUBLE_EQ(model_flops_per_token(in), 6.0 * 6'607'343'616 + 3'221'225'472.0);
  // Checkpointing: every block's forward again, 2·32·202,383,360 + 4·32·4096·2048.
  EXPECT_DOUBLE_EQ(recompute_flops_per_token(in), 12'952'535'040.0 + 1'073'741'824.0);
}

TEST(TimePlan, BucketsOverlapBackwardOneCollectiveAtATime) {
  const std::vector<int64_t> four(4, 1);
  // Ready at 0.25, 0.5, 0.75, 1; each takes 0.1: the last ends at 1.1.
  EXPECT_NEAR(exposed_after_backward(four, {0.1, 0.1, 0.1, 0.1}, 1.0), 0.1, 1e-12);
  // Each takes 0.5: the channel is the bottleneck, 0.25 + 4·0.5 - 1.
  EXPECT_NEAR(exposed_after_backward(four, {0.5, 0.5, 0.5, 0.5}, 1.0), 1.25, 1e-12);
  // One bucket is launched when backward ends: nothing hides.
  EXPECT_NEAR(exposed_after_backward({10}, {0.3}, 1.0), 0.3, 1e-12);
  EXPECT_EQ(bucket_sizes(billion(8)), std::vector<int64_t>(4, 250'000'000));
}

TEST(TimePlan, OptimizerBytesPerStage) {
  PlanInput in;
  in.num_params = 1000;
  in.world_size = 4;
  // Stage 0 updates all 1000: norm 4 + grad 4 + master 8 + states 16 = 32 B, the bf16 copy 2 B,
  // zeroing the fp32 accumulator 4 B.
  EXPECT_DOUBLE_EQ(optimizer_bytes(in, 0), 32 * 1000 + 2 * 1000 + 4 * 1000);
  // Stages 1 and 2 update 250 and zero their 250-element shard.
  EXPECT_DOUBLE_EQ(optimizer_bytes(in, 1), 32 * 250 + 2 * 250 + 4 * 250);
  EXPECT_DOUBLE_EQ(optimizer_bytes(in, 2), 32 * 250 + 2 * 250 + 4 * 250);
  // Under accumulation stage 1 also zeroes its full accumulator.
  in.accumulation = 2;
  EXPECT_DOUBLE_EQ(optimizer_bytes(in, 1), 32 * 250 + 2 * 250 + 4 * 1000 + 4 * 250);
  in.accumulation = 1;
  in.param_bytes = 4;  // fp32: the master is the parameters at every stage, no copy
  EXPECT_DOUBLE_EQ(optimizer_bytes(in, 0), 32 * 1000 + 4 * 1000);
  EXPECT_DOUBLE_EQ(optimizer_bytes(in, 1), 32 * 250 + 4 * 250);
}

TEST(TimePlan, StepTimeOfStage0ByHand) {
  const TimeEstimate t = predict_step_time(billion(8), {.stage = 0}, round_hw());
  // 1000 tokens · 6e9 FLOPs at 5e14 FLOP/s: 0.004 s forward, 0.008 s backward.
  EXPECT_NEAR(t.forward_s, 0.004, 1e-12);
  EXPECT_NEAR(t.backward_s, 0.008, 1e-12);
  // Four all-reduces of 5e8 bytes, 2·7/8·5e8/1e11 = 0.00875 s each, ready every 0.002 s:
  // done at 0.037, 0.029 after backward.
  EXPECT_NEAR(t.grad_comm_s, 0.035, 1e-12);
  EXPECT_NEAR(t.grad_comm_exposed_s, 0.029, 1e-12);
  EXPECT_EQ(t.param_gather_s, 0.0);
  EXPECT_NEAR(t.optimizer_s, 38e9 / 1e12, 1e-12);
  EXPECT_NEAR(t.step_s, 0.012 + 0.029 + 0.038, 1e-12);
  EXPECT_NEAR(t.tokens_per_s, 8000 / 0.079, 1e-6);
  EXPECT_NEAR(t.mfu, 8000 / 0.079 * 6e9 / 8e15, 1e-12);
}

TEST(TimePlan, StepTimeOfStage2ByHand) {
  const TimeEstimate t = predict_step_time(billion(8), {.stage = 2}, round_hw());
  // Reduce-scatters take half, 0.004375 s each: done at 0.006375, 0.01075, 0.015125 and 0.0195,
  // 0.0115 after backward.
  EXPECT_NEAR(t.grad_comm_s, 0.0175, 1e-12);
  EXPECT_NEAR(t.grad_comm_exposed_s, 0.0115, 1e-12);
  // All-gather of 2 GB of bf16 parameters, 7/8 of it, at 100 GB/s (+ the norm's 4 bytes).
  EXPECT_NEAR(t.param_gather_s, 0.0175, 1e-9);
  // 1.25e8 elements: 34 B each, and zeroing the 4-byte shard.
  EXPECT_NEAR(t.optimizer_s, (34 + 4) * 1.25e8 / 1e12, 1e-12);
  EXPECT_NEAR(t.step_s, 0.012 + 0.0115 + 0.0175 + 0.00475, 1e-9);

  // Accumulating 2 micro-steps: stage 2 reduces on both, stage 0 once, overlapping the last.
  const TimeEstimate t2 = predict_step_time(billion(8), {.stage = 2, .grad_accum = 2}, round_hw());
  EXPECT_NEAR(t2.grad_comm_exposed_s, 2 * 0.0115, 1e-12);
  EXPECT_NEAR(t2.step_s, 0.024 + 2 * 0.0115 + 0.0175 + 0.00475, 1e-9);
  const TimeEstimate t0 = predict_step_time(billion(8), {.stage = 0, .grad_accum = 2}, round_hw());
  EXPECT_NEAR(t0.grad_comm_exposed_s, 0.029, 1e-12);
  EXPECT_NEAR(t0.step_s, 0.024 + 0.029 + 0.038, 1e-12);
  // overlap_comm: false exposes all of it.
  const TimeEstimate flat =
      predict_step_time(billion(8), {.stage = 2, .overlap_comm = false}, round_hw());
  EXPECT_NEAR(flat.grad_comm_exposed_s, 0.0175, 1e-12);
}

TEST(TimePlan, RecomputeAndOffloadCostTime) {
  PlanInput in = billion(1);
  const TimeEstimate plain = predict_step_time(in, {.stage = 0}, round_hw());
  const TimeEstimate ckpt =
      predict_step_time(in, {.stage = 0, .recompute = Recompute::kCheckpoint}, round_hw());
  // Without a shape every parameter is recomputed: +2Ψ per token, 1000 · 2e9 / 5e14.
  EXPECT_NEAR(ckpt.recompute_s, 0.004, 1e-12);
  EXPECT_NEAR(ckpt.step_s - plain.step_s, 0.004, 1e-12);
  EXPECT_NEAR(ckpt.mfu * ckpt.step_s, plain.mfu * plain.step_s, 1e-12)
      << "MFU counts model FLOPs only";

  PlanInput s;
  s.shape = {2, 1024, 8, 2048, 1000, false};
  s.num_params = s.shape.num_params();
  s.seq_len = 1000;
  Hardware slow = round_hw();
  slow.host_bw = 1e6;  // so slow the transfer cannot hide
  const TimeEstimate off =
      predict_step_time(s, {.stage = 0, .recompute = Recompute::kCheckpointOffload}, slow);
  // Two blocks' bf16 inputs, out and back: 2 · 2 · 2 B · 1000 tokens · 1024.
  EXPECT_NEAR(off.offload_s, 2.0 * 2 * 2 * 1000 * 1024 / 1e6, 1e-9);
  EXPECT_NEAR(off.offload_exposed_s, off.offload_s - off.compute_s(), 1e-9);
  Hardware fast = round_hw();
  fast.host_bw = 100e9;  // 8 MB in 82 us, under the 0.4 ms of compute
  const TimeEstimate hidden =
      predict_step_time(s, {.stage = 0, .recompute = Recompute::kCheckpointOffload}, fast);
  ASSERT_GT(hidden.compute_s(), hidden.offload_s);
  EXPECT_EQ(hidden.offload_exposed_s, 0.0);
}

TEST(TimePlan, Llama7bAcrossNodesIsSlowerThanInsideOne) {
  PlanInput in;
  in.shape = {32, 4096, 32, 11008, 32000, false};
  in.num_params = in.shape.num_params();
  in.seq_len = 2048;
  in.world_size = 64;
  const TimeEstimate nv =
      predict_step_time(in, {.stage = 2}, hardware_preset("h100", "nvlink", 64));
  const TimeEstimate ib = predict_step_time(in, {.stage = 2}, hardware_preset("h100", "ib400", 64));
  EXPECT_GT(ib.exposed_comm_s(), nv.exposed_comm_s());
  EXPECT_LT(ib.mfu, nv.mfu);
  EXPECT_LT(nv.mfu, 0.5) << "MFU cannot exceed the stated efficiency";
}

// zero_quantized_gradients: int8 codes + one fp32 scale per 2048 elements travel instead of
// bf16, 1 + 4/2048 bytes per element against 2: the gradient reduce-scatters take that
// fraction of the time; the parameter all-gather is unchanged. The planner adds the residual.
TEST(TimePlan, QuantizedGradientsShrinkTheReduceScatter) {
  PlanInput in = billion(8);
  const TimeEstimate bf16 = predict_step_time(in, {.stage = 2}, round_hw());
  in.quantized_bits = 8;
  const TimeEstimate int8 = predict_step_time(in, {.stage = 2}, round_hw());
  EXPECT_NEAR(int8.grad_comm_s, bf16.grad_comm_s * (1 + 4.0 / 2048) / 2, 1e-12);
  EXPECT_DOUBLE_EQ(int8.param_gather_s, bf16.param_gather_s);
  in.quantized_bits = 4;
  const TimeEstimate int4 = predict_step_time(in, {.stage = 2}, round_hw());
  EXPECT_NEAR(int4.grad_comm_s, bf16.grad_comm_s * (0.5 + 4.0 / 2048) / 2, 1e-12);
  // Stage 0 all-reduces full gradients: the key does not apply.
  PlanInput s0 = billion(8);
  const double plain0 = predict_step_time(s0, {.stage = 0}, round_hw()).grad_comm_s;
  s0.quantized_bits = 8;
  EXPECT_DOUBLE_EQ(predict_step_time(s0, {.stage = 0}, round_hw()).grad_comm_s, plain0);
  // Error feedback's residual on top of the bucket buffers: by default in the dtype gradients
  // travel in (bf16 here: 2 bytes per parameter, not fp32's 4), fp32 or int8 codes with one
  // fp32 scale per block when asked; nothing when off.
  PlanInput m = billion(8);
  ASSERT_EQ(m.comm_bytes, 2);
  const int64_t before = plan_model_states(m, 2).comm_buffers;
  m.quantized_bits = 8;
  EXPECT_EQ(plan_model_states(m, 2).comm_buffers - before, 2 * m.num_params);
  EXPECT_EQ(error_feedback_bytes(m, 2), 2 * m.num_params);
  m.error_feedback_store_bytes = 4;
  EXPECT_EQ(plan_model_states(m, 2).comm_buffers - before, 4 * m.num_params);
  m.error_feedback_store_bytes = 1;
  const int64_t blocks = (m.num_params + 2047) / 2048;
  EXPECT_EQ(plan_model_states(m, 2).comm_buffers - before, blocks * (2048 + 4));
  EXPECT_EQ(error_feedback_bytes(m, 0), 0) << "stage 0 does not quantize";
  m.error_feedback = false;
  EXPECT_EQ(plan_model_states(m, 2).comm_buffers, before);
  EXPECT_EQ(error_feedback_bytes(m, 2), 0);
}

// Hierarchical qgZ (zero_quantized_gradients_hierarchical, on by default): 8 ranks as 2 nodes of
// 4; the within-node all-to-all sends 3/4 of a bucket's B' = 1 + 4/2048 bytes per element at the
// intra-node bandwidth, the across-node one 1/2 of B'/4 at the inter-node one. Off, or without
// a node size, one flat all-to-all sends 7/8 of B' over the slow link.
TEST(TimePlan, HierarchicalQuantizedSplitsWithinAndAcrossNodes) {
  PlanInput in = billion(8);
  in.quantized_bits = 8;
  Hardware hw = round_hw();  // 100 GB/s across nodes, no latency
  const double per_element = 1 + 4.0 / 2048;
  const double flat = 4 * 7.0 / 8 * 2.5e8 * per_element / 100e9;  // four buckets
  EXPECT_NEAR(predict_step_time(in, {.stage = 2}, hw).grad_comm_s, flat, 1e-12);
  hw.ranks_per_node = 4;
  hw.intra_node_bw = 400e9;
  const double within = 3.0 / 4 * 2.5e8 * per_element / 400e9;
  const double across = 1.0 / 2 * 2.5e8 * per_element / 4 / 100e9;
  EXPECT_NEAR(predict_step_time(in, {.stage = 2}, hw).grad_comm_s, 4 * (within + across), 1e-12);
  in.quantized_hierarchical = false;
  EXPECT_NEAR(predict_step_time(in, {.stage = 2}, hw).grad_comm_s, flat, 1e-12);
  // One node: nothing to split.
  in.quantized_hierarchical = true;
  hw.ranks_per_node = 8;
  EXPECT_NEAR(predict_step_time(in, {.stage = 2}, hw).grad_comm_s, flat, 1e-12);
  // The presets know the node: h100 over ib100, 32 ranks as 4 x 8.
  const Hardware ib = hardware_preset("h100", "ib100", 32);
  EXPECT_EQ(ib.ranks_per_node, 8);
  EXPECT_GT(ib.intra_node_bw, ib.reduce_scatter_bw);
}

// The case: LLaMA-7B on 4 nodes x 8 H100s over one 100 Gb/s NIC per GPU, stage 2, bf16.
// Compression shortens the exposed gradient communication and raises MFU.
TEST(TimePlan, Llama7bOver100GbpsWithAndWithoutCompression) {
  PlanInput in;
  in.shape = {32, 4096, 32, 11008, 32000, false};
  in.num_params = in.shape.num_params();
  in.seq_len = 2048;
  in.world_size = 32;
  in.bucket_elements = 500'000'000;
  const Hardware hw = hardware_preset("h100", "ib100", 32);
  const TimeEstimate plain = predict_step_time(in, {.stage = 2}, hw);
  in.quantized_bits = 8;
  const TimeEstimate int8 = predict_step_time(in, {.stage = 2}, hw);
  in.quantized_bits = 4;
  const TimeEstimate int4 = predict_step_time(in, {.stage = 2}, hw);
  // The flat exchange (zero_quantized_gradients_hierarchical: false): every byte over the NIC.
  in.quantized_hierarchical = false;
  const TimeEstimate int4_flat = predict_step_time(in, {.stage = 2}, hw);
  in.quantized_bits = 8;
  const TimeEstimate int8_flat = predict_step_time(in, {.stage = 2}, hw);
  std::printf("flat: int8 %.3f s (%.3f, %.3f) MFU %.1f%%; int4 %.3f s (%.3f, %.3f) MFU %.1f%%\n",
              int8_flat.step_s, int8_flat.grad_comm_s, int8_flat.grad_comm_exposed_s,
              100 * int8_flat.mfu, int4_flat.step_s, int4_flat.grad_comm_s,
              int4_flat.grad_comm_exposed_s, 100 * int4_flat.mfu);
  EXPECT_LT(int8.grad_comm_s, int8_flat.grad_comm_s);
  EXPECT_LT(int4.grad_comm_s, int4_flat.grad_comm_s);
  std::printf(
      "LLaMA-7B, 4x8 H100, ib100, stage 2: step %.3f s (grad comm %.3f, exposed %.3f), "
      "MFU %.1f%%; int8 %.3f s (%.3f, %.3f) MFU %.1f%%; int4 %.3f s (%.3f, %.3f) MFU "
      "%.1f%%\n",
      plain.step_s, plain.grad_comm_s, plain.grad_comm_exposed_s, 100 * plain.mfu, int8.step_s,
      int8.grad_comm_s, int8.grad_comm_exposed_s, 100 * int8.mfu, int4.step_s, int4.grad_comm_s,
      int4.grad_comm_exposed_s, 100 * int4.mfu);
  EXPECT_LT(int8.grad_comm_exposed_s, plain.grad_comm_exposed_s);
  EXPECT_LT(int4.step_s, int8.step_s);
  EXPECT_GT(int8.mfu, plain.mfu);
}

TEST(TimePlan, SvgHasOneRectPerNonzeroSegment) {
  const TimeEstimate t0 = predict_step_time(billion(8), {.stage = 0}, round_hw());
  const TimeEstimate t2 = predict_step_time(billion(8), {.stage = 2}, round_hw());
  const std::string svg = time_chart_svg("t", "s", {{"stage 0", t0}, {"stage 2", t2}});
  auto count = [&](const std::string& what) {
    int n = 0;
    for (size_t at = svg.find(what); at != std::string::npos; at = svg.find(what, at + 1)) ++n;
    return n;
  };
  // forward, backward, exposed comm, optimizer; stage 2 adds the all-gather.
  EXPECT_EQ(count("<rect"), 4 + 5);
  EXPECT_EQ(count("<circle"), 5);
  EXPECT_NE(svg.find("predicted step time (ms)"), std::string::npos);
  EXPECT_EQ(count("stroke-dasharray"), 0) << "no limit line for time";
}

}  // namespace
}  // namespace zero
