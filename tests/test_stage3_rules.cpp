// What stage 3 asks of a program, checked on real gloo ranks (review 2026-12-06e): every rank
// builds the same units (L4), the whole-model reads are collectives (M4), and a unit can run
// under c10::InferenceMode between training steps (L6). Each misuse fails on the rank(s) that
// made it within seconds, naming what to do, instead of waiting out comm_timeout_s.
#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>
#include <gtest/gtest.h>

#include <chrono>
#include <functional>
#include <mutex>
#include <string>
#include <vector>

#include "support/fake_group.hpp"
#include "support/stage3_net.hpp"
#include "support/thread_group.hpp"
#include "support/timed.hpp"
#include "support/tiny_net.hpp"
#include "zero/engine.hpp"
#include "zero/params/flat_params.hpp"
#include "zero/units/shard_store.hpp"
#include "zero/units/sharded_unit.hpp"

namespace zero::testing {
namespace {

constexpr auto kTimeout = std::chrono::seconds(30);  // comm_timeout_s of these groups
constexpr double kBoundS = 5.0;                      // "within seconds"
constexpr int64_t kRows = 16;

#define EXPECT_HAS(text, part) \
  EXPECT_NE(std::string(text).find(part), std::string::npos) << "in: " << (text)

Config rules_config() {
  Config cfg = test_config(3, kRows / 2, 1, 0.0);
  cfg.zero_optimization.stage3.param_persistence_threshold = 0;
  return cfg;
}

void train_step(Engine& e, Stage3NetImpl& net, int step) {
  const Batch b = rank_micro_batch(global_batch(step, kRows), e.rank(), 2, 0, 1);
  e.backward(mse(net.forward(b.x), b.y));
  e.step();
}

// L4: rank 1 marks one block more than rank 0 (a mark made under a rank-dependent condition).
// The layouts differ, and the first collective that depends on them (the broadcast of the
// initial parameters, bucket by bucket) would pair different sizes. Every rank refuses at
// initialize, naming the first unit that differs and where each rank has it.
TEST(Stage3Rules, RanksWithDifferentUnitsAreRefusedAtInitializeNamingTheUnit) {
  std::mutex mu;
  std::vector<Outcome> out(2);
  run_ranks(
      2,
      [&](std::shared_ptr<comm::Group> g) {
        auto net = make_stage3_net(3, /*mark=*/true, /*skip=*/g->rank() == 0 ? 1 : -1);
        const Outcome o = timed([&] { initialize(net, rules_config(), g); });
        std::lock_guard<std::mutex> lock(mu);
        out[g->rank()] = o;
      },
      kTimeout);
  for (int r = 0; r < 2; ++r) {
    std::printf("rank %d failed after %.2f s: %s\n", r, out[r].seconds, out[r].error.c_str());
    EXPECT_HAS(out[r].error, "body.block1");
    EXPECT_HAS(out[r].error, "zero::shard");
    EXPECT_LT(out[r].seconds, kBoundS) << "rank " << r;
  }
}

// M4: state_dict() and flat_parameters() gather every unit from the ranks' masters at stage 3,
// so they are collectives in every mode; rank 0 calling one alone (the usual export on rank 0
// only, valid at stages 0-2 without master) fails within seconds naming the call, as
// save_checkpoint does (comm/entries.hpp), while rank 1 goes on training.
Outcome rank0_alone(const std::function<void(Engine&)>& alone) {
  Outcome out;
  run_ranks(
      2,
      [&](std::shared_ptr<comm::Group> g) {
        auto net = make_stage3_net(3, /*mark=*/true);
        auto e = initialize(net, rules_config(), g);
        train_step(e, *net, 0);
        if (g->rank() == 0) {
          out = timed([&] { alone(e); });
        } else {
          try {
            train_step(e, *net, 1);
          } catch (const std::exception&) {
            // Rank 0 gave up and its connections closed under this rank's collective.
          }
        }
      },
      kTimeout);
  return out;
}

TEST(Stage3Rules, StateDictOnRankZeroOnlyFailsNamingTheCall) {
  StateDictOptions opts;
  opts.master = false;  // a collective at stage 3 all the same
  const Outcome o = rank0_alone([&](Engine& e) { e.state_dict(opts); });
  std::printf("rank 0 failed after %.2f s: %s\n", o.seconds, o.error.c_str());
  EXPECT_HAS(o.error, "rank 1 did not call state_dict");
  EXPECT_HAS(o.error, "state_dict is a collective: call it on every rank");
  EXPECT_LT(o.seconds, kBoundS);
}

TEST(Stage3Rules, FlatParametersOnRankZeroOnlyFailsNamingTheCall) {
  const Outcome o = rank0_alone([&](Engine& e) { e.flat_parameters(); });
  std::printf("rank 0 failed after %.2f s: %s\n", o.seconds, o.error.c_str());
  EXPECT_HAS(o.error, "rank 1 did not call flat_parameters");
  EXPECT_HAS(o.error, "flat_parameters is a collective: call it on every rank");
  EXPECT_LT(o.seconds, kBoundS);
}

// L6: a generate/eval loop under c10::InferenceMode between steps. Releasing a unit there makes
// its empty placeholder, and gathering it makes the parameters' views, inside inference mode;
// training afterwards must see ordinary tensors. Both ranks evaluate, then train three steps:
// the same parameters as one process training on the whole batches (no evaluation there).
TEST(Stage3Rules, RunUnitUnderInferenceModeThenTrainingMatchesOneProcess) {
  const Config cfg = rules_config();
  constexpr int kSteps = 3;
  auto ref_net = make_stage3_net(3, /*mark=*/false);
  const ReferenceResult ref = train_reference(
      cfg, kSteps, kRows, *ref_net, [&](const at::Tensor& x) { return ref_net->forward(x); });
  std::mutex mu;
  std::vector<at::Tensor> got(2);
  run_ranks(
      2,
      [&](std::shared_ptr<comm::Group> g) {
        auto net = make_stage3_net(3, /*mark=*/true);
        auto e = initialize(net, cfg, g);
        for (int s = 0; s < kSteps; ++s) {
          const Batch b = rank_micro_batch(global_batch(s, kRows), g->rank(), 2, 0, 1);
          at::Tensor eval;
          {
            c10::InferenceMode guard;
            eval = net->forward(b.x);
          }
          EXPECT_EQ(net->body->block_module(0).fc->weight.numel(), 0) << "released after eval";
          const at::Tensor out = net->forward(b.x);
          EXPECT_TRUE(at::equal(eval, out.detach())) << "step " << s;
          e.backward(mse(out, b.y));
          e.step();
        }
        at::Tensor flat = e.flat_parameters();
        std::lock_guard<std::mutex> lock(mu);
        got[g->rank()] = flat;
      },
      kTimeout);
  for (int r = 0; r < 2; ++r) {
    ASSERT_TRUE(got[r].defined());
    EXPECT_LT(((got[r] - ref.params).abs().max() / ref.params.abs().max()).item<double>(), 1e-6)
        << "rank " << r;
  }
}

// L2: a unit destroyed while its all-gathers are in flight (an error between a gather and its
// wait unwinds past the engine) waits for them before its buffer goes: on a GPU the freed bytes
// would be handed to the next allocation while NCCL still writes them. Over a FakeGroup, whose
// log records whether each collective's Work was waited on.
TEST(Stage3Rules, UnitDestroyedWithGathersInFlightWaitsForThem) {
  FakeGroup group(/*rank=*/0, /*size=*/2);
  auto net = make_stage3_net(3, /*mark=*/false);
  FlattenOptions fo;
  fo.shards = 2;
  fo.bucket_numel = 200;
  fo.unit_buffers = true;
  for (size_t i = 0; i < net->body->size(); ++i) {
    for (const auto& p : net->body->block_module(i).parameters()) {
      fo.unit_of[p.unsafeGetTensorImpl()] = static_cast<int>(i) + 1;
    }
  }
  ShardStore store;
  store.fp = flatten_parameters(*net, group, fo);
  const UnitSlot* block = nullptr;
  for (const UnitSlot& s : store.fp.layout.units()) {
    if (s.unit != 0) block = &s;
  }
  ASSERT_NE(block, nullptr);
  {
    ShardedUnit unit(store, group, *block, "block", Residency::kOnUse, Publish::kCastShard,
                     at::kFloat, /*owner=*/0);
    unit.release();
    group.clear();
    unit.gather();
    ASSERT_EQ(static_cast<int>(group.launched("all_gather").size()),
              block->end_bucket - block->first_bucket);
    for (const auto& c : group.calls()) EXPECT_FALSE(c.waited) << c.what;
  }
  for (const auto& c : group.calls()) EXPECT_TRUE(c.waited) << c.what << " (after destruction)";
}

}  // namespace
}  // namespace zero::testing
