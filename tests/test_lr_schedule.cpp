// optim/lr_schedule: the schedules against DeepSpeed's formulas worked by hand at chosen
// iterations (at_iteration), and DeepSpeed's timing (lr_at): the scheduler is built at
// last_batch_iteration = -1 and stepped after each optimizer step, so step 0 runs at the
// constructor's lr and step k at iteration k - 1.
#include <c10/util/Exception.h>
#include <gtest/gtest.h>

#include <cmath>
#include <numbers>

#include "optim/lr_schedule.hpp"

namespace zero::optim {
namespace {

TEST(Schedule, Constant) {
  auto s = make_constant(3e-4);
  EXPECT_DOUBLE_EQ(s->at_iteration(0), 3e-4);
  EXPECT_DOUBLE_EQ(s->at_iteration(123456), 3e-4);
  EXPECT_THROW(make_constant(-1), c10::Error);
  EXPECT_THROW(make_constant(std::nan("")), c10::Error);
  EXPECT_THROW(s->at_iteration(-1), c10::Error);
  EXPECT_DOUBLE_EQ(s->lr_at(0), 3e-4);
  EXPECT_THROW(s->lr_at(-1), c10::Error);
}

WarmupOptions warmup(double min_lr, double max_lr, int64_t steps, const char* type) {
  WarmupOptions o;
  o.warmup_min_lr = min_lr;
  o.warmup_max_lr = max_lr;
  o.warmup_num_steps = steps;
  o.warmup_type = type;
  return o;
}

TEST(Schedule, WarmupLog) {
  // gamma = log(step + 1) / log(100): 0 at step 0, 1/2 at step 9, 1 from step 99.
  auto s = make_warmup(warmup(1e-4, 1e-3, 100, "log"));
  EXPECT_DOUBLE_EQ(s->at_iteration(0), 1e-4);
  EXPECT_DOUBLE_EQ(s->at_iteration(9), 1e-4 + 9e-4 * 0.5);
  EXPECT_DOUBLE_EQ(s->at_iteration(3), 1e-4 + 9e-4 * std::log(4.0) / std::log(100.0));
  EXPECT_DOUBLE_EQ(s->at_iteration(99), 1e-3);
  EXPECT_DOUBLE_EQ(s->at_iteration(100), 1e-3);
  EXPECT_DOUBLE_EQ(s->at_iteration(1'000'000), 1e-3);
  for (int64_t i = 1; i < 120; ++i) EXPECT_GE(s->at_iteration(i), s->at_iteration(i - 1)) << i;
}

TEST(Schedule, WarmupLinear) {
  // gamma = step / 100: reaches 1 only once warmup is over (step 100).
  auto s = make_warmup(warmup(0.0, 0.1, 100, "linear"));
  EXPECT_DOUBLE_EQ(s->at_iteration(0), 0.0);
  EXPECT_DOUBLE_EQ(s->at_iteration(25), 0.025);
  EXPECT_DOUBLE_EQ(s->at_iteration(99), 0.099);
  EXPECT_DOUBLE_EQ(s->at_iteration(100), 0.1);
  EXPECT_DOUBLE_EQ(s->at_iteration(5000), 0.1);
}

TEST(Schedule, WarmupOfOneStepActsAsTwo) {
  // DeepSpeed's max(2, warmup_num_steps): linear gamma at step 1 is 1/2, not 1.
  auto s = make_warmup(warmup(0.0, 1.0, 1, "linear"));
  EXPECT_DOUBLE_EQ(s->at_iteration(0), 0.0);
  EXPECT_DOUBLE_EQ(s->at_iteration(1), 0.5);
  EXPECT_DOUBLE_EQ(s->at_iteration(2), 1.0);
  auto l = make_warmup(warmup(0.0, 1.0, 1, "log"));  // log(2)/log(2) at step 1
  EXPECT_DOUBLE_EQ(l->at_iteration(1), 1.0);
}

TEST(Schedule, WarmupDecay) {
  // Linear warmup over 100 steps to 0.1, then (200 - step) / (200 - 100), floored at 0.
  auto s = make_warmup_decay(warmup(0.0, 0.1, 100, "linear"), 200);
  EXPECT_DOUBLE_EQ(s->at_iteration(50), 0.05);
  EXPECT_DOUBLE_EQ(s->at_iteration(100), 0.1);
  EXPECT_DOUBLE_EQ(s->at_iteration(150), 0.05);
  EXPECT_DOUBLE_EQ(s->at_iteration(190), 0.1 * 0.1);
  EXPECT_DOUBLE_EQ(s->at_iteration(200), 0.0);
  EXPECT_DOUBLE_EQ(s->at_iteration(300), 0.0);
  // With a nonzero floor the decay runs from max_lr down to min_lr: lr = min + delta * gamma.
  auto f = make_warmup_decay(warmup(0.01, 0.1, 100, "log"), 200);
  EXPECT_DOUBLE_EQ(f->at_iteration(0), 0.01);
  EXPECT_DOUBLE_EQ(f->at_iteration(150), 0.01 + 0.09 * 0.5);
  EXPECT_DOUBLE_EQ(f->at_iteration(250), 0.01);
}

WarmupCosineOptions cosine(double base, int64_t total, int64_t warmup_steps, double warmup_min,
                           double cos_min, const char* type) {
  WarmupCosineOptions o;
  o.base_lr = base;
  o.total_num_steps = total;
  o.warmup_num_steps = warmup_steps;
  o.warmup_min_ratio = warmup_min;
  o.cos_min_ratio = cos_min;
  o.warmup_type = type;
  return o;
}

TEST(Schedule, WarmupCosine) {
  // Warmup ratio 0.2 -> 1 over 10 steps, then the cosine over 100 decay steps (the decay
  // counts step 10 as its first): the midpoint, decay step 50, is step 59.
  auto s = make_warmup_cosine(cosine(0.1, 110, 10, 0.2, 0.1, "linear"));
  EXPECT_DOUBLE_EQ(s->at_iteration(0), 0.1 * 0.2);
  EXPECT_DOUBLE_EQ(s->at_iteration(5), 0.1 * (0.2 + 0.5 * 0.8));
  EXPECT_DOUBLE_EQ(s->at_iteration(10),
                   0.1 * (0.1 + 0.9 * (1 + std::cos(std::numbers::pi / 100)) / 2));
  EXPECT_DOUBLE_EQ(s->at_iteration(59), 0.1 * (0.1 + 0.9 * 0.5));
  EXPECT_DOUBLE_EQ(s->at_iteration(34),
                   0.1 * (0.1 + 0.9 * (1 + std::cos(std::numbers::pi / 4)) / 2));
  EXPECT_DOUBLE_EQ(s->at_iteration(109), 0.1 * 0.1);
  // Past the end it stays at the floor instead of climbing back up the cosine.
  EXPECT_DOUBLE_EQ(s->at_iteration(150), 0.1 * 0.1);
  EXPECT_DOUBLE_EQ(s->at_iteration(10'000), 0.1 * 0.1);
  for (int64_t i = 11; i < 120; ++i) EXPECT_LE(s->at_iteration(i), s->at_iteration(i - 1)) << i;
}

TEST(Schedule, WarmupCosineLogWarmup) {
  auto s = make_warmup_cosine(cosine(1.0, 1000, 100, 0.0, 0.0, "log"));
  EXPECT_DOUBLE_EQ(s->at_iteration(0), 0.0);
  EXPECT_DOUBLE_EQ(s->at_iteration(9), 0.5);  // log(10) / log(100)
  EXPECT_DOUBLE_EQ(s->at_iteration(999), 0.0);
}

TEST(Schedule, InvalidOptionsAreRejected) {
  EXPECT_THROW(make_warmup(warmup(0, 1e-3, 100, "exp")), c10::Error);
  EXPECT_THROW(make_warmup(warmup(0, 1e-3, 0, "log")), c10::Error);
  EXPECT_THROW(make_warmup(warmup(-1e-3, 1e-3, 10, "log")), c10::Error);
  EXPECT_THROW(make_warmup(warmup(1e-2, 1e-3, 10, "log")), c10::Error);  // min above max
  EXPECT_THROW(make_warmup(warmup(0, INFINITY, 10, "log")), c10::Error);
  EXPECT_THROW(make_warmup_decay(warmup(0, 1e-3, 100, "log"), 0), c10::Error);
  EXPECT_THROW(make_warmup_cosine(cosine(1e-3, 0, 100, 0, 1e-4, "log")), c10::Error);
  EXPECT_THROW(make_warmup_cosine(cosine(1e-3, 1000, 100, 1.5, 1e-4, "log")), c10::Error);
  EXPECT_THROW(make_warmup_cosine(cosine(1e-3, 1000, 100, 0, -0.1, "log")), c10::Error);
  EXPECT_THROW(make_warmup_cosine(cosine(-1e-3, 1000, 100, 0, 1e-4, "log")), c10::Error);
  EXPECT_THROW(make_warmup_cosine(cosine(1e-3, 1000, 100, 0, 1e-4, "cosine")), c10::Error);
  try {
    make_warmup_decay(warmup(0, 1e-3, 1000, "log"), 0);
    ADD_FAILURE() << "expected a throw";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("total_num_steps"), std::string::npos) << e.what();
  }
  auto s = make_warmup(warmup(0, 1e-3, 10, "log"));
  EXPECT_THROW(s->at_iteration(-1), c10::Error);
}

// DeepSpeed's WarmupLR.__init__ writes get_lr() at iteration -1 (min_lrs) into the optimizer;
// engine._take_model_step calls scheduler.step() after each applied optimizer step.
TEST(ScheduleTiming, WarmupFirstStepsRunAtMinLr) {
  for (const char* type : {"log", "linear"}) {
    auto s = make_warmup(warmup(1e-4, 1e-3, 10, type));
    EXPECT_DOUBLE_EQ(s->lr_at(0), 1e-4) << type;  // constructor
    EXPECT_DOUBLE_EQ(s->lr_at(1), 1e-4) << type;  // iteration 0: gamma 0
    for (int64_t k = 1; k < 30; ++k) EXPECT_DOUBLE_EQ(s->lr_at(k), s->at_iteration(k - 1)) << k;
  }
  // Linear over 10: step k uses (k - 1) / 10 of the way, step 11 the first full lr.
  auto s = make_warmup(warmup(0.0, 1.0, 10, "linear"));
  EXPECT_DOUBLE_EQ(s->lr_at(2), 0.1);
  EXPECT_DOUBLE_EQ(s->lr_at(10), 0.9);
  EXPECT_DOUBLE_EQ(s->lr_at(11), 1.0);
  // Log over 10: step 2 uses log(2) / log(10).
  auto g = make_warmup(warmup(0.0, 1.0, 10, "log"));
  EXPECT_DOUBLE_EQ(g->lr_at(2), std::log(2.0) / std::log(10.0));
}

TEST(ScheduleTiming, WarmupDecayIsOneStepBehindItsIteration) {
  auto s = make_warmup_decay(warmup(0.0, 0.1, 10, "linear"), 20);
  EXPECT_DOUBLE_EQ(s->lr_at(0), 0.0);
  EXPECT_DOUBLE_EQ(s->lr_at(1), 0.0);
  EXPECT_DOUBLE_EQ(s->lr_at(6), 0.05);        // iteration 5
  EXPECT_DOUBLE_EQ(s->lr_at(11), 0.1);        // iteration 10: (20 - 10) / 10
  EXPECT_DOUBLE_EQ(s->lr_at(16), 0.1 * 0.5);  // iteration 15
  EXPECT_DOUBLE_EQ(s->lr_at(21), 0.0);        // iteration 20
}

TEST(ScheduleTiming, WarmupCosineFirstStepIsZero) {
  // WarmupCosineLR.__init__ writes org_lr * 0 (get_lr at iteration -1), whatever
  // warmup_min_ratio says; iteration 0 then gives warmup_min_ratio.
  auto s = make_warmup_cosine(cosine(0.1, 110, 10, 0.2, 0.1, "linear"));
  EXPECT_DOUBLE_EQ(s->lr_at(0), 0.0);
  EXPECT_DOUBLE_EQ(s->lr_at(1), 0.1 * 0.2);
  EXPECT_DOUBLE_EQ(s->lr_at(6), 0.1 * (0.2 + 0.5 * 0.8));  // iteration 5
  EXPECT_DOUBLE_EQ(s->lr_at(11), 0.1 * (0.1 + 0.9 * (1 + std::cos(std::numbers::pi / 100)) / 2));
  for (int64_t k = 1; k < 130; ++k) EXPECT_DOUBLE_EQ(s->lr_at(k), s->at_iteration(k - 1)) << k;
}

TEST(ScheduleTiming, TotalBelowWarmupIsAllowedAsInDeepSpeed) {
  // DeepSpeed only warns; after the warmup the decay factor is max(0, (5 - it) / 1) = 0.
  auto s = make_warmup_decay(warmup(0.01, 0.1, 10, "linear"), 5);
  EXPECT_DOUBLE_EQ(s->at_iteration(9), 0.01 + 0.09 * 0.9);
  EXPECT_DOUBLE_EQ(s->at_iteration(10), 0.01);
  auto c = make_warmup_cosine(cosine(1.0, 5, 10, 0.0, 0.25, "linear"));
  EXPECT_DOUBLE_EQ(c->at_iteration(10), 0.25);
}

}  // namespace
}  // namespace zero::optim
