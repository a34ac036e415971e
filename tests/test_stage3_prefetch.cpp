// ZeRO stage 3's prefetch (design sharded-units.md §3.5): after the first pass is recorded, each
// unit's entry issues the gathers of the units the trace says come next, within
// stage3_prefetch_bucket_size and stage3_max_live_parameters, and a unit reused within
// stage3_max_reuse_distance stays gathered after its forward. Checked against what the keys
// mean, never the engine against itself:
//   - trained with prefetch (and reuse) on, on 2 and 4 real gloo ranks, against one process
//     training on the concatenated batch with torch's optimizers and clip_grad_norm_;
//   - the gathers are issued ahead: a log of the units' all-gathers and of the blocks' own
//     forwards shows block i+1's gather before block i runs (and after it with prefetch 0);
//   - the fake accelerator's allocator, which counts every device byte, shows a forward holding
//     exactly the units the limits allow beside the current one, and no more.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <mutex>
#include <string>
#include <vector>

#include "support/fake_device.hpp"
#include "support/forwarding_group.hpp"
#include "support/stage3_net.hpp"
#include "support/thread_group.hpp"
#include "support/tiny_net.hpp"
#include "zero/engine.hpp"
#include "zero/sharding.hpp"

namespace zero::testing {
namespace {

// ---- (a) equivalence with one process -------------------------------------------------------

struct Case {
  int world;
  bool sgd;
  int accumulation;
  double clip;
  // stage3_prefetch_bucket_size / max_live_parameters / max_reuse_distance, in units of one
  // block's elements (<0: DeepSpeed's default).
  double prefetch = -1, live = -1, reuse = -1;
  bool checkpoint = false;  // each block in zero::checkpoint (recomputed in backward)
};

constexpr int64_t kBlockNumel = kStage3Width * kStage3Width + 3 * kStage3Width;

std::string name_of(const ::testing::TestParamInfo<Case>& info) {
  const Case& c = info.param;
  auto n = [](double v) { return v < 0 ? std::string("def") : std::to_string(int(v * 10)); };
  return "world" + std::to_string(c.world) + (c.sgd ? "_sgd" : "_adamw") + "_ga" +
         std::to_string(c.accumulation) + "_pf" + n(c.prefetch) + "_live" + n(c.live) + "_reuse" +
         n(c.reuse) + (c.checkpoint ? "_ckpt" : "");
}

void set_limits(Config& cfg, double prefetch, double live, double reuse, int64_t unit) {
  auto& z3 = cfg.zero_optimization.stage3;
  z3.param_persistence_threshold = 0;
  if (prefetch >= 0) z3.prefetch_bucket_size = static_cast<int64_t>(prefetch * unit);
  if (live >= 0) z3.max_live_parameters = static_cast<int64_t>(live * unit);
  if (reuse >= 0) z3.max_reuse_distance = static_cast<int64_t>(reuse * unit);
}

constexpr int kSteps = 4;
constexpr int64_t kGlobalRows = 48;

Config case_config(const Case& c) {
  Config cfg = test_config(3, kGlobalRows / (c.world * c.accumulation), c.accumulation, c.clip);
  if (c.sgd) {
    cfg.optimizer.type = "SGD";
    cfg.optimizer.lr = 0.05;
    cfg.optimizer.momentum = 0.9;
    cfg.optimizer.weight_decay = 0.01;
  }
  set_limits(cfg, c.prefetch, c.live, c.reuse, kBlockNumel);
  return cfg;
}

class Stage3Prefetch : public ::testing::TestWithParam<Case> {};

TEST_P(Stage3Prefetch, MatchesSingleProcessTraining) {
  const Case c = GetParam();
  const Config cfg = case_config(c);
  auto ref_net = make_stage3_net(3, /*mark=*/false);
  const ReferenceResult ref = train_reference(
      cfg, kSteps, kGlobalRows, *ref_net, [&](const at::Tensor& x) { return ref_net->forward(x); });
  std::mutex mu;
  std::vector<at::Tensor> got(c.world);
  run_ranks(c.world, [&](std::shared_ptr<comm::Group> group) {
    auto net = make_stage3_net(3, /*mark=*/true);
    auto engine = initialize(net, cfg, group);
    const int r = group->rank();
    CheckpointOptions ckpt;
    for (int s = 0; s < kSteps; ++s) {
      const Batch global = global_batch(s, kGlobalRows);
      for (int m = 0; m < c.accumulation; ++m) {
        const Batch b = rank_micro_batch(global, r, c.world, m, c.accumulation);
        at::Tensor h = at::tanh(net->inp(b.x));
        h = net->body->forward(h, c.checkpoint ? &ckpt : nullptr);
        engine.backward(mse(net->head(h), b.y));
        engine.step();
        // Nothing gathered survives a micro-step.
        for (size_t i = 0; i < net->body->size(); ++i) {
          EXPECT_EQ(net->body->block_module(i).fc->weight.storage().nbytes(), 0u) << i;
        }
      }
    }
    at::Tensor flat = engine.flat_parameters();
    std::lock_guard<std::mutex> lock(mu);
    got[r] = flat;
  });
  ASSERT_FALSE(HasFailure());
  for (int r = 0; r < c.world; ++r) {
    ASSERT_EQ(got[r].numel(), ref.params.numel());
    const double rel = ((got[r] - ref.params).abs().max() / ref.params.abs().max()).item<double>();
    EXPECT_LT(rel, 1e-6) << "rank " << r;
  }
  EXPECT_GT((ref.params - flatten(*make_stage3_net(3, false))).abs().max().item<double>(), 1e-2);
}

INSTANTIATE_TEST_SUITE_P(
    WorldsOptimizersLimits, Stage3Prefetch,
    ::testing::Values(
        // DeepSpeed's defaults: everything prefetched at the first entry, kept until backward.
        Case{2, false, 2, 0.3}, Case{4, true, 2, 0.3},
        // One unit ahead, released after forward: gathers and releases interleave.
        Case{2, true, 2, 0.3, 1.0, -1, 0}, Case{4, false, 1, 0.3, 1.0, -1, 0},
        // The live cap below two units (the prefetch may cross it once), reuse of one unit.
        Case{4, true, 2, 0.3, -1, 1.5, 1.0}, Case{2, false, 2, 0.3, -1, 2.0, 0},
        // Recomputed blocks (their backward gathers again under prefetch).
        Case{2, false, 2, 0.3, 1.0, -1, 0, true}, Case{4, true, 1, 0.3, -1, -1, -1, true}),
    name_of);

// ---- (b) gathers issued ahead of use ---------------------------------------------------------

// One log for a rank's units' all-gathers and its blocks' forwards, in the order they happen.
struct EventLog {
  std::mutex mu;
  std::vector<std::string> events;
  // A unit's gathers (one per bucket) come one after another: logged once.
  void add(std::string e) {
    std::lock_guard<std::mutex> lock(mu);
    if (events.empty() || events.back() != e) events.push_back(std::move(e));
  }
};

// Logs the all-gathers of every group split from it (the units' communicator is one).
class LoggingGroup : public ForwardingGroup {
 public:
  LoggingGroup(std::shared_ptr<comm::Group> g, std::shared_ptr<EventLog> log)
      : ForwardingGroup(std::move(g)), log_(std::move(log)) {}
  comm::Work all_gather(at::Tensor& o, at::Tensor& i, const std::string& w) override {
    // "all_gather of unit body.block1 (parameter bucket 3)": one entry per unit gather.
    const auto at = w.find("all_gather of unit ");
    if (at != std::string::npos && w.find("(parameter bucket") != std::string::npos) {
      log_->add("gather " + w.substr(at + 19, w.find(' ', at + 19) - (at + 19)));
    }
    return ForwardingGroup::all_gather(o, i, w);
  }
  std::shared_ptr<comm::Group> split(int color, int key, const std::string& n) override {
    auto s = ForwardingGroup::split(color, key, n);
    return s ? std::make_shared<LoggingGroup>(s, log_) : nullptr;
  }

