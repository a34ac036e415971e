// Stage 3's pure pieces: which unit each parameter joins (marks, ties, persistence) and the
// trace (gather-order hash, prefetch and reuse decisions), against hand-worked cases and
// DeepSpeed's rules written out independently below.
#include <gtest/gtest.h>

#include <limits>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "zero/units/unit_plan.hpp"
#include "zero/units/unit_trace.hpp"

namespace zero::units {
namespace {

PlanInput gpt_like(int blocks) {
  PlanInput in;
  in.params.push_back({"embed.weight", 1000 * 64});
  for (int b = 0; b < blocks; ++b) {
    const std::string p = "blocks." + std::to_string(b) + ".";
    in.params.push_back({p + "attn_norm.weight", 64});
    in.params.push_back({p + "wq.weight", 64 * 64});
    in.params.push_back({p + "w_up.weight", 64 * 256});
    in.marked.push_back("blocks." + std::to_string(b));
  }
  in.params.push_back({"norm.weight", 64});
  in.params.push_back({"head.weight", 1000 * 64});
  in.param_persistence_threshold = 0;  // nothing small stays whole unless a test says so
  return in;
}

TEST(UnitPlan, EachMarkedBlockIsAUnitAndTheRestIsTheRoot) {
  const UnitPlan p = plan_units(gpt_like(3));
  ASSERT_EQ(p.units(), 4);
  EXPECT_EQ(p.names, (std::vector<std::string>{"<root>", "blocks.0", "blocks.1", "blocks.2"}));
  EXPECT_EQ(p.unit_of, (std::vector<int>{0, 1, 1, 1, 2, 2, 2, 3, 3, 3, 0, 0}));
  EXPECT_EQ(p.persistent_numel, 0);
}

TEST(UnitPlan, NoMarksIsOneRootUnit) {
  PlanInput in = gpt_like(2);
  in.marked.clear();
  const UnitPlan p = plan_units(in);
  EXPECT_EQ(p.units(), 1);
  for (int u : p.unit_of) EXPECT_EQ(u, UnitPlan::kRoot);
}

TEST(UnitPlan, PrefixesMatchWholeNameComponents) {
  PlanInput in;
  in.params = {{"blocks.1.w", 10}, {"blocks.10.w", 10}, {"blocks.1", 10}};
  in.marked = {"blocks.1"};
  in.param_persistence_threshold = 0;
  const UnitPlan p = plan_units(in);
  // "blocks.10.w" is not under "blocks.1"; a parameter named like the module is not under it.
  EXPECT_EQ(p.unit_of, (std::vector<int>{1, 0, 0}));
}

TEST(UnitPlan, InnermostMarkWinsAndTheRootMarkAddsNoUnit) {
  PlanInput in;
  in.params = {{"enc.a", 10}, {"enc.mlp.b", 10}, {"enc.mlp.c", 10}, {"head", 10}};
  in.marked = {"", "enc", "enc.mlp"};
  in.param_persistence_threshold = 0;
  const UnitPlan p = plan_units(in);
  EXPECT_EQ(p.names, (std::vector<std::string>{"<root>", "enc", "enc.mlp"}));
  EXPECT_EQ(p.unit_of, (std::vector<int>{1, 2, 2, 0}));
}

TEST(UnitPlan, TiedAcrossUnitsGoesToTheRootTiedWithinStays) {
  PlanInput in = gpt_like(2);
  // embed.weight (0) tied to head.weight (8): root and root. blocks.0.wq (2) tied to
  // blocks.1.wq (5): two units, so both to the root. blocks.1.w_up (6) under a second name in
  // the same block (9) stays in its unit.
  in.params.push_back({"blocks.1.alias_up", 64 * 256});  // index 9
  in.ties = {{0, 8}, {2, 5}, {6, 9}};
  const UnitPlan p = plan_units(in);
  EXPECT_EQ(p.unit_of[0], 0);
  EXPECT_EQ(p.unit_of[8], 0);
  EXPECT_EQ(p.unit_of[2], 0);
  EXPECT_EQ(p.unit_of[5], 0);
  EXPECT_EQ(p.unit_of[6], 2);
  EXPECT_EQ(p.unit_of[9], 2);
  EXPECT_EQ(p.unit_of[3], 1);  // blocks.0.w_up unaffected
}

TEST(UnitPlan, PersistenceIsAtOrBelowTheThresholdUpToTheModelCap) {
  PlanInput in = gpt_like(3);
  in.param_persistence_threshold = 64;  // the norms (64 elements): equal counts as small
  const UnitPlan p = plan_units(in);
  for (size_t i = 0; i < in.params.size(); ++i) {
    EXPECT_EQ(p.persistent[i], in.params[i].numel <= 64) << in.params[i].name;
    if (p.persistent[i]) EXPECT_EQ(p.unit_of[i], 0) << in.params[i].name;
  }
  EXPECT_EQ(p.persistent_numel, 4 * 64);

  // A cap of 150 takes the first two norms (128); the third would pass it and is skipped, and
  // so is the final norm; a later parameter is still considered (DeepSpeed `continue`s).
  in.model_persistence_threshold = 150;
  in.params.push_back({"tiny", 20});
  const UnitPlan q = plan_units(in);
  EXPECT_TRUE(q.persistent[1]);
  EXPECT_TRUE(q.persistent[4]);
  EXPECT_FALSE(q.persistent[7]);
  EXPECT_EQ(q.unit_of[7], 3);
  EXPECT_FALSE(q.persistent[10]);
  EXPECT_TRUE(q.persistent.back());
  EXPECT_EQ(q.persistent_numel, 148);
}

TEST(UnitPlan, AUnitLeftEmptyByPersistenceIsDropped) {
  PlanInput in;
  in.params = {{"a.w", 5}, {"b.w", 500}, {"c.w", 5}};
  in.marked = {"a", "b", "c"};
  in.param_persistence_threshold = 10;
  const UnitPlan p = plan_units(in);
  EXPECT_EQ(p.names, (std::vector<std::string>{"<root>", "b"}));
  EXPECT_EQ(p.unit_of, (std::vector<int>{0, 1, 0}));
}

TEST(UnitPlan, BadTiesAreNamed) {
  PlanInput in = gpt_like(1);
  in.ties = {{0, 99}};
  EXPECT_THROW(plan_units(in), std::invalid_argument);
  in.ties = {{0, 1}, {1, 2}};
  EXPECT_THROW(plan_units(in), std::invalid_argument);
}

// DeepSpeed's persistence rule and the owner rule, written out again for random models.
TEST(UnitPlan, RandomModelsFollowTheRules) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 200; ++trial) {
    PlanInput in;
    const int mods = 1 + static_cast<int>(rng() % 5);
    for (int m = 0; m < mods; ++m) {
      const std::string mod = "m" + std::to_string(m);
      if (rng() % 2) in.marked.push_back(mod);
      if (rng() % 3 == 0) in.marked.push_back(mod + ".sub");
      const int k = 1 + static_cast<int>(rng() % 3);
      for (int j = 0; j < k; ++j) {
        const std::string where = rng() % 2 ? mod + ".sub." : mod + ".";
        in.params.push_back(
            {where + "p" + std::to_string(j), 1 + static_cast<int64_t>(rng() % 50)});
      }
    }
    in.param_persistence_threshold = static_cast<int64_t>(rng() % 30);
    in.model_persistence_threshold =
        rng() % 2 ? std::numeric_limits<int64_t>::max() : static_cast<int64_t>(rng() % 60);
    const UnitPlan p = plan_units(in);

    int64_t total = 0;
    for (size_t i = 0; i < in.params.size(); ++i) {
      const int64_t n = in.params[i].numel;
      const bool expect_persist =
          n <= in.param_persistence_threshold && total + n <= in.model_persistence_threshold;
      if (expect_persist) total += n;
      ASSERT_EQ(p.persistent[i], expect_persist) << trial << " " << in.params[i].name;

      std::string owner;
      bool found = false;
      for (const std::string& m : in.marked) {
        const std::string prefix = m + ".";
        if (in.params[i].name.rfind(prefix, 0) == 0 && (!found || m.size() > owner.size())) {
          owner = m;
          found = true;
        }
      }
      const std::string expect = !found || expect_persist ? "<root>" : owner;
      ASSERT_EQ(p.names.at(p.unit_of[i]), expect) << trial << " " << in.params[i].name;
    }
    ASSERT_EQ(p.persistent_numel, total);
    // Every unit but the root holds a parameter.
    std::set<int> used(p.unit_of.begin(), p.unit_of.end());
    for (int u = 1; u < p.units(); ++u) EXPECT_TRUE(used.count(u)) << trial;
  }
}

