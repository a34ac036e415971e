// Engine::state_dict at 2 thread ranks, stages 1 and 2 (master weights sharded): after training,
// the gathered master weights equal single-process torch::optim training parameter by parameter
// and the model's own parameters; gathering to one rank leaves the others empty; under bf16 the
// master weights are the unrounded values whose rounding the module computes with; evaluating
// the training module in place between steps (README "Evaluation") changes nothing.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <mutex>

#include "support/thread_group.hpp"
#include "support/tiny_net.hpp"
#include "zero/engine.hpp"

namespace zero::testing {
namespace {

constexpr int kWorld = 2;
constexpr int kSteps = 3;
constexpr int64_t kGlobalRows = 16;

void train(Engine& engine, TinyNetImpl& net, int rank, at::ScalarType dtype = at::kFloat) {
  for (int s = 0; s < kSteps; ++s) {
    Batch b = rank_micro_batch(global_batch(s, kGlobalRows), rank, kWorld, 0, 1);
    engine.backward(mse(net.forward(b.x.to(dtype)).to(at::kFloat), b.y));
    engine.step();
  }
}

class StateDictTest : public ::testing::TestWithParam<int> {};

TEST_P(StateDictTest, MasterWeightsMatchReferenceTrainingOnEveryRank) {
  const int stage = GetParam();
  Config cfg = test_config(stage, kGlobalRows / kWorld, 1, 0.0, /*bucket=*/100);
  const ReferenceResult ref = train_reference(cfg, kSteps, kGlobalRows, /*seed=*/5);

  std::mutex mu;
  std::vector<StateDict> dicts(kWorld), to_one(kWorld);
  std::vector<std::vector<std::pair<std::string, at::Tensor>>> params(kWorld);
  run_ranks(kWorld, [&](std::shared_ptr<comm::Group> group) {
    auto net = make_tiny_net(5);
    auto engine = initialize(net, cfg, group);
    const int r = group->rank();
    train(engine, *net, r);
    StateDict all = engine.state_dict();
    StateDictOptions one;
    one.to_rank = 1;
    StateDict only = engine.state_dict(one);
    std::lock_guard<std::mutex> lock(mu);
    dicts[r] = std::move(all);
    to_one[r] = std::move(only);
    for (const auto& item : net->named_parameters()) {
      params[r].emplace_back(item.key(), item.value().detach().clone());
    }
  });

  for (int r = 0; r < kWorld; ++r) {
    ASSERT_EQ(dicts[r].size(), params[r].size()) << "rank " << r;
    int64_t offset = 0;  // ref.params is flat, in named_parameters() order
    for (size_t i = 0; i < dicts[r].size(); ++i) {
      const auto& [name, t] = dicts[r][i];
      EXPECT_EQ(name, params[r][i].first);
      ASSERT_EQ(t.sizes(), params[r][i].second.sizes()) << name;
      EXPECT_EQ(t.scalar_type(), at::kFloat);
      EXPECT_TRUE(t.device().is_cpu());
      const at::Tensor want = ref.params.narrow(0, offset, t.numel()).view(t.sizes());
      offset += t.numel();
      EXPECT_LT((t - want).abs().max().item<double>(), 2e-5) << "rank " << r << " " << name;
      // fp32: the module computes with the master values themselves.
      EXPECT_TRUE(at::equal(t, params[r][i].second)) << "rank " << r << " " << name;
    }
    EXPECT_EQ(offset, ref.params.numel());
  }
  EXPECT_TRUE(to_one[0].empty());
  ASSERT_EQ(to_one[1].size(), dicts[1].size());
  for (size_t i = 0; i < to_one[1].size(); ++i) {
    EXPECT_TRUE(at::equal(to_one[1][i].second, dicts[1][i].second)) << to_one[1][i].first;
  }
  // Training moved the parameters, so matching the reference is not matching the start.
  EXPECT_GT((ref.params - flatten(*make_tiny_net(5))).abs().max().item<double>(), 1e-2);
}

TEST_P(StateDictTest, Bf16MasterIsTheUnroundedValueOfTheComputeWeights) {
  const int stage = GetParam();
  Config cfg = test_config(stage, kGlobalRows / kWorld, 1, 0.0, /*bucket=*/100);
  cfg.bf16 = true;
  std::mutex mu;
  std::vector<StateDict> master(kWorld), compute(kWorld);
  std::vector<std::vector<at::Tensor>> params(kWorld);
  run_ranks(kWorld, [&](std::shared_ptr<comm::Group> group) {
    auto net = make_tiny_net(6);
    auto engine = initialize(net, cfg, group);
    const int r = group->rank();
    train(engine, *net, r, at::kBFloat16);
    StateDictOptions c;
    c.master = false;
    StateDict m = engine.state_dict(), k = engine.state_dict(c);
    std::lock_guard<std::mutex> lock(mu);
    master[r] = std::move(m);
    compute[r] = std::move(k);
    for (const auto& p : net->parameters()) params[r].push_back(p.detach().clone());
  });
  for (int r = 0; r < kWorld; ++r) {
    ASSERT_EQ(master[r].size(), params[r].size());
    ASSERT_EQ(compute[r].size(), params[r].size());
    bool finer = false;
    for (size_t i = 0; i < params[r].size(); ++i) {
      const at::Tensor& m = master[r][i].second;
      EXPECT_EQ(m.scalar_type(), at::kFloat);
      EXPECT_EQ(compute[r][i].second.scalar_type(), at::kBFloat16);
      EXPECT_TRUE(at::equal(compute[r][i].second, params[r][i])) << master[r][i].first;
      EXPECT_TRUE(at::equal(m.to(at::kBFloat16), params[r][i])) << master[r][i].first;
      finer |= !at::equal(m, params[r][i].to(at::kFloat));
    }
    EXPECT_TRUE(finer) << "rank " << r << ": the master weights are only the bf16 values";
  }
}

INSTANTIATE_TEST_SUITE_P(Sharded, StateDictTest, ::testing::Values(1, 2),
                         [](const auto& info) { return "stage" + std::to_string(info.param); });

// The README's evaluation recipe: eval(), a forward pass under NoGradGuard, train(), between
// two steps of stage 2. Training ends bit for bit where it ends without the evaluation, and the
// evaluated loss is that of a separate module loaded from state_dict().
TEST(Evaluation, EvaluationBetweenStepsChangesNothing) {
  const Config cfg = test_config(2, kGlobalRows / kWorld, 1, 0.0, /*bucket=*/100);
  std::mutex mu;
  std::vector<at::Tensor> with(kWorld), without(kWorld);
  std::vector<double> in_place(kWorld), standalone(kWorld);
  run_ranks(kWorld, [&](std::shared_ptr<comm::Group> group) {
    const int r = group->rank();
    const Batch val = global_batch(100, kGlobalRows);
    for (const bool evaluate : {false, true}) {
      auto net = make_tiny_net(5);
      auto engine = initialize(net, cfg, group);
      for (int s = 0; s < kSteps; ++s) {
        Batch b = rank_micro_batch(global_batch(s, kGlobalRows), r, kWorld, 0, 1);
        engine.backward(mse(net->forward(b.x), b.y));
        engine.step();
        if (!evaluate || s != 1) continue;
        ASSERT_TRUE(engine.is_gradient_accumulation_boundary());
        net->eval();
        double loss = 0;
        {
          at::NoGradGuard no_grad;
          loss = mse(net->forward(val.x), val.y).item<double>();
        }
        net->train();
        const StateDict sd = engine.state_dict();  // a collective: every rank
        auto other = make_tiny_net(99);
        double other_loss = 0;
        {
          at::NoGradGuard no_grad;
          auto params = other->named_parameters();
          for (const auto& [name, t] : sd) params[name].copy_(t);
          other_loss = mse(other->forward(val.x), val.y).item<double>();
        }
        std::lock_guard<std::mutex> lock(mu);
        in_place[r] = loss;
        standalone[r] = other_loss;
      }
      std::lock_guard<std::mutex> lock(mu);
      (evaluate ? with : without)[r] = engine.flat_parameters();
    }
  });
  for (int r = 0; r < kWorld; ++r) {
    EXPECT_TRUE(at::equal(with[r], without[r])) << "rank " << r;
    EXPECT_GT(in_place[r], 0.0);
    EXPECT_NEAR(in_place[r], standalone[r], 1e-6 * standalone[r]) << "rank " << r;
  }
  // The separate module really started elsewhere: its own loss before loading differs.
  const Batch val = global_batch(100, kGlobalRows);
  at::NoGradGuard no_grad;
  EXPECT_GT(std::abs(mse(make_tiny_net(99)->forward(val.x), val.y).item<double>() - standalone[0]),
            1e-3);
}

}  // namespace
}  // namespace zero::testing