 private:
  std::shared_ptr<EventLog> log_;
};

// The events of rank 0's last step, for `prefetch` (in block elements; 0: none) with reuse 0.
std::vector<std::string> last_step_events(double prefetch) {
  constexpr int kRanks = 2;
  Config cfg = test_config(3, 8, 1, 0.0);
  set_limits(cfg, prefetch, -1, 0, kBlockNumel);
  std::vector<std::string> out;
  run_ranks(kRanks, [&](std::shared_ptr<comm::Group> group) {
    auto log = std::make_shared<EventLog>();
    auto logged = std::make_shared<LoggingGroup>(group, log);
    auto net = make_stage3_net(3, /*mark=*/true);
    auto engine = initialize(net, cfg, logged);
    const int r = group->rank();
    for (int s = 0; s < 3; ++s) {
      {
        std::lock_guard<std::mutex> lock(log->mu);
        log->events.clear();
      }
      const Batch b = rank_micro_batch(global_batch(s, 16), r, kRanks, 0, 1);
      at::Tensor h = at::tanh(net->inp(b.x));
      for (size_t i = 0; i < net->body->size(); ++i) {
        auto& blk = net->body->block_module(i);
        h = run_unit(
            blk,
            [&, i](const at::Tensor& t) {
              log->add("run body.block" + std::to_string(i));
              return blk.forward(t);
            },
            h);
      }
      engine.backward(mse(net->head(h), b.y));
      engine.step();
    }
    if (r == 0) {
      std::lock_guard<std::mutex> lock(log->mu);
      out = log->events;
    }
  });
  return out;
}

std::string joined(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& e : v) s += e + "; ";
  return s;
}

int64_t index_of(const std::vector<std::string>& v, const std::string& e) {
  for (size_t i = 0; i < v.size(); ++i) {
    if (v[i] == e) return static_cast<int64_t>(i);
  }
  return -1;
}

TEST(Stage3PrefetchOrder, NextBlocksAreGatheredBeforeTheCurrentOneRuns) {
  // One block ahead: block i+1's gather is issued at block i's entry, before block i runs;
  // in backward (no forward runs) the three gathers come in the backward order.
  const std::vector<std::string> one = last_step_events(1.0);
  SCOPED_TRACE(joined(one));
  for (int i = 0; i + 1 < kStage3Blocks; ++i) {
    const int64_t next = index_of(one, "gather body.block" + std::to_string(i + 1));
    const int64_t run = index_of(one, "run body.block" + std::to_string(i));
    ASSERT_GE(next, 0);
    ASSERT_GE(run, 0);
    EXPECT_LT(next, run) << "block " << i + 1 << "'s gather should precede block " << i << "'s run";
  }
  // No prefetch: each block's gather comes after the previous block ran.
  const std::vector<std::string> none = last_step_events(0.0);
  SCOPED_TRACE(joined(none));
  for (int i = 0; i + 1 < kStage3Blocks; ++i) {
    const int64_t next = index_of(none, "gather body.block" + std::to_string(i + 1));
    const int64_t run = index_of(none, "run body.block" + std::to_string(i));
    ASSERT_GE(next, 0);
    EXPECT_GT(next, run);
  }
  // The same gathers in both: forward and backward each gather every block once (reuse 0).
  EXPECT_EQ(std::count_if(one.begin(), one.end(),
                          [](const std::string& e) { return e.rfind("gather", 0) == 0; }),
            std::count_if(none.begin(), none.end(),
                          [](const std::string& e) { return e.rfind("gather", 0) == 0; }));
}

// ---- (b) the live-parameter cap, on the fake accelerator's allocator ---------------------------

constexpr int64_t kDeepWidth = kStage3DeepWidth;
constexpr int64_t kDeepNumel = kDeepWidth * kDeepWidth + 3 * kDeepWidth;  // one block
constexpr int64_t kDeepBytes = 4 * kDeepNumel;

// The forward's peak device bytes above what the rank held when the forward began, at the
// third step (the trace recorded), for the given limits (in block elements).
int64_t forward_peak(double prefetch, double live, double reuse) {
  constexpr int kRanks = 2;
  Config cfg = test_config(3, 4, 1, 0.0, /*bucket=*/kDeepWidth * kDeepWidth);
  set_limits(cfg, prefetch, live, reuse, kDeepNumel);
  std::vector<int64_t> peaks(kRanks);
  run_ranks(
      kRanks,
      [&](std::shared_ptr<comm::Group> group) {
        const int r = group->rank();
        const c10::Device d = fake::device(r);
        auto net = make_marked_deep_net(d);
        auto engine = initialize(net, cfg, group);
        for (int s = 0; s < 3; ++s) {
          const at::Tensor x = at::randn({4, kDeepWidth}).to(d);
          const int64_t at0 = fake::allocated_bytes(r);
          fake::reset_peak(r);
          const at::Tensor y = net->forward(x);
          peaks[r] = fake::peak_bytes(r) - at0;
          engine.backward(y.square().mean());
          engine.step();
        }
      },
      std::chrono::seconds(60), fake::device().type());
  EXPECT_EQ(peaks[0], peaks[1]);
  return peaks[0];
}

TEST(Stage3PrefetchMemory, ForwardHoldsWhatTheLimitsAllowAndNoMore) {
  // Without prefetch (reuse 0) a forward holds one block at a time beside its activations; the
  // runs below differ from it only in the units gathered, so the differences are exact.
  const int64_t base = forward_peak(0, -1, 0);
  const int64_t tol = 16 * 1024;  // allocator blocks of activations that may fall differently
  struct Row {
    double prefetch, live, reuse;
    int extra;  // blocks held beside the current one
  } rows[] = {
      {1.0, -1, 0, 1},  // stage3_prefetch_bucket_size = one block: one ahead
      {-1, 2.0, 0, 1},  // max_live_parameters = two blocks: the current one and one ahead
      {-1, 3.0, 0, 2},  // three: two ahead
      {-1, 1.5, 0, 1},  // the prefetch crosses the cap once (DeepSpeed's fetch_sub_module)
      {0, -1, -1, kStage3DeepBlocks - 1},  // no prefetch, reuse 1e9: every block kept
  };
  for (const Row& row : rows) {
    const int64_t peak = forward_peak(row.prefetch, row.live, row.reuse);
    std::printf(
        "prefetch %.1f live %.1f reuse %.1f: forward peak %lld B = base %lld + %.3f blocks\n",
        row.prefetch, row.live, row.reuse, static_cast<long long>(peak),
        static_cast<long long>(base), double(peak - base) / kDeepBytes);
    EXPECT_NEAR(peak - base, row.extra * kDeepBytes, tol)
        << "prefetch " << row.prefetch << " live " << row.live << " reuse " << row.reuse;
  }
}

}  // namespace
}  // namespace zero::testing