TEST(GatherOrder, EqualOrdersHashEqualAndAnyChangeShows) {
  GatherOrder a, b, c, d;
  for (int u : {1, 2, 3, 3, 2, 1}) a.issued(u);
  for (int u : {1, 2, 3, 3, 2, 1}) b.issued(u);
  for (int u : {1, 3, 2, 3, 2, 1}) c.issued(u);
  for (int u : {1, 2, 3, 3, 2}) d.issued(u);
  EXPECT_EQ(a.hash(), b.hash());
  EXPECT_NE(a.hash(), c.hash());
  EXPECT_NE(a.hash(), d.hash());
  EXPECT_EQ(first_difference(a.units(), b.units()), -1);
  EXPECT_EQ(first_difference(a.units(), c.units()), 1);
  EXPECT_EQ(first_difference(a.units(), d.units()), 5);
  a.clear();
  GatherOrder e;
  EXPECT_EQ(a.hash(), e.hash());
}

// Units 1..4 of 10 elements each, unit 5 of 100: forward 1..5, backward 5..1.
std::vector<TraceEntry> fwd_bwd(int units) {
  std::vector<TraceEntry> t;
  for (int u = 1; u <= units; ++u) t.push_back({u, false});
  for (int u = units; u >= 1; --u) t.push_back({u, true});
  return t;
}
const std::vector<int64_t> kNumel = {0, 10, 10, 10, 10, 100};

