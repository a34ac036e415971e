// Partition math: sizes, offsets, padding, straddling parameters, awkward world sizes.
#include <gtest/gtest.h>

#include <numeric>
#include <random>
#include <stdexcept>

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
  EXPECT_THROW(FlatLayout::build({{"a", 4}}, -1, 2, 1), std::invalid_argument);
  EXPECT_THROW(FlatLayout::build({{"a", 4}}, 10, 0, 1), std::invalid_argument);
  EXPECT_THROW(FlatLayout::build({{"a", 4}}, 10, 2, 0), std::invalid_argument);
}

// Bucket size 0 (DeepSpeed's reduce_bucket_size: 0): each parameter alone in its bucket.
TEST(FlatLayout, BucketSizeZeroGivesEachParameterItsOwnBucket) {
  const FlatLayout L = FlatLayout::build({{"a", 4}, {"b", 1}, {"c", 7}}, 0, 2, 1);
  ASSERT_EQ(L.buckets().size(), 3u);
  for (size_t b = 0; b < 3; ++b) EXPECT_EQ(L.buckets()[b].params.size(), 1u) << "bucket " << b;
  // Each reduced whole, as DeepSpeed does: one chunk as large as the largest shard (c's 7
  // elements over 2 ranks: 4), not chunks of `align` elements.
  const FlatLayout big = FlatLayout::build({{"a", 4000}, {"b", 10}}, 0, 2, 64);
  EXPECT_EQ(big.chunk_numel(), 2048);
  EXPECT_EQ(L.chunk_numel(), 4);
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

// DeepSpeed's bucket rule restated on its own (stage_1_and_2.py: a bucket is reduced before the
// parameter that would take it past the size joins, and once it reaches the size): the
// parameter lists of the buckets, empty parameters left out.
std::vector<std::vector<int>> reference_buckets(const std::vector<ParamSpec>& specs,
                                                int64_t bucket_numel) {
  std::vector<std::vector<int>> out;
  std::vector<int> open;
  int64_t n = 0;
  int index = 0;
  for (const ParamSpec& p : specs) {
    if (p.numel <= 0) continue;
    if (n > 0 && n + p.numel > bucket_numel) {
      out.push_back(open);
      open.clear();
      n = 0;
    }
    open.push_back(index++);
    n += p.numel;
    if (n >= bucket_numel) {
      out.push_back(open);
      open.clear();
      n = 0;
    }
  }
  if (!open.empty()) out.push_back(open);
  return out;
}

std::vector<ParamSpec> random_specs(std::mt19937& rng, int units) {
  std::uniform_int_distribution<int> count(0, 12), numel(0, 40), unit_len(1, 5);
  std::vector<ParamSpec> specs;
  const int n = count(rng);
  int unit = 0, left = unit_len(rng);
  for (int i = 0; i < n; ++i) {
    if (units > 1 && left-- == 0) {
      unit = std::min(unit + 1, units - 1);
      left = unit_len(rng);
    }
    specs.push_back({"p" + std::to_string(i), numel(rng), units > 1 ? unit : 0});
  }
  return specs;
}

// All parameters in unit 0 (stages 0-2): the buckets are the rule's, and one unit covers the
// whole layout.
TEST(FlatLayoutUnits, OneUnitIsTheBucketRuleOnRandomSpecs) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 500; ++trial) {
    const std::vector<ParamSpec> specs = random_specs(rng, 1);
    const int64_t bucket = std::uniform_int_distribution<int64_t>(1, 60)(rng);
    const int world = std::uniform_int_distribution<int>(1, 4)(rng);
    const int64_t align = std::uniform_int_distribution<int64_t>(1, 4)(rng);
    const FlatLayout L = FlatLayout::build(specs, bucket, world, align);
    const auto want = reference_buckets(specs, bucket);
    ASSERT_EQ(L.buckets().size(), want.size()) << "trial " << trial;
    int64_t flat = 0, shard = 0;
    for (size_t b = 0; b < want.size(); ++b) {
      const BucketSlot& s = L.buckets()[b];
      EXPECT_EQ(s.params, want[b]);
      EXPECT_EQ(s.flat_offset, flat);
      EXPECT_EQ(s.shard_offset, shard);
      int64_t numel = 0;
      for (int p : s.params) {
        EXPECT_EQ(L.params()[p].flat_offset, flat + numel);
        numel += L.params()[p].numel;
      }
      EXPECT_EQ(s.shard.numel, numel);
      flat += round_up(numel, world * align);
      shard += round_up(numel, world * align) / world;
    }
    ASSERT_EQ(L.units().size(), 1u);
    const UnitSlot& u = L.units()[0];
    EXPECT_EQ(u.unit, 0);
    EXPECT_EQ(u.first_bucket, 0);
    EXPECT_EQ(u.end_bucket, static_cast<int>(want.size()));
    EXPECT_EQ(u.flat_begin, 0);
    EXPECT_EQ(u.flat_end, L.total_numel());
    EXPECT_EQ(u.shard_begin, 0);
    EXPECT_EQ(u.shard_end, L.shard_numel());
    std::vector<int> all(L.params().size());
    std::iota(all.begin(), all.end(), 0);
    EXPECT_EQ(u.params, all);
  }
}

