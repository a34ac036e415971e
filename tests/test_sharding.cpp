// Sharding::of_stage: what each ZeRO stage shards, against the ZeRO paper's table (Rajbhandari et
// al. 2020, Figure 1: P_os, P_os+g, P_os+g+p) as DeepSpeed's stages implement it.
#include <c10/util/Exception.h>
#include <gtest/gtest.h>

#include <string>

#include "zero/params/sharding.hpp"

namespace zero {
namespace {

struct Row {
  int stage;
  bool optimizer, grads, params;
};

TEST(Sharding, EachStageShardsWhatTheZeroPaperSays) {
  const Row rows[] = {{0, false, false, false},
                      {1, true, false, false},
                      {2, true, true, false},
                      {3, true, true, true}};
  for (const Row& r : rows) {
    SCOPED_TRACE("stage " + std::to_string(r.stage));
    const Sharding s = Sharding::of_stage(r.stage, /*rank=*/2, /*size=*/4);
    EXPECT_EQ(s.optimizer, r.optimizer);
    EXPECT_EQ(s.grads, r.grads);
    EXPECT_EQ(s.params, r.params);
    EXPECT_EQ(s.stage(), r.stage);
    // Sharded: this rank's shard of each bucket, one of 4; stage 0: every rank holds shard 0.
    EXPECT_EQ(s.owner, r.stage >= 1 ? 2 : 0);
    EXPECT_EQ(s.shards, r.stage >= 1 ? 4 : 1);
  }
}

TEST(Sharding, OneRankStillShardsByTheStage) {
  const Sharding s = Sharding::of_stage(3, /*rank=*/0, /*size=*/1);
  EXPECT_TRUE(s.params && s.grads && s.optimizer);
  EXPECT_EQ(s.stage(), 3);
  EXPECT_EQ(s.owner, 0);
  EXPECT_EQ(s.shards, 1);
}

TEST(Sharding, OnlyStagesZeroAndOneKeepAFullGradient) {
  for (int64_t accumulation : {1, 4}) {
    for (bool overlap : {true, false}) {
      SCOPED_TRACE("accumulation " + std::to_string(accumulation) +
                   (overlap ? ", overlap" : ", no overlap"));
      EXPECT_TRUE(Sharding::of_stage(0, 1, 4).keeps_full_gradient(accumulation, overlap));
      // DeepSpeed's ZeRO-1 holds the window's sum across micro-steps and reduces it after
      // backward without overlap_comm; otherwise it reduce-scatters during backward.
      EXPECT_EQ(Sharding::of_stage(1, 1, 4).keeps_full_gradient(accumulation, overlap),
                accumulation > 1 || !overlap);
      EXPECT_FALSE(Sharding::of_stage(2, 1, 4).keeps_full_gradient(accumulation, overlap));
      // Stage 3 keeps only the partitioned gradient, as stage 2.
      EXPECT_FALSE(Sharding::of_stage(3, 1, 4).keeps_full_gradient(accumulation, overlap));
    }
  }
}

TEST(Sharding, RefusesAStageThatIsNoneOfZeroToThree) {
  for (int stage : {-1, 4}) {
    try {
      (void)Sharding::of_stage(stage, 0, 2);
      ADD_FAILURE() << "stage " << stage << " was accepted";
    } catch (const c10::Error& e) {
      const std::string m = e.what();
      EXPECT_NE(m.find("zero_optimization.stage " + std::to_string(stage)), std::string::npos)
          << m;
      EXPECT_NE(m.find("set 0, 1, 2 or 3"), std::string::npos) << m;
    }
  }
}

}  // namespace
}  // namespace zero
