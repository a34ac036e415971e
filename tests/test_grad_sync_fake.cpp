// The gradient paths (zero/grads/grad_sync.hpp) over a FakeGroup (support/fake_group.hpp), with the
// gradients arriving in scripted orders: reductions launch in the release order as soon as their
// bucket and every bucket before it in that order are complete, at most two are in flight (the
// pool's two buffers), and the shard holds the reduced gradients whatever the arrival order.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "support/fake_group.hpp"
#include "zero/grads/grad_sync.hpp"

namespace zero::testing {
namespace {

constexpr int64_t kNumel = 8;
constexpr int kParams = 4;

// Four parameters of 8 elements, one bucket each, in 2 shards of 4.
FlatLayout four_buckets() {
  return FlatLayout::build({{"a", kNumel}, {"b", kNumel}, {"c", kNumel}, {"d", kNumel}}, kNumel,
                           /*shards=*/2, /*align=*/1);
}

at::Tensor grad_of(int param, int pass = 0) {
  return at::arange(kNumel, at::kFloat) + 10.0 * param + 100.0 * pass;
}

std::string bucket_what(const std::string& op, int b) {
  return op + " of gradient bucket " + std::to_string(b);
}

// How many buckets can be released after `delivered` (a prefix of the arrival order): the
// longest prefix of the release order whose parameters all arrived.
size_t releasable(const std::vector<int>& release, const std::vector<int>& delivered) {
  size_t n = 0;
  while (n < release.size() &&
         std::find(delivered.begin(), delivered.end(), release[n]) != delivered.end()) {
    ++n;
  }
  return n;
}

int in_flight(const FakeGroup& g) {
  int n = 0;
  for (const auto& c : g.calls()) n += c.waited ? 0 : 1;
  return n;
}

struct Script {
  std::vector<int> release;  // empty: index order
  std::vector<int> arrivals;
};

class ScriptedArrivals : public ::testing::TestWithParam<Script> {};

TEST_P(ScriptedArrivals, PartitionedGradsLaunchInReleaseOrder) {
  const Script s = GetParam();
  const FlatLayout layout = four_buckets();
  ASSERT_EQ(layout.buckets().size(), static_cast<size_t>(kParams));
  FakeGroup group(/*rank=*/1, /*size=*/2);
  GradSyncOptions opts;
  auto sync = make_partitioned_grads(layout, group, opts);
  std::vector<int> release = s.release;
  if (release.empty()) {
    for (int b = 0; b < kParams; ++b) release.push_back(b);
  } else {
    sync->set_release_order(release);
  }
  for (int pass = 0; pass < 2; ++pass) {  // the shard is emptied between passes (a step)
    group.clear();
    sync->begin_backward(/*boundary=*/true, {}, /*counting=*/false);
    std::vector<int> delivered;
    for (int p : s.arrivals) {
      sync->on_grad(p, grad_of(p, pass));
      delivered.push_back(p);
      const auto launched = group.launched("reduce_scatter");
      // Launched as soon as releasable, in the release order.
      ASSERT_EQ(launched.size(), releasable(release, delivered)) << "after parameter " << p;
      for (size_t i = 0; i < launched.size(); ++i) {
        EXPECT_EQ(launched[i], bucket_what("reduce_scatter", release[i]));
      }
      EXPECT_LE(in_flight(group), 2) << "two bucket buffers";
    }
    sync->end_backward();
    EXPECT_EQ(in_flight(group), 0);
    // Rank 1's half of every parameter, summed over the (two identical) ranks.
    const at::Tensor& shard = sync->grad_shard();
    for (int p = 0; p < kParams; ++p) {
      const BucketSlot& b = layout.buckets()[layout.params()[p].bucket];
      EXPECT_TRUE(at::equal(shard.narrow(0, b.shard_offset, kNumel / 2),
                            grad_of(p, pass).narrow(0, kNumel / 2, kNumel / 2) * 2))
          << "parameter " << p << " pass " << pass;
    }
    EXPECT_EQ(sync->counters().launched_after_backward, 0);
    sync->zero_grad();
  }
}

INSTANTIATE_TEST_SUITE_P(Orders, ScriptedArrivals,
                         ::testing::Values(Script{{}, {0, 1, 2, 3}}, Script{{}, {3, 2, 1, 0}},
                                           Script{{}, {2, 0, 3, 1}}, Script{{}, {1, 3, 0, 2}},
                                           Script{{3, 2, 1, 0}, {3, 2, 1, 0}},
                                           Script{{3, 2, 1, 0}, {0, 1, 2, 3}},
                                           Script{{1, 3, 0, 2}, {2, 0, 3, 1}}));

// A parameter the pass does not reach holds its bucket (and every later one in the release
// order) until backward ends; then they are reduced with zeros for it.
TEST(ScriptedArrivals, MissingGradientIsReducedAfterBackward) {
  const FlatLayout layout = four_buckets();
  FakeGroup group(0, 2);
  auto sync = make_partitioned_grads(layout, group, {});
  sync->begin_backward(true, {}, /*counting=*/false);
  for (int p : {0, 2, 3}) sync->on_grad(p, grad_of(p));
  EXPECT_EQ(group.launched("reduce_scatter").size(), 1u) << "bucket 1 is missing";
  sync->end_backward();
  const auto launched = group.launched("reduce_scatter");
  ASSERT_EQ(launched.size(), 4u);
  for (int b = 0; b < 4; ++b) EXPECT_EQ(launched[b], bucket_what("reduce_scatter", b));
  EXPECT_EQ(sync->counters().launched_after_backward, 3);
  const BucketSlot& b1 = layout.buckets()[1];
  EXPECT_EQ(sync->grad_shard().narrow(0, b1.shard_offset, kNumel / 2).abs().sum().item<float>(), 0);
}

// Stage 0 under accumulation: the passes inside the window stay local; the boundary pass
// all-reduces every bucket in order, and the full gradient is the window's sum over ranks.
TEST(ScriptedArrivals, AccumulatedGradsReduceOnlyAtTheBoundary) {
  const FlatLayout layout =
      FlatLayout::build({{"a", kNumel}, {"b", kNumel}, {"c", kNumel}}, kNumel, 1, 1);
  FakeGroup group(0, 2);
  auto sync = make_accumulated_grads(layout, group, /*sharded=*/false, {});
  const std::vector<std::vector<int>> passes{{2, 1, 0}, {0, 2, 1}};
  for (size_t pass = 0; pass < passes.size(); ++pass) {
    const bool boundary = pass + 1 == passes.size();
    sync->begin_backward(boundary, {}, /*counting=*/false);
    for (int p : passes[pass]) sync->on_grad(p, grad_of(p, static_cast<int>(pass)));
    sync->end_backward();
    if (!boundary) EXPECT_TRUE(group.calls().empty()) << "nothing leaves a rank mid-window";
  }
  const auto launched = group.launched("all_reduce");
  ASSERT_EQ(launched.size(), 3u);
  for (int b = 0; b < 3; ++b) EXPECT_EQ(launched[b], bucket_what("all_reduce", b));
  EXPECT_EQ(in_flight(group), 0);
  for (int p = 0; p < 3; ++p) {
    const ParamSlot& s = layout.params()[p];
    EXPECT_TRUE(at::equal(sync->grad_shard().narrow(0, s.flat_offset, kNumel),
                          (grad_of(p, 0) + grad_of(p, 1)) * 2))
        << "parameter " << p;
  }
}

}  // namespace
}  // namespace zero::testing