// Several units: each is a run of whole buckets, and its buckets are those of its own specs
// built alone, shifted to where the unit starts.
TEST(FlatLayoutUnits, EachUnitIsItsOwnLayoutShifted) {
  std::mt19937 rng(11);
  for (int trial = 0; trial < 500; ++trial) {
    const std::vector<ParamSpec> specs = random_specs(rng, 4);
    const int64_t bucket = std::uniform_int_distribution<int64_t>(1, 60)(rng);
    const int world = std::uniform_int_distribution<int>(1, 4)(rng);
    const FlatLayout L = FlatLayout::build(specs, bucket, world, 2);
    int end_bucket = 0;
    int64_t flat_end = 0, shard_end = 0;
    size_t params_seen = 0;
    for (const UnitSlot& u : L.units()) {
      EXPECT_EQ(u.first_bucket, end_bucket);
      EXPECT_EQ(u.flat_begin, flat_end);
      EXPECT_EQ(u.shard_begin, shard_end);
      std::vector<ParamSpec> mine;
      for (const ParamSpec& p : specs) {
        if (p.unit == u.unit) mine.push_back(p);
      }
      const FlatLayout alone = FlatLayout::build(mine, bucket, world, 2);
      ASSERT_EQ(u.end_bucket - u.first_bucket, static_cast<int>(alone.buckets().size()));
      for (int b = u.first_bucket; b < u.end_bucket; ++b) {
        const BucketSlot& s = L.buckets()[b];
        const BucketSlot& a = alone.buckets()[b - u.first_bucket];
        EXPECT_EQ(s.flat_offset, u.flat_begin + a.flat_offset);
        EXPECT_EQ(s.shard_offset, u.shard_begin + a.shard_offset);
        EXPECT_EQ(s.shard.numel, a.shard.numel);
        for (int p : s.params) {
          EXPECT_EQ(specs[std::stoi(L.params()[p].name.substr(1))].unit, u.unit);
        }
      }
      for (int p : u.params) {
        EXPECT_GE(L.params()[p].bucket, u.first_bucket);
        EXPECT_LT(L.params()[p].bucket, u.end_bucket);
      }
      EXPECT_EQ(u.flat_end - u.flat_begin, alone.total_numel());
      EXPECT_EQ(u.shard_end - u.shard_begin, alone.shard_numel());
      params_seen += u.params.size();
      end_bucket = u.end_bucket;
      flat_end = u.flat_end;
      shard_end = u.shard_end;
    }
    EXPECT_EQ(end_bucket, static_cast<int>(L.buckets().size()));
    EXPECT_EQ(flat_end, L.total_numel());
    EXPECT_EQ(params_seen, L.params().size());
  }
}

TEST(FlatLayoutUnits, AUnitInTwoRunsIsRefused) {
  EXPECT_THROW(FlatLayout::build({{"a", 3, 0}, {"b", 3, 1}, {"c", 3, 0}}, 10, 2, 1),
               std::invalid_argument);
  // Empty parameters do not count: they join no bucket and no unit.
  const FlatLayout L = FlatLayout::build({{"a", 3, 0}, {"b", 0, 1}, {"c", 3, 0}}, 10, 2, 1);
  EXPECT_EQ(L.units().size(), 1u);
  EXPECT_EQ(L.buckets().size(), 1u);
  EXPECT_EQ(FlatLayout::build({}, 10, 2, 1).units().size(), 1u);
}

}  // namespace
}  // namespace zero
