// A deferred start-up (include/zero/deferred_init.hpp) against the eager one it replaces: the
// example GPT built deferred and initialised from its own source, on real gloo thread-ranks at
// ZeRO stages 0-3, holds bit for bit the weights an eager build from the same seed gives (the
// reference: the eager constructor's parameters, no engine involved), in the masters and in the
// compute dtype; and the bad inputs are named.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <chrono>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "support/fake_device.hpp"
#include "support/thread_group.hpp"
#include "support/tiny_net.hpp"
#include "zero/deferred_init.hpp"
#include "zero/engine.hpp"
#include "zero/models/gpt.hpp"

namespace zero::testing {
namespace {

models::GptConfig small_gpt(bool tied, bool biases) {
  models::GptConfig c;
  c.vocab = 96;
  c.dim = 32;
  c.layers = 3;
  c.heads = 4;
  c.kv_heads = 2;
  c.ffn = 48;
  c.max_seq = 16;
  c.tied = tied;
  c.qkv_bias = biases;
  return c;
}

constexpr uint64_t kSeed = 1234;

// The reference: an eager build from the seed, and the first draw the generator gives after it.
StateDict eager_weights(const models::GptConfig& c, double* next_draw) {
  at::manual_seed(kSeed);
  models::Gpt gpt(c);
  StateDict out;
  for (const auto& item : gpt->named_parameters()) out.emplace_back(item.key(), item.value().clone());
  *next_draw = at::randn({1}).item<double>();
  return out;
}

// The rank threads share the global generator: one build at a time.
std::mutex build_mutex;

struct Case {
  int stage;
  bool bf16;
  bool tied;
  bool biases;
};

// `on_fake`: the placeholders on the fake accelerator (support/fake_device.hpp), rank r on
// fake:r, so the start-up's device path runs: released unit buffers made without allocating,
// and the uploads through the page-locked staging ring, cast on the device (review 2026-12-07a
// L6), with events completing late.
void expect_deferred_matches_eager(const Case& k, int world, bool on_fake = false) {
  SCOPED_TRACE("stage " + std::to_string(k.stage) + (k.bf16 ? " bf16" : " fp32") +
               (k.tied ? " tied" : " untied") + (k.biases ? " biases" : "") + ", world " +
               std::to_string(world) + (on_fake ? ", fake devices" : ""));
  const models::GptConfig c = small_gpt(k.tied, k.biases);
  double eager_next = 0;
  const StateDict eager = eager_weights(c, &eager_next);
  Config cfg = test_config(k.stage, 1, 1, 0.0, /*bucket=*/1000);
  cfg.zero_optimization.stage3.param_persistence_threshold = 0;
  cfg.bf16 = k.bf16;
  std::vector<StateDict> masters(world), computed(world);
  std::vector<double> next(world);
  run_ranks(
      world,
      [&](std::shared_ptr<comm::Group> group) {
        const int r = group->rank();
        std::shared_ptr<models::GptImpl> gpt;
        {
          std::lock_guard<std::mutex> lock(build_mutex);
          at::manual_seed(kSeed);
          gpt = std::make_shared<models::GptImpl>(
              c, Deferred{on_fake ? fake::device(r) : c10::Device(c10::kCPU)});
          next[r] = at::randn({1}).item<double>();
        }
        for (const auto& p : gpt->parameters()) EXPECT_TRUE(is_deferred(p));
        auto engine = initialize(gpt, cfg, group, gpt->initial_values());
        if (on_fake) {
          for (const auto& p : gpt->parameters()) EXPECT_EQ(p.device(), fake::device(r));
        }
        masters[r] = engine.state_dict({.master = true, .to_rank = -1, .cpu = true});
        computed[r] = engine.state_dict({.master = false, .to_rank = -1, .cpu = true});
      },
      std::chrono::seconds(60), on_fake ? fake::device().type() : c10::DeviceType::CPU);
  for (int r = 0; r < world; ++r) {
    SCOPED_TRACE("rank " + std::to_string(r));
    // The global generator passed through the same draws.
    EXPECT_EQ(next[r], eager_next);
    ASSERT_EQ(masters[r].size(), eager.size());
    for (size_t i = 0; i < eager.size(); ++i) {
      const auto& [name, want] = eager[i];
      EXPECT_EQ(masters[r][i].first, name);
      EXPECT_TRUE(at::equal(masters[r][i].second.to(at::kFloat), want)) << name << " (master)";
      const at::Tensor compute = want.to(k.bf16 ? at::kBFloat16 : at::kFloat);
      EXPECT_TRUE(at::equal(computed[r][i].second, compute)) << name << " (compute dtype)";
    }
  }
}

TEST(DeferredInit, GptMatchesTheEagerBuildAtEveryStage) {
  for (int stage : {0, 1, 2, 3}) {
    for (bool bf16 : {false, true}) {
      expect_deferred_matches_eager({stage, bf16, /*tied=*/true, /*biases=*/false}, 2);
    }
  }
  // Untied head, q/k/v biases (Qwen2-shaped), four ranks at stage 3.
  expect_deferred_matches_eager({3, false, /*tied=*/false, /*biases=*/true}, 4);
  expect_deferred_matches_eager({3, true, /*tied=*/false, /*biases=*/true}, 4);
  expect_deferred_matches_eager({2, true, /*tied=*/false, /*biases=*/true}, 4);
}

TEST(DeferredInit, OnAFakeDeviceMatchesTheEagerBuild) {
  fake::set_event_delay(std::chrono::microseconds(300));
  for (int stage : {2, 3}) {
    for (bool bf16 : {false, true}) {
      expect_deferred_matches_eager({stage, bf16, /*tied=*/false, /*biases=*/true}, 2, true);
    }
  }
  fake::set_event_delay(std::chrono::microseconds(0));
}

TEST(DeferredInit, ConstructionHoldsNoParameterBytes) {
  at::manual_seed(kSeed);
  models::Gpt gpt(small_gpt(false, false), Deferred{});
  int64_t held = 0;
  for (const auto& p : gpt->parameters()) {
    EXPECT_TRUE(is_deferred(p));
    EXPECT_TRUE(at::isnan(p).all().item<bool>());  // a forward before initialize shows it
    held += static_cast<int64_t>(p.storage().nbytes());
  }
  // Every placeholder is a view of one shared element.
  EXPECT_LE(held, static_cast<int64_t>(gpt->parameters().size() * sizeof(float)));
}

TEST(DeferredInit, BadInputIsNamedOnEveryRank) {
  const models::GptConfig c = small_gpt(true, false);
  Config cfg = test_config(3, 1, 1, 0.0, 1000);
  std::vector<std::string> errors(2);
  run_ranks(2, [&](std::shared_ptr<comm::Group> group) {
    std::shared_ptr<models::GptImpl> deferred, eager;
    {
      std::lock_guard<std::mutex> lock(build_mutex);
      at::manual_seed(kSeed);
      deferred = std::make_shared<models::GptImpl>(c, Deferred{});
      eager = std::make_shared<models::GptImpl>(c);
    }
    try {
      initialize(deferred, cfg, group);
    } catch (const std::exception& e) {
      errors[group->rank()] += e.what();
    }
    try {
      initialize(eager, cfg, group, deferred->initial_values());
    } catch (const std::exception& e) {
      errors[group->rank()] += e.what();
    }
    EXPECT_THROW(eager->initial_values(), std::exception);
  });
  for (const std::string& e : errors) {
    EXPECT_NE(e.find("parameter 'embed.weight' is deferred"), std::string::npos) << e;
    EXPECT_NE(e.find("got no InitialValues"), std::string::npos) << e;
    EXPECT_NE(e.find("parameter 'embed.weight' holds values"), std::string::npos) << e;
  }
}

}  // namespace
}  // namespace zero::testing
