// The planner under tensor and pipeline parallelism (include/zero/parallel_plan.hpp) against
// formulas written out here by hand from Megatron-LM's split and Korthikanti et al. 2022, and
// against memory_plan.hpp / time_plan.hpp at T = P = 1.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <vector>

#include "zero/parallel_plan.hpp"

namespace zero {
namespace {

// A small LLaMA-style shape; every count below is small enough to check by hand.
PlanInput small(int world, int t, int p) {
  PlanInput in;
  in.shape = {8, 64, 4, 160, 100, false};
  in.num_params = in.shape.num_params();
  in.world_size = world;
  in.tensor_parallel = t;
  in.pipeline_stages = p;
  in.micro_batch = 2;
  in.seq_len = 16;
  in.param_bytes = 2;
  in.grad_accum_bytes = 4;
  in.comm_bytes = 2;
  in.accumulation = 8;
  return in;
}

TEST(ParallelLayout, DataParallelIsWhatIsLeft) {
  const ParallelLayout l = parallel_layout(small(64, 4, 2));
  EXPECT_EQ(l.tp, 4);
  EXPECT_EQ(l.pp, 2);
  EXPECT_EQ(l.dp, 8);
}

TEST(ParallelLayout, ErrorsNameTheNumbers) {
  try {
    parallel_layout(small(12, 8, 1));
    FAIL() << "12 ranks cannot hold T = 8";
  } catch (const std::invalid_argument& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("12"), std::string::npos) << what;
    EXPECT_NE(what.find("8 x 1"), std::string::npos) << what;
  }
  EXPECT_THROW(parallel_layout(small(6, 1, 3)), std::invalid_argument);  // 3 does not divide 8
  EXPECT_THROW(parse_schedule("zigzag"), std::invalid_argument);
  EXPECT_EQ(parse_schedule("gpipe"), PlanInput::Schedule::kGPipe);
}

TEST(ParallelMemory, RankParametersFollowMegatronsSplit) {
  const int64_t h = 64, f = 160, v = 100, layers = 8;
  for (int t : {1, 2, 4}) {
    for (int p : {1, 2, 4}) {
      const PlanInput in = small(t * p, t, p);
      const int64_t block = (4 * h * h + 3 * h * f) / t + 2 * h;
      const int64_t first = layers / p * block + v * h / t + (p == 1 ? v * h / t + h : 0);
      const int64_t last = layers / p * block + v * h / t + h;
      EXPECT_EQ(rank_params(in, 0), first) << "T " << t << " P " << p;
      EXPECT_EQ(rank_params(in, p - 1), p == 1 ? first : last) << "T " << t << " P " << p;
      // Over all stages and tensor ranks: the model, plus the replicated norms T - 1 times.
      int64_t sum = 0;
      for (int s = 0; s < p; ++s) sum += t * rank_params(in, s);
      if (t > 1 || p > 1) EXPECT_EQ(sum, in.num_params + (t - 1) * (2 * h * layers + h));
    }
  }
}

TEST(ParallelMemory, UnchangedWithoutModelParallelism) {
  PlanInput in = small(8, 1, 1);
  for (int stage = 0; stage < 3; ++stage) {
    for (Recompute r : {Recompute::kNone, Recompute::kCheckpoint, Recompute::kCheckpointOffload}) {
      const RankPlan rp = plan_parallel_rank(in, stage, r);
      EXPECT_EQ(rp.total(),
                plan_model_states(in, stage).total() + predict_activations(in, r).peak());
    }
  }
}

// Korthikanti's split of memory_plan.hpp's block, written out: with b = 2, s = 16, h = 64,
// a = 4, f = 160, p = 2 bytes.
double hand_block(double t, bool sp) {
  const double s = 16, b = 2, h = 64, a = 4, f = 160, p = 2, tsp = sp ? t : 1;
  const double inside = 4 * p * s * b * h + 4 * p * s * b * f + 4 * a * s * b;
  const double around = 2 * p * s * b * h + 2 * (4 + p) * s * b * h + 8 * s * b;
  return inside / t + around / tsp;
}

TEST(ParallelMemory, ActivationsSplitAsKorthikanti) {
  const double s = 16, b = 2, h = 64, v = 100, p = 2, layers = 8;
  for (bool sp : {false, true}) {
    for (int t : {1, 2, 4}) {
      PlanInput in = small(t, t, 1);
      in.sequence_parallel = sp;
      const double tsp = sp ? t : 1;
      const double head = 8 * s * b + (s * b * h * (4 + p) + 4 * s * b) / tsp + p * s * b * h;
      const double loss = 12 * s * b * v / t;
      const ActivationEstimate none = predict_stage_activations(in, Recompute::kNone, 0);
      EXPECT_NEAR(static_cast<double>(none.peak()), layers * hand_block(t, sp) + head + loss,
                  layers + 4)
          << "T " << t << " SP " << sp;
      const ActivationEstimate ckpt = predict_stage_activations(in, Recompute::kCheckpoint, 0);
      EXPECT_NEAR(static_cast<double>(ckpt.peak()),
                  layers * p * s * b * h / tsp + std::max(head + loss, hand_block(t, sp)), 4);
    }
  }
}

TEST(ParallelMemory, PipelineFirstStageHoldsItsInFlightMicroBatches) {
  const double s = 16, b = 2, h = 64, p = 2;
  for (auto kind : {PlanInput::Schedule::kOneFOneB, PlanInput::Schedule::kGPipe}) {
    for (int64_t m : {2, 8}) {
      PlanInput in = small(8, 2, 4);  // 2 layers per stage
      in.schedule = kind;
      in.accumulation = m;
      // 1F1B: stage 0 warms up with P forwards (fewer when m < P); GPipe: all m.
      const double k = kind == PlanInput::Schedule::kGPipe ? m : std::min<int64_t>(4, m);
      EXPECT_EQ(in_flight_micro_batches(in, 0), k);
      const ActivationEstimate a = predict_stage_activations(in, Recompute::kNone, 0);
      EXPECT_NEAR(static_cast<double>(a.peak()), k * 2 * hand_block(2, false) + k * 8 * s * b,
                  4 * k);
      const ActivationEstimate c = predict_stage_activations(in, Recompute::kCheckpoint, 0);
      EXPECT_NEAR(static_cast<double>(c.blocks), k * 2 * p * s * b * h, 1);
      // The worst rank is stage 0 or the last: never below either.
      const RankPlan worst = plan_parallel_rank(in, 1, Recompute::kNone);
      for (int st : {0, 3}) {
        PlanInput x = in;
        x.num_params = rank_params(in, st);
        x.world_size = 1;  // D = 8 / (2 x 4)
        const int64_t total = plan_model_states(x, 1).total() +
                              predict_stage_activations(in, Recompute::kNone, st).peak();
        EXPECT_GE(worst.total(), total);
      }
    }
  }
}

TEST(ParallelMemory, LastStageHoldsTheHeadAndTheVocabularyParallelLoss) {
  const double s = 16, b = 2, h = 64, v = 100, p = 2;
  for (auto kind : {PlanInput::Schedule::kOneFOneB, PlanInput::Schedule::kGPipe}) {
    PlanInput in = small(8, 2, 4);
    in.schedule = kind;
    in.sequence_parallel = true;
    // 1F1B: the last stage runs each micro-batch's backward right after its forward; GPipe
    // keeps all 8, and the log-probabilities (4 bytes a logit) of all but the first backward's.
    const double k = kind == PlanInput::Schedule::kGPipe ? 8 : 1;
    EXPECT_EQ(in_flight_micro_batches(in, 3), k);
    const ActivationEstimate a = predict_stage_activations(in, Recompute::kNone, 3);
    const double head = k * ((s * b * h * (4 + p) + 4 * s * b) / 2 + p * s * b * h);
    EXPECT_NEAR(static_cast<double>(a.head), head, k);
    EXPECT_NEAR(static_cast<double>(a.loss), 12 * s * b * v / 2 + (k - 1) * 4 * s * b * v / 2, k);
    EXPECT_NEAR(static_cast<double>(a.blocks), k * 2 * hand_block(2, true), 2 * k);
  }
}

// Round numbers: 100 TFLOP/s at efficiency 1, 100 GB/s links, 1 us latency.
ParallelHardware round_hardware() {
  Hardware hw;
  hw.name = "round";
  hw.peak_flops = 100e12;
  hw.efficiency = 1;
  hw.memory_bw = 1e12;
  hw.all_reduce_bw = hw.reduce_scatter_bw = hw.all_gather_bw = 100e9;
  hw.latency_s = 1e-6;
  hw.host_bw = 10e9;
  return {hw, hw, hw};
}

TEST(ParallelTime, UnchangedWithoutModelParallelism) {
  PlanInput in = small(8, 1, 1);
  const ParallelHardware hw = round_hardware();
  for (int stage = 0; stage < 3; ++stage) {
    for (Recompute r : {Recompute::kNone, Recompute::kCheckpoint}) {
      StepShape step;
      step.stage = stage;
      step.recompute = r;
      step.grad_accum = in.accumulation;
      const TimeEstimate want = predict_step_time(in, step, hw.dp);
      const ParallelTime got = predict_parallel_step_time(in, stage, r, hw);
      EXPECT_NEAR(got.step_s, want.step_s, 1e-12 * want.step_s);
      EXPECT_NEAR(got.mfu, want.mfu, 1e-9);
      EXPECT_NEAR(got.grad_comm_exposed_s, want.grad_comm_exposed_s, 1e-15);
    }
  }
}

TEST(ParallelTime, QuantizedGradientsUnchangedWithoutModelParallelism) {
  PlanInput in = small(8, 1, 1);
  in.quantized_bits = 8;
  in.quantized_block = 256;
  StepShape step;
  step.stage = 2;
  step.grad_accum = in.accumulation;
  const TimeEstimate want = predict_step_time(in, step, round_hardware().dp);
  const ParallelTime got = predict_parallel_step_time(in, 2, Recompute::kNone, round_hardware());
  EXPECT_NEAR(got.grad_comm_s, want.grad_comm_s, 1e-15);
  EXPECT_NEAR(got.step_s, want.step_s, 1e-12 * want.step_s);
}

TEST(ParallelTime, TensorParallelCollectivesPerBlock) {
  const double s = 16, b = 2, h = 64, p = 2, m = 8, layers = 8, bw = 100e9, lat = 1e-6;
  const double bytes = s * b * h * p;
  for (bool sp : {false, true}) {
    for (Recompute r : {Recompute::kNone, Recompute::kCheckpoint}) {
      PlanInput in = small(4, 4, 1);
      in.sequence_parallel = sp;
      const double t = 4;
      // An all-reduce moves 2(T-1)/T of the bytes; all-gather and reduce-scatter (T-1)/T each.
      const double one =
          sp ? 2 * ((t - 1) / t * bytes / bw + lat) : 2 * (t - 1) / t * bytes / bw + lat;
      // Under SP each block also gathers its two region inputs again for the column products'
      // weight gradients (one all-gather each, half a `one`), and so does the untied head.
      const double per_block = (r == Recompute::kNone ? 4 : 6) + (sp ? 1 : 0);
      const double head_again = sp && !in.shape.tied ? 0.5 : 0;
      // Besides the blocks, per micro-batch: the embedding (forward all-reduce; SP: forward
      // reduce-scatter and backward all-gather) and the head (backward all-reduce; SP: forward
      // all-gather, backward reduce-scatter), one `one` each; the loss's fp32 all-gather of
      // 4sb bytes from each rank and all-reduce of 8sb; the id checks' all-gathers of 2 and 3
      // int64 from each rank.
      const double loss = ((t - 1) * 4 * s * b / bw + lat) +
                          (2 * (t - 1) / t * 8 * s * b / bw + lat) + ((t - 1) * 16 / bw + lat) +
                          ((t - 1) * 24 / bw + lat);
      // Under SP, per step: the 17 RMSNorm weights' gradients all-reduced in one call.
      const double norms = sp ? 2 * (t - 1) / t * (2 * layers + 1) * h * p / bw + lat : 0;
      const ParallelTime got = predict_parallel_step_time(in, 0, r, round_hardware());
      EXPECT_NEAR(got.tp_comm_s, m * ((layers * per_block + 2 + head_again) * one + loss) + norms,
                  1e-15);
    }
  }
}

TEST(ParallelTime, PipelineBubbleSendsAndMfu) {
  const double s = 16, b = 2, h = 64, p = 2, layers = 8, bw = 100e9, lat = 1e-6, peak = 100e12;
  for (int64_t m : {4, 16}) {
    PlanInput in = small(4, 1, 4);  // D = 1: no data-parallel collectives
    in.accumulation = m;
    const ParallelTime got = predict_parallel_step_time(in, 0, Recompute::kNone, round_hardware());
    const double send = s * b * h * p / bw + lat;
    EXPECT_NEAR(got.p2p_s, m * 2 * send, 1e-15);
    // Model FLOPs per token (PaLM): 6 x matmul weights (head included, lookup table not) + 12Lsh.
    const double mm = static_cast<double>(in.num_params) - 100 * h;
    const double flops = 6 * mm + 12 * layers * s * h;
    const double tf = s * b * flops / 3 / 4 / peak;  // per micro-batch on a quarter of the model
    const double busy = m * (tf + send + 2 * tf + send);
    // 1F1B with equal stages: (m + P - 1) slots of forward + backward.
    const double bubble = 3.0 / (m + 3.0);
    EXPECT_NEAR(got.bubble_fraction, bubble, 1e-9);
    // Stage 0's optimizer step: norm 4e, gradient 4e, master 8e, 2 states 16e, bf16 copy 2e,
    // zeroing the fp32 accumulator 4e; e the last stage's parameters, the most of any stage
    // (2 blocks, the head, the final norm).
    const double e = static_cast<double>(2 * ((4 * h * h + 3 * h * 160) + 2 * h) + 100 * h + h);
    const double optimizer = (4 + 4 + 8 + 16 + 2 + 4) * e / 1e12;
    EXPECT_NEAR(got.step_s, busy / (1 - bubble) + optimizer, 1e-12);
    EXPECT_NEAR(got.mfu, s * b * m / got.step_s * flops / (4 * peak), 1e-12);
  }
}

TEST(ParallelTime, SequenceParallelSendsAShardBetweenStages) {
  const double s = 16, b = 2, h = 64, p = 2, m = 8, bw = 100e9, lat = 1e-6;
  PlanInput in = small(4, 2, 2);
  in.sequence_parallel = true;
  const ParallelTime got = predict_parallel_step_time(in, 1, Recompute::kNone, round_hardware());
  EXPECT_NEAR(got.p2p_s, m * 2 * (s * b * h * p / 2 / bw + lat), 1e-15);
  // 1F1B, P = 2, m = 8: a bubble of 1 / 9.
  EXPECT_NEAR(got.bubble_fraction, 1.0 / 9.0, 1e-9);
}

// The runtime's cut (pipeline.partition) of [embedding, 8 blocks, head] for the small shape,
// counted by hand: a block holds 4h² + 3hf + 2h = 47232 parameters, the embedding V·h = 6400,
// the head V·h + h = 6464. Per token a block costs 6·47232 + 12·s·h = 295680 FLOPs, the head
// 6·6464 + its loss's 8·V = 39584, the embedding its lookup's h = 64 (pipeline_flops.hpp).
constexpr double kBlockFlops = 295680, kHeadFlops = 39584, kEmbedFlops = 64;

TEST(ParallelTime, StagesCutAsTheRuntimeCutsThem) {
  const double b = kBlockFlops, hd = kHeadFlops, e = kEmbedFlops;
  PlanInput in = small(4, 1, 4);
  EXPECT_TRUE(stage_flops_per_token(in).empty());  // kEqual: the blocks' L/P, as before
  // Uniform: 10 layers over 4 stages, 3, 3, 2, 2 (the first ones one longer).
  in.partition = PlanInput::Partition::kUniform;
  std::vector<double> want = {e + 2 * b, 3 * b, 2 * b, b + hd};
  EXPECT_EQ(stage_flops_per_token(in), want);
  // Parameters: the smallest largest stage is embedding + 2 blocks (100864) against 2 blocks +
  // head (100928); any stage of 3 blocks would hold 141696.
  in.partition = PlanInput::Partition::kParameters;
  want = {e + 2 * b, 2 * b, 2 * b, 2 * b + hd};
  EXPECT_EQ(stage_flops_per_token(in), want);
  EXPECT_EQ(pipeline_stage_bounds(in), (std::vector<int>{0, 3, 5, 7, 10}));
  // Every layer counted once: the model's FLOPs per token (PaLM's count, time_plan.hpp), plus
  // the two terms it leaves out, the embedding's lookup (h) and the loss (8·V).
  double sum = 0;
  for (double f : stage_flops_per_token(in)) sum += f;
  EXPECT_NEAR(sum, model_flops_per_token(in) + 64 + 8 * 100, 1e-9 * sum);
  // Compute: the same layers weighed by those costs. The total is e + 8b + hd = 2405088, a
  // quarter 601272: a stage of 3 blocks (887040) is worse than the last stage's 2 blocks + head
  // (630944), and 1 block + head leaves 7 blocks for 3 stages, so 2 blocks each: here the same
  // cut as by parameters (the GPT presets where they differ: test_pipeline_partition_compute).
  in.partition = PlanInput::Partition::kCompute;
  EXPECT_EQ(pipeline_stage_bounds(in), (std::vector<int>{0, 3, 5, 7, 10}));
  EXPECT_EQ(stage_flops_per_token(in), want);
  EXPECT_THROW(parse_partition("balanced"), std::invalid_argument);
  EXPECT_EQ(parse_partition("parameters"), PlanInput::Partition::kParameters);
  EXPECT_EQ(parse_partition("compute"), PlanInput::Partition::kCompute);
  try {
    parse_partition("flops");
    FAIL();
  } catch (const std::invalid_argument& x) {
    EXPECT_NE(std::string(x.what()).find("equal, uniform, parameters or compute"),
              std::string::npos);
  }
}

// P = 2 cut by parameters: stage 0 embedding + 4 blocks, stage 1 4 blocks + head, the slower.
// 1F1B with a slower last stage never lets it wait after its first input: the step is stage
// 0's first forward, then m of stage 1's forward + backward, then stage 0's last backward,
// f0 + m·(f1 + b1) + b0 (worked out by hand on the two stages' lists).
TEST(ParallelTime, TheSlowestStagePacesThePipeline) {
  const double s = 16, bsz = 2, h = 64, p = 2, bw = 100e9, lat = 1e-6, peak = 100e12;
  for (int64_t m : {2, 8}) {
    PlanInput in = small(2, 1, 2);  // D = 1: no data-parallel collectives
    in.accumulation = m;
    in.partition = PlanInput::Partition::kParameters;
    const ParallelTime got = predict_parallel_step_time(in, 0, Recompute::kNone, round_hardware());
    const double send = s * bsz * h * p / bw + lat;
    const double tf0 = s * bsz * (kEmbedFlops + 4 * kBlockFlops) / 3 / peak;
    const double tf1 = s * bsz * (4 * kBlockFlops + kHeadFlops) / 3 / peak;
    const double f0 = tf0 + send, b0 = 2 * tf0 + send, f1 = tf1 + send, b1 = 2 * tf1 + send;
    const double makespan = f0 + m * (f1 + b1) + b0;
    EXPECT_EQ(got.slowest_stage, 1);
    ASSERT_EQ(got.stage_compute_s.size(), 2u);
    EXPECT_NEAR(got.stage_compute_s[0], m * 3 * tf0, 1e-15);
    EXPECT_NEAR(got.stage_compute_s[1], m * 3 * tf1, 1e-15);
    EXPECT_NEAR(got.forward_s + got.backward_s, m * 3 * tf1, 1e-15);
    EXPECT_NEAR(got.bubble_s, f0 + b0, 1e-12);
    EXPECT_NEAR(got.step_s - got.optimizer_s, makespan, 1e-12);
  }
}

TEST(ParallelTime, LinksFollowMegatronsRankOrder) {
  // 8 ranks per node. T = 8: NVLink; T·D = 16 spans nodes for the data-parallel ring.
  ParallelHardware hw = parallel_hardware("h100", "ib400", {8, 2, 2}, 8);
  EXPECT_NE(hw.tp.name.find("nvlink"), std::string::npos) << hw.tp.name;
  EXPECT_NE(hw.dp.name.find("ib400"), std::string::npos) << hw.dp.name;
  EXPECT_NE(hw.p2p.name.find("ib400"), std::string::npos) << hw.p2p.name;
  hw = parallel_hardware("h100", "ib400", {2, 2, 4}, 16);  // tp x dp = 8 in a 16-rank node
  EXPECT_NE(hw.dp.name.find("nvlink"), std::string::npos) << hw.dp.name;
  EXPECT_NE(hw.p2p.name.find("nvlink"), std::string::npos) << hw.p2p.name;
  EXPECT_THROW(predict_parallel_step_time(small(4, 1, 4), 2, Recompute::kNone, round_hardware()),
               std::invalid_argument);
}

TEST(ParallelSearch, FitsTheBudgetAndRespectsTheRules) {
  PlanInput in;
  in.shape = {80, 8192, 64, 28672, 32000, false};  // a LLaMA-70B shape (full multi-head)
  in.num_params = in.shape.num_params();
  in.world_size = 64;
  in.seq_len = 4096;
  in.accumulation = 32;
  PlanLimits lim;
  lim.device_bytes = 80'000'000'000;
  lim.max_micro_batch = 8;
  lim.ranks_per_node = 8;
  const ParallelSearch s = search_parallel(
      in, lim, [](const ParallelLayout& l) { return parallel_hardware("h100", "ib400", l, 8); });
  ASSERT_TRUE(s.found);
  for (const ParallelCandidate& c : s.fits) {
    EXPECT_LE(c.memory.total(), lim.budget());
    EXPECT_LE(c.layout.tp, 8);
    EXPECT_EQ(80 % c.layout.pp, 0);
    EXPECT_EQ(c.layout.tp * c.layout.pp * c.layout.dp, 64);
    if (c.layout.pp > 1) EXPECT_LT(c.stage, 2);
    EXPECT_LE(c.time.mfu, s.best.time.mfu);
  }
  // A 78B model does not fit one 80 GB device's model states unsplit: the best splits it, over
  // tensor/pipeline ranks or, at stage 3, its parameters over the data-parallel ranks.
  EXPECT_TRUE(s.best.layout.tp * s.best.layout.pp > 1 || s.best.stage == 3)
      << "tp " << s.best.layout.tp << " pp " << s.best.layout.pp << " stage " << s.best.stage;
  for (const ParallelCandidate& c : s.fits) {
    if (c.layout.tp * c.layout.pp == 1) EXPECT_EQ(c.stage, 3) << "stages 0-2 hold 2Ψ whole";
  }
}

// LLaMA-2-70B: grouped-query attention, 64 query heads sharing 8 key/value heads.
ModelShape llama2_70b() {
  ModelShape m{80, 8192, 64, 28672, 32000, false};
  m.kv_heads = 8;
  return m;
}

TEST(GroupedQueryAttention, CountsLlama2_70B) {
  const ModelShape m = llama2_70b();
  // Tensor by tensor, as transformers' LlamaForCausalLM holds them (vocab 32000, hidden 8192,
  // intermediate 28672, 80 layers, 64 heads, 8 kv heads, untied): q_proj and o_proj 8192 x 8192,
  // k_proj and v_proj 1024 x 8192 (8 heads of 8192 / 64 = 128), gate/up 28672 x 8192, down
  // 8192 x 28672, two RMSNorm weights 8192; embed_tokens and lm_head 32000 x 8192, norm 8192.
  const int64_t h = 8192, kv = 8 * (8192 / 64), f = 28672, v = 32000;
  const int64_t layer = h * h + kv * h + kv * h + h * h + f * h + f * h + h * f + h + h;
  const int64_t total = v * h + 80 * layer + h + v * h;
  EXPECT_EQ(m.kv_dim(), kv);
  EXPECT_EQ(m.num_params(), total);
  // What sum(p.numel() for p in LlamaForCausalLM(config).parameters()) printed for that config
  // (transformers, meta device): the count Meta publishes as "70B".
  EXPECT_EQ(total, 68'976'648'192);
  // Full multi-head attention of the same shape, the count the planner used before kv_heads.
  ModelShape mha = m;
  mha.kv_heads = 0;
  EXPECT_EQ(mha.num_params() - m.num_params(), 80 * 2 * h * (h - kv));
}

TEST(GroupedQueryAttention, RankParametersSplitTheNarrowKeyValueProjections) {
  PlanInput in;
  in.shape = llama2_70b();
  in.num_params = in.shape.num_params();
  const int64_t h = 8192, kv = 1024, f = 28672, v = 32000;
  for (int t : {2, 8}) {
    for (int p : {1, 2}) {
      in.world_size = 8 * p;
      in.tensor_parallel = t;
      in.pipeline_stages = p;
      // Megatron: linear_qkv is column-parallel over (h + 2 kv) outputs, linear_proj row-parallel.
      const int64_t block = (h * (h + 2 * kv) + h * h + 3 * h * f) / t + 2 * h;
      // The last stage: its blocks, the head and the final norm (and with one stage the
      // embedding too).
      const int64_t last = 80 / p * block + v * h / t + h + (p == 1 ? v * h / t : 0);
      EXPECT_EQ(rank_params(in, p - 1), last) << "T " << t << " P " << p;
    }
  }
}

TEST(GroupedQueryAttention, FlopsAndBucketsFollowTheParameterCount) {
  PlanInput in;
  in.shape = llama2_70b();
  in.num_params = in.shape.num_params();
  in.seq_len = 4096;
  const double h = 8192, kv = 1024, f = 28672, v = 32000, s = 4096, L = 80;
  // 6 FLOPs per parameter and token except the embedding table (the head's included, Kaplan's
  // non-embedding count), and the attention scores: 12·L·h·s per token (every query head,
  // whatever the kv heads).
  const double matmul = L * (2 * h * h + 2 * h * kv + 3 * h * f + 2 * h) + h + v * h;
  EXPECT_DOUBLE_EQ(model_flops_per_token(in), 6 * matmul + 12 * L * h * s);
  EXPECT_DOUBLE_EQ(recompute_flops_per_token(in),
                   2 * L * (2 * h * h + 2 * h * kv + 3 * h * f + 2 * h) + 4 * L * h * s);
  // The gradient buckets hold every parameter once (the preset's order is known only when the
  // shape's count is the model's).
  in.bucket_elements = 500'000'000;
  int64_t sum = 0;
  for (int64_t b : bucket_sizes(in)) sum += b;
  EXPECT_EQ(sum, in.num_params);
  EXPECT_LE(max_bucket_elements(in), in.bucket_elements + static_cast<int64_t>(v * h));
}

TEST(GroupedQueryAttention, SearchKeepsTheKeyValueHeadsWhole) {
  // 4 key/value heads: T = 8 would leave a rank half a head (Megatron requires
  // num_query_groups % T == 0).
  PlanInput in;
  in.shape = {8, 1024, 16, 2816, 32000, false};
  in.shape.kv_heads = 4;
  in.num_params = in.shape.num_params();
  in.world_size = 8;
  PlanLimits lim;
  lim.device_bytes = 80'000'000'000;
  lim.ranks_per_node = 8;
  const ParallelSearch s = search_parallel(
      in, lim, [](const ParallelLayout& l) { return parallel_hardware("h100", "ib400", l, 8); });
  ASSERT_TRUE(s.found);
  bool saw_four = false;
  for (const ParallelCandidate& c : s.fits) {
    EXPECT_LE(c.layout.tp, 4);
    saw_four = saw_four || c.layout.tp == 4;
  }
  EXPECT_TRUE(saw_four);
}

}  // namespace
}  // namespace zero