TEST(UnitTrace, PrefetchFillsTheBucketAndMayCrossItOnce) {
  const auto t = fwd_bwd(5);
  auto none = [](int) { return false; };
  PrefetchLimits l;
  l.prefetch_bucket_size = 15;  // 10 < 15: one more; 20 >= 15: stop
  EXPECT_EQ(prefetch_after(t, 0, kNumel, none, 10, l), (std::vector<int>{2, 3}));
  l.prefetch_bucket_size = 10;
  EXPECT_EQ(prefetch_after(t, 0, kNumel, none, 10, l), (std::vector<int>{2}));
  l.prefetch_bucket_size = 0;  // off
  EXPECT_TRUE(prefetch_after(t, 0, kNumel, none, 10, l).empty());
  // At the last forward unit the next entries are its own backward (skipped: gathered) and
  // unit 4's.
  l.prefetch_bucket_size = 5;
  auto five = [](int u) { return u == 5; };
  EXPECT_EQ(prefetch_after(t, 4, kNumel, five, 100, l), (std::vector<int>{4}));
  // The end of the trace prefetches nothing.
  EXPECT_TRUE(prefetch_after(t, 9, kNumel, none, 10, l).empty());
}

TEST(UnitTrace, LiveLimitCapsPrefetchAndGatheredUnitsAreSkipped) {
  const auto t = fwd_bwd(5);
  PrefetchLimits l;
  l.prefetch_bucket_size = 1000;
  l.max_live_parameters = 30;
  auto none = [](int) { return false; };
  // live 10 (unit 1): budget 20: units 2 and 3.
  EXPECT_EQ(prefetch_after(t, 0, kNumel, none, 10, l), (std::vector<int>{2, 3}));
  // live 30: nothing.
  EXPECT_TRUE(prefetch_after(t, 0, kNumel, none, 30, l).empty());
  // Unit 2 already gathered: 3 and 4 fill the budget.
  auto two = [](int u) { return u == 2; };
  EXPECT_EQ(prefetch_after(t, 0, kNumel, two, 10, l), (std::vector<int>{3, 4}));
}

