// torch_adam's gradient norm is DeepSpeed's to the bit: each of DeepSpeed's contiguous rank
// partitions of the flat parameters (registration order, padded to 2 x N) summed in fp64 and
// rounded to fp32, the rounded sums added in rank order. The reference applies that rule to the
// whole gradient in one process; the engine's ranks hold their shard of every (small) bucket,
// a different split, and must still land on the same fp32 value.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <unordered_map>
#include <vector>

#include "support/thread_group.hpp"
#include "support/tiny_net.hpp"
#include "zero/params/flat_params.hpp"
#include "zero/step/deepspeed_norm.hpp"

namespace zero::testing {
namespace {

TEST(DeepSpeedNorm, EqualsDeepSpeedsPartitionSumsBitForBit) {
  std::unordered_map<std::string, int64_t> offset;  // registration order, as DeepSpeed flattens
  int64_t total = 0;
  for (const auto& item : make_tiny_net(0)->named_parameters()) {
    offset[item.key()] = total;
    total += item.value().numel();
  }
  // Magnitudes over many octaves, so that how the squares are grouped shows in fp32: another
  // split of the same elements rounds to a different sum for about one gradient in three.
  at::manual_seed(5);
  std::vector<at::Tensor> grads;
  for (int i = 0; i < 8; ++i) grads.push_back(at::randn({total}) * at::exp(at::randn({total}) * 3));

  for (int world : {2, 3, 4}) {
    const int64_t align = 2 * world;
    const int64_t part = (total + align - 1) / align * align / world;
    std::vector<float> expected(grads.size(), 0.0f);
    for (size_t i = 0; i < grads.size(); ++i) {
      for (int r = 0; r < world; ++r) {
        const int64_t b = std::min(total, r * part), e = std::min(total, (r + 1) * part);
        expected[i] += static_cast<float>(
            grads[i].narrow(0, b, e - b).to(at::kDouble).square().sum().item<double>());
      }
    }
    run_ranks(world, [&](std::shared_ptr<comm::Group> group) {
      auto net = make_tiny_net(0);
      FlattenOptions o;
      o.shards = world;
      o.bucket_numel = 200;  // many buckets: each rank's shard interleaves across the model
      const FlatParams fp = flatten_parameters(*net, *group, o);
      for (size_t i = 0; i < grads.size(); ++i) {
        at::Tensor g = at::zeros({fp.layout.shard_numel()});
        for (const OwnedPiece& p : fp.layout.owned_pieces(group->rank())) {
          const int64_t at = offset.at(fp.layout.params()[p.param].name) + p.param_offset;
          g.narrow(0, p.shard_offset, p.numel).copy_(grads[i].narrow(0, at, p.numel));
        }
        const at::Tensor sq = deepspeed_squared_norm(
            g, fp, Sharding::of_stage(/*stage=*/2, group->rank(), group->size()), *group);
        EXPECT_EQ(sq.item<float>(), expected[i])
            << "gradient " << i << ", world " << world << ", rank " << group->rank();
      }
    });
  }
}

// Stage 3's rule (DeepSpeed's ZeRO-3): fp64 to the end. Each rank sums its own pieces of the
// gradient; after the all-reduce every rank holds the one-process fp64 sum of squares to fp64
// rounding, whatever the split, where ZeRO-2's rule (above) rounds each partition to fp32.
TEST(DeepSpeedNorm, Stage3SumsInFp64WhateverTheSplit) {
  at::manual_seed(7);
  const int64_t total = 5003;
  const at::Tensor grad = at::randn({total}) * at::exp(at::randn({total}) * 3);
  const double expected = grad.to(at::kDouble).square().sum().item<double>();
  int differs_in_fp32 = 0;
  for (int world : {2, 3, 4}) {
    // ZeRO-2's rule on the same gradient: contiguous partitions rounded to fp32, then added.
    const int64_t part = (total + world - 1) / world;
    float rounded = 0;
    for (int r = 0; r < world; ++r) {
      const int64_t b = std::min(total, r * part), e = std::min(total, (r + 1) * part);
      rounded += static_cast<float>(
          grad.narrow(0, b, e - b).to(at::kDouble).square().sum().item<double>());
    }
    differs_in_fp32 += static_cast<double>(rounded) != expected;
    run_ranks(world, [&](std::shared_ptr<comm::Group> group) {
      // Rank r holds every world-th run of 100 elements, several pieces each: not DeepSpeed's
      // per-parameter slices, which must not matter.
      std::vector<optim::Range> pieces;
      for (int64_t b = 100 * group->rank(); b < total; b += 100 * world)
        pieces.push_back({b, std::min(total, b + 100)});
      at::Tensor sq = deepspeed3_squared_norm(grad, pieces);
      ASSERT_EQ(sq.scalar_type(), at::kDouble);
      group->all_reduce_sum(sq, "test").wait();
      EXPECT_NEAR(sq.item<double>(), expected, expected * 1e-14)
          << "world " << world << ", rank " << group->rank();
    });
  }
  // The two rules are different numbers: fp32 rounding shows at this spread of magnitudes.
  EXPECT_GT(differs_in_fp32, 0);
}

}  // namespace
}  // namespace zero::testing
