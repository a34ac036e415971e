// The memory planner's numbers for cases worked out by hand, its recommendation for LLaMA-7B,
// and the SVG chart's structure.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>

#include "zero/memory_plan.hpp"
#include "zero/models/gpt.hpp"
#include "zero/params/shard_info.hpp"
#include "zero/time_plan.hpp"

namespace zero {
namespace {

// A difference (the allocator's delta over initialize) may be negative: it keeps its units.
TEST(FormatBytes, NegativeDifferencesKeepTheirUnits) {
  EXPECT_EQ(format_bytes(3 * 1024 * 1024), "3.00 MiB");
  EXPECT_EQ(format_bytes(-3 * 1024 * 1024), "-3.00 MiB");
  EXPECT_EQ(format_bytes(-756), "-756 B");
}

constexpr int64_t kLlama7b = 6'738'415'616;  // examples/gpt.hpp's "llama-7b", exact

// LLaMA-7B's shape as the example GPT builds it.
PlanInput llama7b(int world) {
  PlanInput in;
  in.shape = {/*layers=*/32, /*hidden=*/4096, /*heads=*/32,
              /*ffn=*/11008, /*vocab=*/32000,
              /*tied=*/false};
  in.num_params = kLlama7b;
  in.world_size = world;
  in.micro_batch = 1;
  in.seq_len = 2048;
  return in;  // bf16, fp32 accumulation, AdamW, 5e8-element buckets
}

int64_t count(const std::string& text, const std::string& what) {
  int64_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

TEST(MemoryPlan, ShapeCountsLlama7bExactly) { EXPECT_EQ(llama7b(8).shape.num_params(), kLlama7b); }

TEST(MemoryPlan, PaperAccountingGivesSixteenPsiAtStage0) {
  // The ZeRO paper's mixed precision: fp16 params 2Ψ + fp16 grads 2Ψ + fp32 master, m, v 12Ψ.
  PlanInput in = llama7b(8);
  in.grad_accum_bytes = 2;
  const MemoryBreakdown s0 = plan_model_states(in, 0);
  EXPECT_EQ(s0.total() - s0.comm_buffers, 16 * kLlama7b);
  EXPECT_EQ(s0.total() - s0.comm_buffers, 107'814'649'856);
}

TEST(MemoryPlan, EngineStagesAtEightRanks) {
  // This engine accumulates gradients in fp32 (4Ψ) whatever the compute dtype; Ψ/8 is exact.
  const PlanInput in = llama7b(8);
  const int64_t psi = kLlama7b, shard = psi / 8;
  ASSERT_EQ(shard * 8, psi);
  const MemoryBreakdown s0 = plan_model_states(in, 0), s1 = plan_model_states(in, 1),
                        s2 = plan_model_states(in, 2);
  // stage 0: 2Ψ + 4Ψ + 4Ψ + 8Ψ = 18Ψ
  EXPECT_EQ(s0.params, 2 * psi);
  EXPECT_EQ(s0.grads, 4 * psi);
  EXPECT_EQ(s0.master, 4 * psi);
  EXPECT_EQ(s0.optimizer, 8 * psi);
  EXPECT_EQ(s0.total() - s0.comm_buffers, 121'291'481'088);
  // stage 1 without accumulation reduces during backward as stage 2 does:
  // 2Ψ + 4Ψ/8 + 4Ψ/8 + 8Ψ/8 = 4Ψ
  EXPECT_EQ(s1.grads, 4 * shard);
  EXPECT_EQ(s1.master, 4 * shard);
  EXPECT_EQ(s1.optimizer, 8 * shard);
  EXPECT_EQ(s1.total() - s1.comm_buffers, 26'953'662'464);
  // stage 2: 2Ψ + 4Ψ/8 + 4Ψ/8 + 8Ψ/8 = 4Ψ
  EXPECT_EQ(s2.grads, 4 * shard);
  EXPECT_EQ(s2.total() - s2.comm_buffers, 26'953'662'464);
  EXPECT_EQ(model_state_formula(in, 0), "2Ψ + 4Ψ + 4Ψ + 8Ψ = 18Ψ");
  EXPECT_EQ(model_state_formula(in, 1), "2Ψ + 4Ψ/8 + 4Ψ/8 + 8Ψ/8 = 4Ψ");
  EXPECT_EQ(model_state_formula(in, 2), "2Ψ + 4Ψ/8 + 4Ψ/8 + 8Ψ/8 = 4Ψ");
  // Under gradient accumulation (or with overlap_comm off) stage 1 keeps the full fp32
  // accumulator between micro-steps: 2Ψ + (4Ψ + 4Ψ/8) + 4Ψ/8 + 8Ψ/8 = 8Ψ.
  for (const bool accumulate : {true, false}) {
    PlanInput a = in;
    a.accumulation = accumulate ? 4 : 1;
    a.overlap_comm = accumulate;  // the other way: no accumulation, overlap_comm off
    const MemoryBreakdown s1a = plan_model_states(a, 1);
    EXPECT_EQ(s1a.grads, 4 * psi + 4 * shard);
    EXPECT_EQ(s1a.total() - s1a.comm_buffers, 53'907'324'928);
    EXPECT_EQ(model_state_formula(a, 1), "2Ψ + 4Ψ + 4Ψ/8 + 4Ψ/8 + 8Ψ/8 = 8Ψ");
    EXPECT_EQ(plan_model_states(a, 2).total(), s2.total()) << "stage 2 accumulates its shard";
  }
}

TEST(MemoryPlan, BucketBuffersFollowTheEngine) {
  const PlanInput in = llama7b(8);
  const int64_t b = max_bucket_elements(in);
  // A bucket closes before the parameter that would take it past 5e8 elements (DeepSpeed's
  // rule): no 7B bucket is larger than that (its largest parameter, the 131 M-element head, is
  // smaller), and each is short of it by less than the parameter that did not fit.
  EXPECT_LE(b, 500'000'000);
  EXPECT_GT(b, 500'000'000 - 32000LL * 4096);
  // A buffer holds the largest bucket (64-aligned rows per rank), at most reduce_bucket_size
  // elements: with buckets that never exceed it, no 7B bucket takes the chunked path.
  const int64_t e0 = bucket_buffer_elements(in, 0), e = bucket_buffer_elements(in, 1);
  EXPECT_EQ(e0, (b + 63) / 64 * 64);
  EXPECT_EQ(e, (b + 8 * 64 - 1) / (8 * 64) * (8 * 64));
  EXPECT_LE(e, 500'000'000);
  EXPECT_EQ(bucket_buffer_elements(in, 2), e);
  // bf16 gradients travel through two in/out pairs; stage 0 all-reduces in place in "in".
  EXPECT_EQ(plan_model_states(in, 0).comm_buffers, 2 * 2 * e0);
  EXPECT_EQ(plan_model_states(in, 1).comm_buffers, 2 * 2 * (e + e / 8));
  EXPECT_EQ(plan_model_states(in, 2).comm_buffers, 2 * 2 * (e + e / 8));
  // fp32 gradients reduce in place at stage 0 (and stage 1 under accumulation); stage 2 and
  // stage 1 without accumulation send every gradient through their buffers.
  PlanInput f = in;
  f.param_bytes = f.comm_bytes = 4;
  EXPECT_EQ(plan_model_states(f, 0).comm_buffers, 0);
  EXPECT_EQ(plan_model_states(f, 1).comm_buffers, 2 * 4 * (e + e / 8));
  EXPECT_EQ(plan_model_states(f, 2).comm_buffers, 2 * 4 * (e + e / 8));
  f.accumulation = 2;
  EXPECT_EQ(plan_model_states(f, 1).comm_buffers, 0);
  for (int s = 0; s < 3; ++s) {
    EXPECT_EQ(plan_model_states(f, s).master, 0) << "an fp32 model is its own master";
  }
  // A small model whose largest bucket is below the bucket size: the buffer is that bucket.
  PlanInput small = in;
  small.bucket_elements = 10'000'000'000;  // one bucket: the whole model
  EXPECT_EQ(bucket_buffer_elements(small, 0), (max_bucket_elements(small) + 63) / 64 * 64);
  // reduce_bucket_size 0: every parameter its own bucket, reduced whole; the buffer holds the
  // largest parameter, 7B's 32000 x 4096 head (embedding), padded to 8 x 64-element rows.
  PlanInput each = in;
  each.bucket_elements = 0;
  EXPECT_EQ(max_bucket_elements(each), 32000LL * 4096);
  EXPECT_EQ(bucket_buffer_elements(each, 1), (32000LL * 4096 + 511) / 512 * 512);
}

TEST(MemoryPlan, StartupPeakIsTheLargerOfFlatteningAndTheStates) {
  const PlanInput in = llama7b(8);  // bf16
  const int64_t psi = kLlama7b;
  for (int s = 0; s < 3; ++s) {
    const MemoryBreakdown st = plan_model_states(in, s);
    // The user's fp32 model, the bf16 flat buffer and master allocated up front, one fp32
    // staging bucket.
    const int64_t flatten = 4 * psi + 2 * psi + st.master + 4 * max_bucket_elements(in);
    EXPECT_EQ(plan_startup_peak(in, s), std::max(flatten, st.total())) << "stage " << s;
  }
  // Stage 2 at 8 ranks: flattening dominates (the user's model is still there).
  EXPECT_GT(plan_startup_peak(in, 2), plan_model_states(in, 2).total());
}

// The start-up peak is a device figure: what lives in host memory is not in it. Stage 3 keeps
// its error-feedback residual (Ψ fp32 elements: 4Ψ, the whole gradient) in page-locked host
// memory; under optimizer offload the master, the states and the gradient shard are there too.
TEST(MemoryPlan, StartupPeakLeavesHostMemoryOut) {
  const int64_t psi = kLlama7b, shard = psi / 8;
  PlanInput q = llama7b(8);  // bf16, AdamW
  q.quantized_bits = 8;
  q.error_feedback_store_bytes = 4;
  const MemoryBreakdown st = plan_model_states(q, 3);
  const int64_t residual = 4 * psi;
  ASSERT_EQ(error_feedback_bytes(q, 3), residual);
  ASSERT_EQ(plan_host_states(q, 3), residual);
  // The device: the root whole, the fp32 master and AdamW's two states (4 + 8 bytes per element
  // of the 1/8 shard; no bf16 copy of the shard: each gather rounds the master), and the
  // residual's two device staging buffers.
  const int64_t params = 2 * stage3_root_params(q);
  ASSERT_EQ(st.params, params);
  const int64_t device = params + 4 * shard + 8 * shard + error_feedback_staging_bytes(q, 3);
  EXPECT_EQ(st.total() - residual, device);
  // Flattening an eager model: the user's fp32 model, every unit's bf16 buffer whole (the
  // root's among them), the bf16 root, the fp32 master and one fp32 staging bucket.
  const int64_t units = 2 * (psi - stage3_root_params(q));
  const int64_t flatten = 4 * psi + params + units + 4 * shard + 4 * max_bucket_elements(q);
  EXPECT_EQ(plan_startup_peak(q, 3), std::max(flatten, device));
  // Before, the residual counted: the figure was the whole model states, host part included. A
  // deferred start-up (no fp32 model beside) peaks at the device states, below that.
  PlanInput dq = q;
  dq.deferred_start = true;
  EXPECT_EQ(plan_startup_peak(dq, 3), device);
  EXPECT_LT(plan_startup_peak(dq, 3), st.total());
  // Without compression nothing changes: the steady states have no host part.
  PlanInput plain = llama7b(8);
  const MemoryBreakdown p3 = plan_model_states(plain, 3);
  EXPECT_EQ(plan_host_states(plain, 3), 0);
  EXPECT_EQ(plan_startup_peak(plain, 3),
            std::max(4 * psi + p3.params + units + p3.master + 4 * max_bucket_elements(plain),
                     p3.total()));
  // Optimizer offload at stages 1-3: the master is allocated in host memory, not beside the flat
  // buffer, and the device's steady states are the parameters and the bucket buffers.
  PlanInput off = llama7b(8);
  off.offload_optimizer = true;
  for (int s = 1; s < 4; ++s) {
    const MemoryBreakdown o = plan_model_states(off, s);
    const int64_t on_device = o.total() - plan_host_states(off, s);
    const int64_t all_units = s == 3 ? units : 0;
    EXPECT_EQ(plan_startup_peak(off, s),
              std::max(4 * psi + o.params + all_units + 4 * max_bucket_elements(off), on_device))
        << "stage " << s;
    EXPECT_LT(plan_startup_peak(off, s), 4 * psi + o.params + all_units + o.master)
        << "stage " << s;
  }
}

// A deferred model (deferred_init.hpp) never has its fp32 copy on the device: flattening
// allocates the compute-dtype parameters and the master and fills them from the host; a
// parameter held whole goes up through one 16 MiB fp32 slot, cast on the device into bf16.
TEST(MemoryPlan, DeferredStartupHoldsNoCopyOfTheModel) {
  PlanInput in = llama7b(8);  // bf16, AdamW
  in.deferred_start = true;
  const int64_t psi = kLlama7b, shard = psi / 8;
  const int64_t slot = int64_t{16} << 20;
  // The largest parameter, the 32000 x 4096 embedding, exceeds a slot; at stage 3 the root's
  // largest is a norm (stage3_param_persistence_threshold 1e5 keeps the 4096-element norms whole).
  EXPECT_EQ(deferred_cast_bytes(in, 2), slot);
  EXPECT_EQ(deferred_cast_bytes(in, 3), 4 * 4096);
  for (int s = 0; s < 4; ++s) {
    const MemoryBreakdown st = plan_model_states(in, s);
    const int64_t flatten = st.params + st.master + deferred_cast_bytes(in, s);
    EXPECT_EQ(plan_startup_peak(in, s), std::max(flatten, st.total())) << "stage " << s;
    // With AdamW the states allocated after flattening are the peak: the steady state.
    EXPECT_EQ(plan_startup_peak(in, s), st.total()) << "stage " << s;
  }
  // Stage 3 at 8 ranks: 2Ψ_root + 12Ψ/8 by hand (no bf16 copy of the shard: gathers cast the master), against the eager figure's 4Ψ + 2Ψ + ...: the
  // deferred start-up saves more than the whole fp32 model.
  const int64_t root = stage3_root_params(in);
  EXPECT_EQ(plan_startup_peak(in, 3), 2 * root + 4 * shard + 8 * shard);
  PlanInput eager = in;
  eager.deferred_start = false;
  EXPECT_GT(plan_startup_peak(eager, 3) - plan_startup_peak(in, 3), 4 * psi);
  // Without optimizer states (plain SGD) flattening is the peak, and the slot shows.
  PlanInput sgd = in;
  sgd.optimizer_states = 0;
  EXPECT_EQ(plan_startup_peak(sgd, 3), 2 * root + 4 * shard + 4 * 4096);
  // fp32 parameters take the slot as it is: no cast, nothing beyond the states.
  PlanInput f = in;
  f.param_bytes = f.comm_bytes = f.grad_accum_bytes = 4;
  for (int s = 0; s < 4; ++s) {
    EXPECT_EQ(deferred_cast_bytes(f, s), 0);
    EXPECT_EQ(plan_startup_peak(f, s), plan_model_states(f, s).total() - plan_host_states(f, s))
        << "stage " << s;
  }
  // Optimizer offload at stage 3: the master is in host memory, and each rank's piece of a
  // parameter goes up into the bf16 shard: at most a bucket's shard, here a slot.
  PlanInput off = in;
  off.offload_optimizer = true;
  EXPECT_EQ(deferred_cast_bytes(off, 3),
            4 * std::min<int64_t>(slot / 4, bucket_buffer_elements(off, 3) / 8));
  const MemoryBreakdown o = plan_model_states(off, 3);
  EXPECT_EQ(plan_startup_peak(off, 3),
            std::max(o.params + deferred_cast_bytes(off, 3), o.total() - plan_host_states(off, 3)));
}

TEST(MemoryPlan, BlockActivationsMatchAHandCount) {
  // b = 2, s = 64, h = 128, a = 4, f = 352: sb = 128, sbh = 16384, sbf = 45056.
  // bf16: 24·sbh = 393216, 8·sbf = 360448, log-sum-exp 4·a·sb = 2048, rsqrt 8·sb = 1024.
  // torch.autograd.graph.saved_tensors_hooks on a replica of the block saw 756736 bytes too.
  const ModelShape m{1, 128, 4, 352, 0, false};
  EXPECT_EQ(block_activation_bytes(m, 2, 64, 2), 393216 + 360448 + 2048 + 1024);
  // fp32: 40·sbh + 16·sbf + ... (the RMSNorm upcast is the input itself)
  EXPECT_EQ(block_activation_bytes(m, 2, 64, 4), 655360 + 720896 + 2048 + 1024);
}

TEST(MemoryPlan, ActivationsWithAndWithoutCheckpointing) {
  const PlanInput in = llama7b(8);
  const int64_t sb = 2048, sbh = sb * 4096, sbf = sb * 11008;
  const int64_t block = 24 * sbh + 8 * sbf + 4 * 32 * sb + 8 * sb;
  const int64_t head = 8 * sbh + 12 * sb, loss = 12 * sb * 32000;
  EXPECT_EQ(block_activation_bytes(in.shape, 1, 2048, 2), block);
  const ActivationEstimate none = predict_activations(in, Recompute::kNone);
  EXPECT_EQ(none.peak(), 32 * block + head + loss);
  // Checkpointing keeps each block's bf16 input; the loss is freed before the first rebuild.
  const ActivationEstimate ckpt = predict_activations(in, Recompute::kCheckpoint);
  EXPECT_EQ(ckpt.peak(), 32 * 2 * sbh + std::max(head + loss, block));
  const ActivationEstimate off = predict_activations(in, Recompute::kCheckpointOffload);
  EXPECT_EQ(off.peak(), 2 * 2 * sbh + std::max(head + loss, block));
  EXPECT_EQ(off.host, 32 * 2 * sbh);
}

TEST(MemoryPlan, Llama7bOnEight80GbGpus) {
  // Budget 72 GB (10% reserve). Stage 0's states alone are 18Ψ + buffers = 125.5 GB: out.
  // Without accumulation stages 1 and 2 hold the same 4Ψ + 2.4 GB = 29.3 GB (stage 1 reduces
  // during backward as stage 2 does), which fits micro-batch 2 (2 x 13.1 GB of activations);
  // among equals the lower stage wins.
  PlanLimits lim;
  lim.device_bytes = parse_byte_size("80GB");
  const MemoryPlan plan = plan_memory(llama7b(8), lim);
  ASSERT_TRUE(plan.found);
  EXPECT_EQ(plan.best.stage, 1);
  EXPECT_EQ(plan.best.recompute, Recompute::kNone);
  EXPECT_EQ(plan.best.micro_batch, 2);
  EXPECT_LE(plan.best.total(), lim.budget());
  EXPECT_FALSE(plan.options[0][0].fits);
  EXPECT_EQ(plan.options[1][0].best.micro_batch, 2);
  EXPECT_EQ(plan.options[2][0].refused.micro_batch, 4) << "micro-batch 4 is what did not fit";
  std::string all;
  for (const auto& r : plan.reasons) all += r + "\n";
  EXPECT_NE(all.find("stage 0: model states 2Ψ + 4Ψ + 4Ψ + 8Ψ = 18Ψ"), std::string::npos) << all;
  EXPECT_NE(all.find("does not fit at any micro-batch"), std::string::npos) << all;
  EXPECT_NE(all.find("=> stage 1, no checkpointing, micro-batch 2"), std::string::npos) << all;

  // Under gradient accumulation stage 1 keeps its full fp32 accumulator: 8Ψ + 2.4 GB = 56.3 GB
  // leaves room for micro-batch 1 only, and stage 2 wins with micro-batch 2.
  PlanInput acc = llama7b(8);
  acc.accumulation = 4;
  const MemoryPlan with_acc = plan_memory(acc, lim);
  ASSERT_TRUE(with_acc.found);
  EXPECT_EQ(with_acc.best.stage, 2);
  EXPECT_EQ(with_acc.best.micro_batch, 2);
  EXPECT_TRUE(with_acc.options[1][0].fits);
  EXPECT_EQ(with_acc.options[1][0].best.micro_batch, 1);
}

// LLaMA-7B's activations at micro-batch b, counted here from the formula in memory_plan.hpp
// (bf16, s = 2048): per block 24·sbh + 8·sbf + 4·a·sb + 8·sb; head 8·sbh + 12·sb; logits
// 12·sb·V. Checkpointing keeps 2·sbh per block and rebuilds max(head + loss, block).
int64_t llama7b_activations(int64_t b, bool checkpointing) {
  const int64_t sb = 2048 * b, sbh = sb * 4096, sbf = sb * 11008;
  const int64_t block = 24 * sbh + 8 * sbf + 4 * 32 * sb + 8 * sb;
  const int64_t head = 8 * sbh + 12 * sb, loss = 12 * sb * 32000;
  return checkpointing ? 32 * 2 * sbh + std::max(head + loss, block) : 32 * block + head + loss;
}

// The largest power-of-two micro-batch (<= 64) whose device bytes fit `budget`; 0 if none.
int64_t largest_micro_batch(int64_t states, int64_t budget, bool checkpointing) {
  int64_t best = 0;
  for (int64_t b = 1; b <= 64 && states + llama7b_activations(b, checkpointing) <= budget; b *= 2) {
    best = b;
  }
  return best;
}

TEST(MemoryPlan, OptimizerOffloadSplitsDeviceAndHostAsTheEngineDoes) {
  // Per rank, as Engine::memory_report counts them: in host memory the fp32 master 4Ψ/N, the
  // AdamW states 8Ψ/N, the fp32 gradient shard 4Ψ/N and the bf16 copy 2Ψ/N = 18Ψ/N, plus the
  // page-locked ring the reduced shards land in (3 bucket shards in the gradients' dtype); on the
  // device the bf16 parameters 2Ψ and two pairs of bucket buffers (stage 1 under accumulation:
  // plus its full 4Ψ fp32 accumulator).
  PlanInput in = llama7b(8);
  in.offload_optimizer = true;
  const int64_t psi = kLlama7b, shard = psi / 8;
  const int64_t e = bucket_buffer_elements(in, 2);
  const int64_t buffers = 2 * 2 * (e + e / 8);
  const int64_t ring = 3 * 2 * (e / 8);
  for (int s = 1; s < 3; ++s) {
    const MemoryBreakdown st = plan_model_states(in, s);
    const int64_t host = plan_host_states(in, s);
    EXPECT_EQ(host, 18 * shard + ring) << "stage " << s;
    EXPECT_EQ(st.total() - host, 2 * psi + buffers) << "stage " << s;
    EXPECT_EQ(st.master, 4 * shard);
    EXPECT_EQ(st.optimizer, 8 * shard);
  }
  EXPECT_EQ(plan_host_states(in, 0), 0) << "the engine offloads at stages 1 and 2 only";
  PlanInput acc = in;
  acc.accumulation = 4;
  const MemoryBreakdown s1 = plan_model_states(acc, 1);
  EXPECT_EQ(s1.total() - plan_host_states(acc, 1), 2 * psi + 4 * psi + buffers);
  // fp32: the host keeps a separate master (20Ψ/N with the fp32 copy), and the gradients go
  // through the buffers even where stage 1 would reduce fp32 in place without offload.
  PlanInput f = acc;
  f.param_bytes = f.comm_bytes = 4;
  EXPECT_EQ(plan_host_states(f, 1), 20 * shard + 3 * 4 * (e / 8));
  EXPECT_EQ(plan_model_states(f, 1).master, 4 * shard);
  EXPECT_EQ(plan_model_states(f, 1).total() - plan_host_states(f, 1),
            4 * psi + 4 * psi + 2 * 4 * (e + e / 8));
  f.offload_optimizer = false;
  EXPECT_EQ(plan_model_states(f, 1).comm_buffers, 0);
  EXPECT_EQ(plan_host_states(f, 1), 0);
}

TEST(MemoryPlan, Llama7bOnOne80GbGpuNeedsOptimizerOffload) {
  // N = 1: every stage holds 18Ψ = 121 GB of states, over the 72 GB budget. With optimizer
  // offload the device keeps 2Ψ + two pairs of bf16 bucket buffers (the largest bucket, 495 M
  // elements: 4 GB) = 17.4 GB and the host 18Ψ = 121 GB.
  PlanLimits lim;
  lim.device_bytes = parse_byte_size("80GB");
  lim.host_bytes = parse_byte_size("1TB");
  const PlanInput in = llama7b(1);
  const MemoryPlan plan = plan_memory(in, lim);
  for (int s = 0; s < 3; ++s) EXPECT_FALSE(plan.options[s][2].fits) << "stage " << s;
  ASSERT_TRUE(plan.found);
  EXPECT_TRUE(plan.best.offload);
  EXPECT_EQ(plan.best.stage, 1) << "N = 1: stages 1 and 2 hold the same, the lower one wins";
  EXPECT_EQ(plan.best.recompute, Recompute::kNone);
  const int64_t e = bucket_buffer_elements(in, 1);
  // The largest 7B bucket under DeepSpeed's closing rule, the parameters in the engine's order
  // (reverse registration: each block's norms, then its down, up, gate, o, v, k, q).
  EXPECT_EQ(e, 494'944'256);
  const int64_t psi = kLlama7b, device_states = 2 * psi + 2 * 2 * (e * 2);
  const int64_t b = largest_micro_batch(device_states, lim.budget(), false);
  EXPECT_EQ(b, 4);  // 17.5 GB + 4 x 13.1 GB = 69.8 GB
  EXPECT_EQ(plan.best.micro_batch, b);
  EXPECT_EQ(plan.best.total(), device_states + llama7b_activations(b, false));
  // Host: 18Ψ plus the page-locked landing ring of 3 bucket shards in bf16 (3 GB at N = 1).
  const int64_t ring = 3 * 2 * e;
  EXPECT_EQ(plan.best.host(), 18 * psi + ring);
  EXPECT_EQ(plan.ranks_per_node, 1);
  EXPECT_TRUE(plan.host_fits);
  std::string all;
  for (const auto& r : plan.reasons) all += r + "\n";
  EXPECT_NE(all.find("nothing fits without optimizer offload"), std::string::npos) << all;
  EXPECT_NE(all.find("=> stage 1 with optimizer offload, no checkpointing, micro-batch 4"),
            std::string::npos)
      << all;
  EXPECT_EQ(all.find("WARNING"), std::string::npos) << all;

  // A node with 128 GB of host memory (115.2 GB after the reserve) cannot hold the 124 GB.
  lim.host_bytes = parse_byte_size("128GB");
  const MemoryPlan small_host = plan_memory(in, lim);
  ASSERT_TRUE(small_host.found);
  EXPECT_FALSE(small_host.host_fits);
  EXPECT_EQ(small_host.host_per_node, 18 * psi + ring);
  all.clear();
  for (const auto& r : small_host.reasons) all += r + "\n";
  EXPECT_NE(all.find("WARNING: host memory per node: 1 ranks x 124.26 GB"), std::string::npos)
      << all;
}

TEST(MemoryPlan, Llama7bOnEight24GbGpusNeedsOptimizerOffload) {
  // 21.6 GB budget: even stage 2's 4Ψ = 27 GB of model states exceed it, so no checkpointing
  // can help without optimizer offload; the planner says so and how many such GPUs stage 2
  // would need (16Ψ/N shrinks). With offload the device keeps 2Ψ + buffers = 15.7 GB, which
  // leaves room for activations only with checkpointing.
  PlanLimits lim;
  lim.device_bytes = parse_byte_size("24GB");
  lim.host_bytes = parse_byte_size("1TB");
  lim.ranks_per_node = 8;
  const PlanInput in = llama7b(8);
  const MemoryPlan plan = plan_memory(in, lim);
  for (int s = 0; s < 3; ++s) {
    for (int r = 0; r < 3; ++r) EXPECT_FALSE(plan.options[s][r].fits) << s << " " << r;
  }
  std::string all;
  for (const auto& r : plan.reasons) all += r + "\n";
  EXPECT_NE(all.find("nothing fits without optimizer offload"), std::string::npos) << all;
  EXPECT_NE(all.find("stage 2 would fit on 21 or more"), std::string::npos) << all;
  ASSERT_TRUE(plan.found) << all;
  EXPECT_TRUE(plan.best.offload);
  EXPECT_EQ(plan.best.stage, 1);
  EXPECT_EQ(plan.best.recompute, Recompute::kCheckpoint);
  const int64_t psi = kLlama7b, e = bucket_buffer_elements(in, 1);
  const int64_t device_states = 2 * psi + 2 * 2 * (e + e / 8);
  EXPECT_EQ(largest_micro_batch(device_states, lim.budget(), false), 0);
  const int64_t b = largest_micro_batch(device_states, lim.budget(), true);
  EXPECT_EQ(b, 4);
  EXPECT_EQ(plan.best.micro_batch, b);
  EXPECT_EQ(plan.best.total(), device_states + llama7b_activations(b, true));
  // Host: 18Ψ/8 per rank plus the landing ring (3 bucket shards in bf16), 8 ranks per node =
  // 124 GB of a node's memory.
  const int64_t ring = 3 * 2 * (e / 8);
  EXPECT_EQ(plan.best.host(), 18 * (psi / 8) + ring);
  EXPECT_EQ(plan.host_per_node, 8 * (18 * (psi / 8) + ring));
  EXPECT_TRUE(plan.host_fits);
  lim.host_bytes = parse_byte_size("128GB");
  EXPECT_FALSE(plan_memory(in, lim).host_fits) << "124 GB > 115.2 GB";
  lim.ranks_per_node = 4;  // two nodes of 4 GPUs: 62.1 GB each
  EXPECT_TRUE(plan_memory(in, lim).host_fits);

  // At 24 ranks the same device holds stage 2 without optimizer offload, and then only with
  // checkpoints in some form.
  const MemoryPlan wide = plan_memory(llama7b(24), lim);
  ASSERT_TRUE(wide.found);
  EXPECT_FALSE(wide.best.offload);
  EXPECT_GE(wide.best.stage, 1) << "stage 1 without accumulation holds what stage 2 does";
  EXPECT_NE(wide.best.recompute, Recompute::kNone);
}

TEST(MemoryPlan, OffloadOnlyWhenNothingElseFitsOrWhenAsked) {
  PlanLimits lim;
  lim.device_bytes = parse_byte_size("80GB");
  const MemoryPlan plan = plan_memory(llama7b(8), lim);
  ASSERT_TRUE(plan.found);
  EXPECT_FALSE(plan.best.offload) << "stage 1 fits without it";
  EXPECT_TRUE(plan.offload[1][0].fits) << "offload fits too, but is not needed";
  // Offload turned on by the user: only stages 1 and 2 are considered, with offload's split.
  PlanInput on = llama7b(8);
  on.offload_optimizer = true;
  const MemoryPlan asked = plan_memory(on, lim);
  ASSERT_TRUE(asked.found);
  EXPECT_TRUE(asked.best.offload);
  EXPECT_EQ(asked.best.stage, 1);
  EXPECT_GT(asked.best.micro_batch, plan.best.micro_batch) << "more device memory left";
  EXPECT_EQ(asked.best.host(), 18 * (kLlama7b / 8) + 3 * 2 * bucket_buffer_elements(on, 1) / 8);
  for (int r = 0; r < 3; ++r) EXPECT_FALSE(asked.offload[0][r].fits);
}

TEST(MemoryPlan, WithoutAShapeOnlyModelStagesCount) {
  PlanInput in;
  in.num_params = 7'000'000'000;
  in.world_size = 8;
  PlanLimits lim;
  lim.device_bytes = parse_byte_size("80GiB");
  const MemoryPlan plan = plan_memory(in, lim);
  EXPECT_EQ(predict_activations(in, Recompute::kNone).peak(), 0);
  ASSERT_TRUE(plan.found);
  EXPECT_EQ(plan.best.stage, 1) << "stages 1 and 2 both fit; the lower one does less";
  EXPECT_EQ(plan.best.micro_batch, 1);
}

TEST(MemoryPlan, ParsesDeviceSizes) {
  EXPECT_EQ(parse_byte_size("80GB"), 80'000'000'000);
  EXPECT_EQ(parse_byte_size("80GiB"), 80LL << 30);
  EXPECT_EQ(parse_byte_size("80e9"), 80'000'000'000);
  EXPECT_EQ(parse_byte_size("24 gb"), 24'000'000'000);
  EXPECT_EQ(parse_byte_size("1.5TB"), 1'500'000'000'000);
  EXPECT_EQ(parse_byte_size("512MiB"), 512LL << 20);
  EXPECT_THROW(parse_byte_size("80 parsecs"), std::invalid_argument);
  EXPECT_THROW(parse_byte_size("GB"), std::invalid_argument);
}

TEST(MemoryPlan, SvgIsWellFormedWithOneRectPerNonzeroSegment) {
  PlanInput in = llama7b(8);
  in.param_bytes = in.comm_bytes = 4;  // fp32: stage 0 has no master and no buffers
  const ActivationEstimate act = predict_activations(in, Recompute::kNone);
  MemoryChart chart;
  chart.title = "LLaMA-7B <fp32> & friends";  // escaped, or the XML breaks
  chart.limit_bytes = parse_byte_size("80GB");
  chart.limit_label = "80 GB";
  int nonzero = 0;
  for (int s = 0; s < 3; ++s) {
    const MemoryBreakdown b = plan_model_states(in, s);
    ChartBar bar{"stage " + std::to_string(s),
                 {{"parameters", b.params},
                  {"gradients", b.grads},
                  {"fp32 master", b.master},
                  {"optimizer states", b.optimizer},
                  {"bucket buffers", b.comm_buffers},
                  {"activations", act.peak()}}};
    for (const auto& seg : bar.segments) nonzero += seg.bytes > 0;
    chart.bars.push_back(bar);
  }
  ASSERT_EQ(nonzero, 3 * 6 - 4) << "fp32: no master at any stage; stage 0: no buffers";
  const std::string svg = memory_chart_svg(chart);
  EXPECT_EQ(svg.rfind("<svg ", 0), 0u);
  EXPECT_EQ(svg.substr(svg.size() - 7), "</svg>\n");
  EXPECT_EQ(count(svg, "<rect"), nonzero);
  EXPECT_EQ(count(svg, "</rect>"), nonzero);
  EXPECT_EQ(count(svg, "<svg"), 1);
  EXPECT_EQ(count(svg, "stroke-dasharray"), 1) << "one device-memory line";
  EXPECT_EQ(count(svg, "<circle"), 5) << "one legend entry per category held (no fp32 master)";
  EXPECT_NE(svg.find("LLaMA-7B &lt;fp32&gt; &amp; friends"), std::string::npos);
  EXPECT_EQ(svg.find("<fp32>"), std::string::npos);
  EXPECT_EQ(count(svg, "<text"), count(svg, "</text>"));
}

// The planner's gradient buckets (bucket_sizes, max_bucket_elements) against the engine's own
// layout of a real example GPT: FlatLayout::build over the module's parameters in reverse
// registration order, as zero::initialize lays them out (zero/params/flat_params.cpp).
TEST(MemoryPlan, BucketsAreTheEnginesForTheExampleGpt) {
  for (const int64_t kv : {0, 2}) {
    models::GptConfig c = models::gpt_preset("tiny");
    c.kv_heads = kv;  // 0: multi-head; 2 of 4 heads: grouped-query
    c.tied = kv == 0;
    models::Gpt gpt(c);
    std::vector<ParamSpec> specs;
    const auto named = gpt->named_parameters();
    for (auto it = named.end(); it != named.begin();) {
      --it;
      specs.push_back({it->key(), it->value().numel()});
    }
    PlanInput in;
    in.shape = {c.layers, c.dim, c.heads, c.ffn_dim(), c.vocab, c.tied, c.kv_heads};
    in.num_params = c.num_params();
    ASSERT_EQ(in.shape.num_params(), in.num_params);
    for (const int64_t bucket : {3000, 20000, 70000}) {
      in.bucket_elements = bucket;
      const FlatLayout layout = FlatLayout::build(specs, bucket, 1, 1);
      std::vector<int64_t> engine;
      for (const BucketSlot& b : layout.buckets()) engine.push_back(b.shard.numel);
      EXPECT_EQ(bucket_sizes(in), engine) << "kv_heads " << kv << ", buckets of " << bucket;
      EXPECT_EQ(max_bucket_elements(in), layout.max_bucket_numel())
          << "kv_heads " << kv << ", buckets of " << bucket;
    }
  }
}

}  // namespace
}  // namespace zero