TEST(UnitTrace, ReuseDistanceCountsTheElementsInBetween) {
  const auto t = fwd_bwd(5);
  // Unit 5 (position 4) recurs at once (its backward): kept for any distance > 0.
  EXPECT_TRUE(reused_soon(t, 4, kNumel, 1));
  EXPECT_FALSE(reused_soon(t, 4, kNumel, 0));
  // Unit 4 (position 3): unit 5's forward and backward (200) come in between.
  EXPECT_FALSE(reused_soon(t, 3, kNumel, 200));
  EXPECT_TRUE(reused_soon(t, 3, kNumel, 201));
  // Unit 1 at the end of backward never recurs.
  EXPECT_FALSE(reused_soon(t, 9, kNumel, 1'000'000'000));
  // DeepSpeed's default keeps every unit of a small model from forward into backward.
  for (int pos = 0; pos < 5; ++pos) EXPECT_TRUE(reused_soon(t, pos, kNumel, 1'000'000'000));
}

TEST(UnitTrace, FirstPassRecordsLaterPassesFollowDeviationsReRecord) {
  UnitTrace tr(kNumel);
  PrefetchLimits l;
  l.prefetch_bucket_size = 10;
  auto none = [](int) { return false; };
  tr.begin_pass();
  for (const auto& e : fwd_bwd(3)) {
    tr.enter(e.unit, e.backward);
    EXPECT_FALSE(tr.following());  // nothing to follow yet
    EXPECT_TRUE(tr.prefetch(none, 10, l).empty());
  }
  tr.end_pass();
  EXPECT_EQ(tr.trace(), fwd_bwd(3));
  EXPECT_EQ(tr.passes_recorded(), 1);

  tr.begin_pass();
  tr.enter(1, false);
  EXPECT_TRUE(tr.following());
  EXPECT_EQ(tr.position(), 0);
  EXPECT_EQ(tr.prefetch(none, 10, l), (std::vector<int>{2}));
  tr.enter(2, false);
  EXPECT_EQ(tr.position(), 1);
  tr.enter(3, false);
  EXPECT_TRUE(tr.keep_after_forward(1));  // its backward is next
  for (const auto& e : std::vector<TraceEntry>{{3, true}, {2, true}, {1, true}}) {
    tr.enter(e.unit, e.backward);
  }
  tr.end_pass();
  EXPECT_EQ(tr.passes_recorded(), 1);  // followed: nothing re-recorded

  // A branch: unit 2 skipped. From the departure on no decisions; the pass becomes the trace.
  tr.begin_pass();
  tr.enter(1, false);
  tr.enter(3, false);
  EXPECT_FALSE(tr.following());
  EXPECT_TRUE(tr.prefetch(none, 10, l).empty());
  EXPECT_FALSE(tr.keep_after_forward(1'000'000'000));
  tr.enter(3, true);
  tr.enter(1, true);
  tr.end_pass();
  EXPECT_EQ(tr.passes_recorded(), 2);
  EXPECT_EQ(tr.trace(), (std::vector<TraceEntry>{{1, false}, {3, false}, {3, true}, {1, true}}));

  // A pass that stops early re-records too; an empty one changes nothing.
  tr.begin_pass();
  tr.enter(1, false);
  tr.end_pass();
  EXPECT_EQ(tr.trace(), (std::vector<TraceEntry>{{1, false}}));
  tr.begin_pass();
  tr.end_pass();
  EXPECT_EQ(tr.trace(), (std::vector<TraceEntry>{{1, false}}));
  EXPECT_THROW(tr.enter(9, false), std::out_of_range);
}

}  // namespace
}  // namespace zero::units
