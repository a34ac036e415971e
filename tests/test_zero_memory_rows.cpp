// zero-memory's model-state rows (tools/zero_memory_rows.hpp, what the tool prints) against the
// ZeRO formulas worked out here: optimizer offload at stage 3 (the fp32 master, the optimizer
// states and the gradient shard on the host, the root and the 1/N compute shard on the device),
// and stage 3's error-feedback residual counted as host memory, not device memory.
#include <gtest/gtest.h>

#include <cstdint>

#include "tools/zero_memory_rows.hpp"
#include "zero/memory_plan.hpp"

namespace zero {
namespace {

constexpr int64_t kLlama7b = 6'738'415'616;  // examples/gpt.hpp's "llama-7b", exact
constexpr int64_t kBucket = 1 << 20;  // below every block unit; a multiple of N·64 (alignment)

// LLaMA-7B's shape as the example GPT builds it, with buckets of kBucket elements so that the
// bucket buffer is kBucket at every stage (the largest bucket inside a unit is larger).
PlanInput llama7b(int world, int param_bytes) {
  PlanInput in;
  in.shape = {/*layers=*/32, /*hidden=*/4096, /*heads=*/32,
              /*ffn=*/11008, /*vocab=*/32000,
              /*tied=*/false};
  in.num_params = kLlama7b;
  in.world_size = world;
  in.param_bytes = in.comm_bytes = param_bytes;
  in.grad_accum_bytes = 4;
  in.optimizer_states = 2;  // AdamW
  in.bucket_elements = kBucket;
  return in;
}

// The planner truncates each term to whole bytes: a few bytes apart at most.
constexpr double kSlack = 16;

// Host part under optimizer offload at stages 1-3, per rank: the fp32 master 4Ψ/N, the K fp32
// states 4KΨ/N, the fp32 gradient shard 4Ψ/N and its p-byte copy pΨ/N, plus the pinned ring of
// three bucket shards in the communication dtype, 3·c·B/N.
double offload_host_formula(const PlanInput& in) {
  const double psi = static_cast<double>(in.num_params), n = in.world_size;
  return (4 + 4.0 * in.optimizer_states + 4 + in.param_bytes) * psi / n +
         3.0 * in.comm_bytes * static_cast<double>(kBucket / in.world_size);
}

TEST(ZeroMemoryRows, OptimizerOffloadAtStage3IsTheFormula) {
  for (const int p : {2, 4}) {
    for (const int n : {4, 8}) {
      SCOPED_TRACE("param bytes " + std::to_string(p) + ", N = " + std::to_string(n));
      const PlanInput in = llama7b(n, p);
      ASSERT_EQ(bucket_buffer_elements(in, 3), kBucket);
      const double psi = static_cast<double>(in.num_params);
      const double root = static_cast<double>(stage3_root_params(in));
      ASSERT_GT(root, 0);
      const tools::OffloadSplit split = tools::optimizer_offload_split(in, 3);
      // The device keeps the root unit whole and the p-byte compute shard of the flat buffer
      // (under offload a shard of its own in fp32 too: the master is on the host).
      EXPECT_NEAR(static_cast<double>(split.device), p * root + p * psi / n, kSlack);
      EXPECT_NEAR(static_cast<double>(split.host), offload_host_formula(in), kSlack);
      // Stages 1 and 2 keep all pΨ parameters and the bucket buffers on the device; the host
      // part is the same formula.
      for (const int s : {1, 2}) {
        EXPECT_NEAR(static_cast<double>(tools::optimizer_offload_split(in, s).host),
                    offload_host_formula(in), kSlack);
        EXPECT_GE(tools::optimizer_offload_split(in, s).device, p * in.num_params);
      }
      // The engine refuses offload at stage 0.
      EXPECT_EQ(tools::optimizer_offload_split(in, 0).device, 0);
      EXPECT_EQ(tools::optimizer_offload_split(in, 0).host, 0);
    }
  }
}

// Stage 3 keeps the residual of every gradient element it sends (Ψ elements of the storage
// dtype; int8: plus a 4-byte scale per block) in page-locked host memory and two device staging
// buffers of one bucket each; stages 1 and 2 keep the residual on the device.
TEST(ZeroMemoryRows, Stage3ErrorFeedbackResidualIsHostMemory) {
  struct Case {
    int store;  // error_feedback_store_bytes: 0 auto (comm dtype), 4, 2 or 1 (int8)
    double per_element;
  };
  const int64_t block = PlanInput{}.quantized_block;
  for (const Case k : {Case{0, 2.0}, Case{4, 4.0}, Case{1, (block + 4.0) / block}}) {
    SCOPED_TRACE("store " + std::to_string(k.store));
    const int n = 8;
    PlanInput plain = llama7b(n, 2);
    PlanInput in = plain;
    in.quantized_bits = 8;
    in.error_feedback_store_bytes = k.store;
    const double psi = static_cast<double>(in.num_params);
    const double root = static_cast<double>(stage3_root_params(in));
    const double residual = k.per_element * psi;         // int8: LLaMA-7B's Ψ is whole blocks
    const double staging = 2 * k.per_element * kBucket;  // two bucket-sized device buffers
    // In host memory: the residual alone.
    EXPECT_NEAR(static_cast<double>(plan_host_states(in, 3)), residual, block + 4.0);
    // On the device: the root whole, the fp32 master and the AdamW states' shards (no bf16 copy
    // of the shard: each gather rounds the master; no gradient shard or bucket buffers between
    // steps), and the staging buffers.
    const double device = 2 * root + (4 + 8) * psi / n;
    EXPECT_NEAR(static_cast<double>(tools::device_model_states(plain, 3)), device, kSlack);
    EXPECT_NEAR(static_cast<double>(tools::device_model_states(in, 3)), device + staging,
                kSlack + 2 * 4.0);
    // The categories still hold the residual (the table lists it under bucket buffers) ...
    EXPECT_EQ(plan_model_states(in, 3).total() - tools::device_model_states(in, 3),
              plan_host_states(in, 3));
    // ... and stages 1 and 2 keep theirs on the device: nothing of it in host memory.
    for (const int s : {1, 2}) {
      EXPECT_EQ(plan_host_states(in, s), 0);
      EXPECT_EQ(tools::device_model_states(in, s), plan_model_states(in, s).total());
      EXPECT_NEAR(static_cast<double>(error_feedback_bytes(in, s)), residual, block + 4.0);
    }
    // With optimizer offload as well the host holds both.
    EXPECT_NEAR(static_cast<double>(tools::optimizer_offload_split(in, 3).host),
                offload_host_formula(in) + residual, block + kSlack);
  }
}

}  // namespace
}  // namespace zero
