// BucketTracker: buckets are released in the release order it is given (the communication order
// the first pass agreed on; the layout stays), and a first pass through checkpointed blocks may
// guess one gradient per hidden parameter, a later gradient of it then reported as late.
#include <gtest/gtest.h>

#include "zero/grads/grad_buckets.hpp"
#include "zero/params/shard_info.hpp"

namespace zero::testing {
namespace {

// Three parameters of 8 elements, one bucket each (a bucket closes at >= 8 elements).
FlatLayout three_buckets() { return FlatLayout::build({{"a", 8}, {"b", 8}, {"c", 8}}, 8, 2, 1); }

TEST(BucketTracker, ReleasesInIndexOrderByDefault) {
  const FlatLayout L = three_buckets();
  ASSERT_EQ(L.buckets().size(), 3u);
  BucketTracker t(L);
  t.mark(2);
  EXPECT_EQ(t.next_ready(), -1) << "bucket 0 comes first";
  t.mark(0);
  EXPECT_EQ(t.next_ready(), 0);
  EXPECT_EQ(t.next_ready(), -1);
  t.mark(1);
  EXPECT_EQ(t.next_ready(), 1);
  EXPECT_EQ(t.next_ready(), 2);
}

TEST(BucketTracker, ReleasesInTheOrderItIsGiven) {
  const FlatLayout L = three_buckets();
  BucketTracker t(L);
  t.set_order({2, 0, 1});
  t.reset();
  EXPECT_EQ(t.position(2), 0);
  EXPECT_EQ(t.position(1), 2);
  t.mark(0);
  EXPECT_EQ(t.next_ready(), -1) << "bucket 2 comes first now";
  t.mark(2);
  EXPECT_EQ(t.next_ready(), 2);
  EXPECT_EQ(t.next_ready(), 0);
  EXPECT_EQ(t.next_ready(), -1);
  // A gradient for a bucket already released is an error (its reduction would miss it).
  EXPECT_THROW(t.mark(2), c10::Error);
  t.mark(1);
  EXPECT_EQ(t.next_ready(), 1);
  // The order survives a new pass.
  t.reset();
  t.mark(0);
  EXPECT_EQ(t.next_ready(), -1);
  EXPECT_EQ(t.next_unreleased(), 2);
  EXPECT_EQ(t.next_unreleased(), 0);
}

TEST(BucketTracker, UnknownCountsWaitForTheEndUnlessGuessed) {
  const FlatLayout L = three_buckets();
  BucketTracker t(L);
  const std::vector<int> expected{kUnknownArrivals, 1, kUnknownArrivals};
  t.reset(expected);
  t.mark(0);
  EXPECT_EQ(t.next_ready(), -1) << "without a guess an unknown count holds its bucket";
  t.reset(expected, /*guess_unknown=*/true);
  EXPECT_EQ(t.mark(0), 1);
  EXPECT_EQ(t.next_ready(), 0) << "guessed: released after its first gradient";
  EXPECT_EQ(t.mark(0), 0) << "a second gradient after the release is late, not an error";
  t.mark(1);
  EXPECT_EQ(t.next_ready(), 1);
  // A parameter whose count is known still may not arrive after its bucket's release.
  EXPECT_THROW(t.mark(1), c10::Error);
}

}  // namespace
}  // namespace zero::testing
