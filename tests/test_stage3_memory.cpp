// ZeRO stage 3's memory on the fake accelerator, whose allocator counts every device byte
// exactly (tests/support/fake_device.hpp): what a rank holds per phase, measured, against
// what the engine declares.
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>
#include <torch/nn/modules/linear.h>

#include <cstdio>
#include <mutex>
#include <vector>

#include "support/fake_device.hpp"
#include "support/stage3_net.hpp"
#include "support/thread_group.hpp"
#include "support/tiny_net.hpp"
#include "zero/engine.hpp"
#include "zero/host_counting.hpp"
#include "zero/memory.hpp"
#include "zero/sharding.hpp"

namespace zero::testing {
namespace {

// kBlocks marked blocks, then a head (the root unit). Wide blocks and few rows: a block's
// parameters (256 x 256 + 3 x 256 floats, 265 KB) outweigh what its activations hold.
constexpr int64_t kWidth = kStage3DeepWidth;
constexpr int kBlocks = kStage3DeepBlocks;
constexpr int64_t kRows = 8;

using DeepNet = Stage3DeepNetImpl;

std::shared_ptr<DeepNet> make_deep_net(const c10::Device& d) {
  auto net = std::make_shared<DeepNet>();
  auto gen = at::make_generator<at::CPUGeneratorImpl>(9);
  {
    at::NoGradGuard g;
    for (auto& p : net->parameters()) p.copy_(at::randn(p.sizes(), gen) * 0.05);
  }
  for (size_t i = 0; i < net->body->size(); ++i) zero::shard(net->body->block_module(i));
  net->to(d);
  return net;
}

// Rank r's loss on step s's batch (kWorld ranks), its inputs widened to the blocks' width and
// in the parameters' dtype.
at::Tensor step_loss(DeepNet& net, int s, int r, int world, const c10::Device& d,
                     at::ScalarType dtype = at::kFloat) {
  const Batch b = rank_micro_batch(global_batch(s, kRows), r, world, 0, 1);
  at::Tensor x = at::zeros({b.x.size(0), kWidth});
  x.narrow(1, 0, b.x.size(1)).copy_(b.x);
  return mse(net.forward(x.to(d, dtype)).to(at::kFloat), b.y.to(d));
}

// One block's parameters in bytes (fp32).
constexpr int64_t kUnitBytes = 4 * (kWidth * kWidth + 3 * kWidth);

// M1 of review 06e: the first backward (the pass that counts each parameter's gradients) held
// every unit it re-gathered until it ended, the whole model on top of step 1's activations and
// gradients; later passes release a unit once its gradients are in. Measured as the fake
// allocator's peak above the bytes held when backward starts, first backward against the third.
TEST(Stage3Memory, FirstBackwardHoldsNoMoreUnitsThanLaterOnes) {
  constexpr int kWorld = 2;
  Config cfg = test_config(3, kRows / kWorld, 1, 0.0, /*bucket=*/kWidth * kWidth);
  cfg.zero_optimization.stage3.param_persistence_threshold = 0;
  // Gathered on use only: no prefetch, and no unit kept from its forward into its backward
  // (DeepSpeed's defaults keep every unit of a model this small; test_stage3_prefetch measures
  // what those keys hold).
  cfg.zero_optimization.stage3.prefetch_bucket_size = 0;
  cfg.zero_optimization.stage3.max_reuse_distance = 0;
  std::vector<std::vector<int64_t>> peaks(kWorld);
  std::vector<int64_t> padded(kWorld);
  run_ranks(
      kWorld,
      [&](std::shared_ptr<comm::Group> group) {
        const int r = group->rank();
        const c10::Device d = fake::device(r);
        auto net = make_deep_net(d);
        auto engine = initialize(net, cfg, group);
        padded[r] = engine.memory_report().padded_params;
        for (int s = 0; s < 3; ++s) {
          const at::Tensor loss = step_loss(*net, s, r, kWorld, d);
          const int64_t before = fake::allocated_bytes(r);
          fake::reset_peak(r);
          engine.backward(loss);
          peaks[r].push_back(fake::peak_bytes(r) - before);
          engine.step();
        }
      },
      std::chrono::seconds(60), fake::device().type());
  for (int r = 0; r < kWorld; ++r) {
    // Every backward also allocates the gradient path, held from the first reduction to the
    // step: the fp32 gradient shard and two bucket buffers (65,536 elements and their half).
    const int64_t path = 4 * padded[r] / kWorld + 2 * 4 * (kWidth * kWidth * 3 / 2);
    std::printf(
        "rank %d: backward peaks above its start %lld, %lld, %lld B (one unit %lld B, gradient "
        "shard + bucket buffers %lld B)\n",
        r, static_cast<long long>(peaks[r][0]), static_cast<long long>(peaks[r][1]),
        static_cast<long long>(peaks[r][2]), static_cast<long long>(kUnitBytes),
        static_cast<long long>(path));
    // Later passes hold about one unit gathered and its gradients in flight.
    EXPECT_LT(peaks[r][2] - path, 4 * kUnitBytes) << "rank " << r;
    // The first pass: the same, not kBlocks units.
    EXPECT_LT(peaks[r][0], peaks[r][2] + kUnitBytes / 2) << "rank " << r;
  }
}

// The gradient shard is one piece per unit, each allocated by the first reduction into it
// (grad_sink.hpp): at DeepSpeed's defaults every unit stays gathered from its forward into its
// backward, and the whole shard used to be allocated beside them at backward's first
// reduction. Now, at any moment of backward, a rank holds at most every unit gathered plus the
// pieces of the units whose backward has begun, each of which gives back its gathered
// parameters (N times the piece) once its gradients are in: gathered + shard <= the gathered
// model + two units' pieces (the unit being reduced and the one whose gradients are still
// arriving). Read from the host's counting allocator's split at backward's peak (both ranks'
// threads count into it, so the bound is both ranks'); the pieces add up to the whole shard
// at backward's end and are freed by the step. On CPU: the tags are the host counter's.
TEST(Stage3Memory, GradientShardGrowsWithBackward) {
  constexpr int kWorld = 2;
  HostCountingAllocator& host = HostCountingAllocator::get();
  Config cfg = test_config(3, kRows / kWorld, 1, 1.0, /*bucket=*/kWidth * kWidth);
  cfg.zero_optimization.stage3.param_persistence_threshold = 0;  // DeepSpeed's reuse/prefetch
  std::vector<int64_t> padded(kWorld), gathered_model(kWorld);
  HostTagBytes at_peak{}, after_backward{}, after_step{};
  run_ranks(kWorld, [&](std::shared_ptr<comm::Group> group) {
    const int r = group->rank();
    auto net = make_deep_net(c10::Device(c10::kCPU));
    auto engine = initialize(net, cfg, group);
    padded[r] = engine.memory_report().padded_params;
    for (int s = 0; s < 3; ++s) {
      const at::Tensor loss = step_loss(*net, s, r, kWorld, c10::Device(c10::kCPU));
      group->barrier("after forward");
      if (s == 2) {  // every unit is gathered now, kept for its backward (max_reuse_distance)
        gathered_model[r] = host.in_use_by_tag()[static_cast<int>(HostTag::kGathered)];
      }
      group->barrier("before the measured backward");
      if (r == 0 && s == 2) host.reset_peak();
      group->barrier("peak reset");
      engine.backward(loss);
      group->barrier("after the measured backward");
      if (r == 0 && s == 2) {
        at_peak = host.peak_by_tag();
        after_backward = host.in_use_by_tag();
      }
      engine.step();
      group->barrier("after the step");
      if (r == 0 && s == 2) after_step = host.in_use_by_tag();
    }
  });
  const auto tag = [](const HostTagBytes& t, HostTag k) { return t[static_cast<int>(k)]; };
  // Both ranks' gathered model, read once both ranks' last forward ended (the first has no trace to
  // keep units by); a unit's piece of the shard is 4 bytes per element of its padded buckets over
  // N, the largest unit one of kBlocks equal blocks beside a small root.
  const int64_t model = std::max(gathered_model[0], gathered_model[1]);
  const int64_t shard = 4 * (padded[0] + padded[1]) / kWorld;
  const int64_t piece = 4 * (padded[0] / kBlocks) / kWorld;
  const int64_t held = tag(at_peak, HostTag::kGathered) + tag(at_peak, HostTag::kGradShard);
  std::printf(
      "backward peak: gathered %lld + gradient shard %lld B (gathered model, both ranks "
      "%lld B; whole shard %lld B; one unit's piece %lld B)\n",
      static_cast<long long>(tag(at_peak, HostTag::kGathered)),
      static_cast<long long>(tag(at_peak, HostTag::kGradShard)), static_cast<long long>(model),
      static_cast<long long>(shard), static_cast<long long>(piece));
  EXPECT_GE(model, kWorld * kBlocks * kUnitBytes);
  EXPECT_LE(held, model + kWorld * 2 * piece);
  // The pieces are the whole shard once backward ended, and the step freed them.
  EXPECT_EQ(tag(after_backward, HostTag::kGradShard), shard);
  EXPECT_EQ(tag(after_step, HostTag::kGradShard), 0);
}

// bf16 at stage 3 keeps no compute-dtype copy of the shard (issue 33): each gather rounds the
// fp32 master into its output, as FSDP2's MixedPrecisionPolicy casts the sharded parameter at
// each all-gather. Between steps a rank holds the fp32 master and AdamW's two states, 12 bytes
// per element of its shard (12Ψ/N, where it held 14Ψ/N with the copy), the root unit whole in
// bf16 and no gradient path: counted by the fake allocator (every device byte), stated by the
// memory report and predicted by the formula (include/zero/memory.hpp).
TEST(Stage3Memory, Bf16ModelStatesAreTheMasterAndStatesAlone) {
  constexpr int kWorld = 2;
  for (const bool bf16 : {true, false}) {  // fp32: the master is the shard the gathers send
    SCOPED_TRACE(bf16 ? "bf16" : "fp32");
    const int64_t pb = bf16 ? 2 : 4;
    Config cfg = test_config(3, kRows / kWorld, 1, 0.0, /*bucket=*/kWidth * kWidth);
    cfg.zero_optimization.stage3.param_persistence_threshold = 0;
    cfg.bf16 = bf16;
    std::vector<int64_t> before(kWorld), between(kWorld);
    std::vector<MemoryReport> reports(kWorld);
    run_ranks(
        kWorld,
        [&](std::shared_ptr<comm::Group> group) {
          const int r = group->rank();
          const c10::Device d = fake::device(r);
          auto net = make_deep_net(d);
          before[r] = fake::allocated_bytes(r);
          auto engine = initialize(net, cfg, group);
          for (int s = 0; s < 3; ++s) {  // AdamW's states exist from the first step
            engine.backward(step_loss(*net, s, r, kWorld, d, bf16 ? at::kBFloat16 : at::kFloat));
            engine.step();
          }
          between[r] = fake::allocated_bytes(r);
          reports[r] = engine.memory_report();
        },
        std::chrono::seconds(60), fake::device().type());
    // The root unit: the head, whole on every rank.
    const int64_t root = kWidth * 5 + 5;
    for (int r = 0; r < kWorld; ++r) {
      const MemoryReport& rep = reports[r];
      const MemoryBreakdown& m = rep.measured;
      const int64_t shard = rep.padded_params / kWorld;  // elements, padding included
      const int64_t held = between[r] - (before[r] - rep.replaced_param_bytes);
      std::printf(
          "%s rank %d: between steps %lld B on the device (report: params %lld, master %lld, "
          "optimizer %lld, gradients %lld, buffers %lld; predicted %lld); shard %lld elements, "
          "12 B each %lld B, the copy it no longer keeps %lld B\n",
          bf16 ? "bf16" : "fp32", r, static_cast<long long>(held), static_cast<long long>(m.params),
          static_cast<long long>(m.master), static_cast<long long>(m.optimizer),
          static_cast<long long>(m.grads), static_cast<long long>(m.comm_buffers),
          static_cast<long long>(rep.predicted.total()), static_cast<long long>(shard),
          static_cast<long long>(12 * shard), static_cast<long long>(2 * shard));
      // The allocator: the report's bytes, the fused AdamW's fp32 step count (optim/adamw.cpp)
      // and 8 bytes of device scalars stage 3 keeps beside them, the same in fp32 and bf16 (not
      // in the report; found with this test, not yet traced to their owner).
      EXPECT_EQ(held, m.total() + 4 + 8) << "rank " << r;
      // The report: 12 bytes per shard element and the root in p bytes (its unit's padding
      // included), nothing of the blocks' parameters, no gradient path.
      EXPECT_EQ(m.master + m.optimizer, 12 * shard) << "rank " << r;
      EXPECT_GE(m.params, pb * root) << "rank " << r;
      EXPECT_LT(m.params, pb * (root + 64 * kWorld)) << "rank " << r;
      EXPECT_EQ(m.grads, 0) << "rank " << r;
      EXPECT_EQ(m.comm_buffers, 0) << "rank " << r;
      // The formula, on the unpadded count: 12Ψ/N + pΨ_root.
      const MemoryBreakdown& p = rep.predicted;
      EXPECT_EQ(p.master + p.optimizer, 12 * rep.num_params / kWorld) << "rank " << r;
      EXPECT_EQ(p.params, pb * root) << "rank " << r;
      EXPECT_EQ(p.grads + p.comm_buffers, 0) << "rank " << r;
      // Each bucket (at most two per block, and the root's) pads its shard by under 64 elements.
      EXPECT_LE(m.total() - p.total(), 12 * 64 * (2 * kBlocks + 1) + pb * 64 * kWorld)
          << "rank " << r << ": padding only";
    }
  }
}

}  // namespace
}  // namespace zero::testing
