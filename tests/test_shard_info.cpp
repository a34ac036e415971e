// Partition math: sizes, offsets, padding, straddling parameters, awkward world sizes.
#include <gtest/gtest.h>

#include <numeric>

#include "zero/params/shard_info.hpp"

namespace zero {
namespace {

TEST(ShardInfo, PadsToWorldTimesAlign) {
  ShardInfo s{10, 4, 2};
  EXPECT_EQ(s.padded_numel(), 16);
  EXPECT_EQ(s.shard_numel(), 4);
  EXPECT_EQ(s.padding(), 6);
  EXPECT_EQ(s.shard(3), (Range{12, 16}));
}

TEST(ShardInfo, ExactFitHasNoPadding) {
  ShardInfo s{24, 3, 4};
  EXPECT_EQ(s.padded_numel(), 24);
  EXPECT_EQ(s.padding(), 0);
  EXPECT_EQ(s.shard_numel(), 8);
}

TEST(ShardInfo, OwnedClipsToShard) {
  ShardInfo s{100, 4, 1};  // shards of 25
  EXPECT_EQ(s.owned(0, {20, 30}), (Range{20, 25}));
  EXPECT_EQ(s.owned(1, {20, 30}), (Range{25, 30}));
  EXPECT_TRUE(s.owned(2, {20, 30}).empty());
}

TEST(FlatLayout, BucketsCloseBeforeOverflowingAndKeepOrder) {
  // DeepSpeed's rule: 7 + 5 > 10 closes bucket 0 before b joins; 5 + 20 > 10 closes [b]; 20
  // alone exceeds the size and closes at once; 3 is the tail. No bucket holds more than 10
  // elements except the one made of the single parameter larger than that.
  auto L = FlatLayout::build({{"a", 7}, {"b", 5}, {"c", 20}, {"d", 3}}, 10, 2, 1);
  ASSERT_EQ(L.buckets().size(), 4u);
  EXPECT_EQ(L.buckets()[0].params, (std::vector<int>{0}));
  EXPECT_EQ(L.buckets()[1].params, (std::vector<int>{1}));
  EXPECT_EQ(L.buckets()[2].params, (std::vector<int>{2}));
  EXPECT_EQ(L.buckets()[3].params, (std::vector<int>{3}));
  EXPECT_EQ(L.num_elements(), 35);
  // Paddings: 7 -> 8, 5 -> 6, 20 -> 20, 3 -> 4.
  EXPECT_EQ(L.total_numel(), 38);
  EXPECT_EQ(L.shard_numel(), 19);
  EXPECT_EQ(L.params()[1].flat_offset, 8);
  EXPECT_EQ(L.params()[2].flat_offset, 14);
  EXPECT_EQ(L.params()[3].flat_offset, 34);
  EXPECT_EQ(L.buckets()[3].shard_offset, 4 + 3 + 10);
}

// A bucket that a parameter fills exactly stays whole, and parameters that fit keep joining.
TEST(FlatLayout, BucketsFillUpToTheSizeExactly) {
  auto L = FlatLayout::build({{"a", 4}, {"b", 6}, {"c", 3}, {"d", 3}, {"e", 5}}, 10, 1, 1);
  ASSERT_EQ(L.buckets().size(), 3u);
  EXPECT_EQ(L.buckets()[0].params, (std::vector<int>{0, 1}));  // 4 + 6 = 10
  EXPECT_EQ(L.buckets()[1].params, (std::vector<int>{2, 3}));  // 3 + 3, and 6 + 5 > 10
  EXPECT_EQ(L.buckets()[2].params, (std::vector<int>{4}));
}

TEST(FlatLayout, ZeroSizedParametersAreSkipped) {
  auto L = FlatLayout::build({{"a", 4}, {"empty", 0}, {"b", 4}}, 100, 2, 1);
  EXPECT_EQ(L.params().size(), 2u);
  EXPECT_EQ(L.num_elements(), 8);
}

TEST(FlatLayout, RejectsNonPositiveArguments) {
  EXPECT_THROW(FlatLayout::build({{"a", 4}}, 0, 2, 1), std::invalid_argument);
  EXPECT_THROW(FlatLayout::build({{"a", 4}}, 10, 0, 1), std::invalid_argument);
}

// Every element of every parameter is owned by exactly one rank, in a shard slot of its own,
// whatever the world size, alignment and bucket size.
TEST(FlatLayout, OwnedPiecesPartitionEveryParameterExactly) {
  const std::vector<ParamSpec> params = {{"w1", 37}, {"b1", 5},  {"w2", 101},
                                         {"n", 1},   {"w3", 64}, {"b3", 7}};
  for (int world : {1, 2, 3, 4, 7}) {
    for (int64_t align : {1, 4, 16}) {
      for (int64_t bucket : {1, 30, 64, 1000}) {
        auto L = FlatLayout::build(params, bucket, world, align);
        ASSERT_EQ(L.total_numel() % world, 0);
        std::vector<std::vector<int>> owner(params.size());
        for (size_t i = 0; i < params.size(); ++i) owner[i].assign(params[i].numel, -1);
        int64_t owned_total = 0;
        for (int r = 0; r < world; ++r) {
          std::vector<char> slot_used(L.shard_numel(), 0);
          for (const OwnedPiece& p : L.owned_pieces(r)) {
            for (int64_t k = 0; k < p.numel; ++k) {
              ASSERT_EQ(owner[p.param][p.param_offset + k], -1);
              owner[p.param][p.param_offset + k] = r;
              ASSERT_LT(p.shard_offset + k, L.shard_numel());
              ASSERT_FALSE(slot_used[p.shard_offset + k]);
              slot_used[p.shard_offset + k] = 1;
            }
            owned_total += p.numel;
          }
        }
        EXPECT_EQ(owned_total, L.num_elements()) << "world " << world << " bucket " << bucket;
        for (auto& o : owner)
          for (int r : o) ASSERT_GE(r, 0);
        // Padding per bucket stays below one aligned row of shards.
        for (const auto& b : L.buckets()) EXPECT_LT(b.shard.padding(), world * align);
      }
    }
  }
}

TEST(FlatLayout, StraddlingParameterSplitsAcrossRanks) {
  // One bucket of 10 elements over 2 ranks: "b" covers [4, 8) and straddles the boundary at 5.
  auto L = FlatLayout::build({{"a", 4}, {"b", 4}, {"c", 2}}, 100, 2, 1);
  auto r0 = L.owned_pieces(0);
  auto r1 = L.owned_pieces(1);
  ASSERT_EQ(r0.size(), 2u);
  EXPECT_EQ(r0[1].param, 1);
  EXPECT_EQ(r0[1].numel, 1);
  EXPECT_EQ(r0[1].shard_offset, 4);
  ASSERT_EQ(r1.size(), 2u);
  EXPECT_EQ(r1[0].param, 1);
  EXPECT_EQ(r1[0].param_offset, 1);
  EXPECT_EQ(r1[0].numel, 3);
  EXPECT_EQ(r1[0].shard_offset, 0);
}

TEST(FlatLayout, OwnedRangesMergeAdjacentSelectedPieces) {
  auto L = FlatLayout::build({{"w", 6}, {"bias", 2}, {"w2", 4}}, 100, 1, 1);
  auto decay = L.owned_ranges(0, [](const ParamSlot& p) { return p.name != "bias"; });
  EXPECT_EQ(decay, (std::vector<Range>{{0, 6}, {8, 12}}));
  auto all = L.owned_ranges(0, [](const ParamSlot&) { return true; });
  EXPECT_EQ(all, (std::vector<Range>{{0, 12}}));
}

}  // namespace
}  // namespace zero
