// A deferred tensor-parallel start-up (TpGpt built with zero::Deferred, its values from
// initial_values_like_gpt: zero-train's start at tp > 1) against the eager one it replaces (TpGpt
// built whole, init_like_gpt from the same generator; that one is checked against the plain Gpt
// by test_tensor_parallel_gpt), tp 2 x dp 2 on gloo thread-ranks: after zero::initialize every
// rank's masters and compute-dtype parameters are bit for bit the eager build's parameters (the
// reference: the eager model itself, no engine involved), and the global generator is left where
// the eager build leaves it.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <chrono>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "support/thread_group.hpp"
#include "support/tiny_net.hpp"
#include "tp_trainer.hpp"
#include "zero/deferred_init.hpp"
#include "zero/engine.hpp"
#include "zero/models/tp_gpt.hpp"
#include "zero/tensor_parallel.hpp"

namespace zero::testing {
namespace {

constexpr uint64_t kSeed = 4321;
constexpr int kTp = 2, kDp = 2;

models::GptConfig small_gpt(bool tied, bool biases) {
  models::GptConfig c;
  c.vocab = 96;
  c.dim = 32;
  c.layers = 2;
  c.heads = 4;
  c.kv_heads = 2;
  c.ffn = 48;
  c.max_seq = 16;
  c.tied = tied;
  c.qkv_bias = c.o_bias = biases;
  return c;
}

struct Case {
  int stage;
  bool bf16;
  bool tied;
  bool sp;  // sequence parallelism: the norms' gradients partial, the weights alike
};

// The rank threads share the global generator: one build at a time.
std::mutex build_mutex;

void expect_deferred_matches_eager(const Case& k) {
  SCOPED_TRACE("stage " + std::to_string(k.stage) + (k.bf16 ? " bf16" : " fp32") +
               (k.tied ? " tied" : " untied, biases") + (k.sp ? ", sequence parallel" : ""));
  const models::GptConfig c = small_gpt(k.tied, !k.tied);
  Config cfg = test_config(k.stage, 1, 1, 0.0, /*bucket=*/1000);
  cfg.zero_optimization.stage3.param_persistence_threshold = 0;
  cfg.bf16 = k.bf16;
  run_ranks(
      kTp * kDp,
      [&](std::shared_ptr<comm::Group> world) {
        const auto groups = tensor_parallel::make_groups(world, kTp);
        std::map<std::string, at::Tensor> eager;
        double eager_next = 0, deferred_next = 0;
        models::TpGpt model(nullptr);
        InitialValues values;
        {
          std::lock_guard<std::mutex> lock(build_mutex);
          at::manual_seed(kSeed);
          const at::Generator gen = at::detail::getDefaultCPUGenerator().clone();
          models::TpGpt whole(groups.tp, c, k.sp);
          models::init_like_gpt(*whole, gen);
          for (const auto& p : whole->named_parameters()) eager[p.key()] = p.value().clone();
          eager_next = at::randn({1}).item<double>();

          at::manual_seed(kSeed);
          const at::Generator again = at::detail::getDefaultCPUGenerator().clone();
          model = models::TpGpt(groups.tp, c, k.sp, Deferred{c10::Device(c10::kCPU)});
          values = models::initial_values_like_gpt(*model, again);
          deferred_next = at::randn({1}).item<double>();
        }
        // The constructor drew what the eager one draws.
        EXPECT_EQ(deferred_next, eager_next);
        for (const auto& p : model->parameters()) EXPECT_TRUE(is_deferred(p));
        Engine engine = initialize(model.ptr(), cfg,
                                   examples::engine_groups(groups, model->placements()), values);
        ASSERT_EQ(engine.world_size(), kDp);
        const StateDict masters = engine.state_dict({.master = true, .to_rank = -1, .cpu = true});
        const StateDict computed = engine.state_dict({.master = false, .to_rank = -1, .cpu = true});
        ASSERT_EQ(masters.size(), eager.size());
        ASSERT_EQ(computed.size(), eager.size());
        for (size_t i = 0; i < masters.size(); ++i) {
          const std::string& name = masters[i].first;
          SCOPED_TRACE("rank " + std::to_string(world->rank()) + " " + name);
          ASSERT_EQ(eager.count(name), 1u);
          const at::Tensor& want = eager.at(name);
          EXPECT_TRUE(at::equal(masters[i].second.to(at::kFloat), want)) << "master";
          EXPECT_EQ(computed[i].first, name);
          EXPECT_TRUE(at::equal(computed[i].second, want.to(k.bf16 ? at::kBFloat16 : at::kFloat)))
              << "compute dtype";
        }
      },
      std::chrono::seconds(120));
}

TEST(DeferredInitTensorParallel, TpGptMatchesTheEagerBuild) {
  expect_deferred_matches_eager({3, false, /*tied=*/false, /*sp=*/false});
  expect_deferred_matches_eager({3, true, /*tied=*/true, /*sp=*/true});
  expect_deferred_matches_eager({2, true, /*tied=*/false, /*sp=*/true});
  expect_deferred_matches_eager({0, false, /*tied=*/true, /*sp=*/false});
}

}  // namespace
}  // namespace zero::testing
