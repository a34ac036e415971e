// The first backward through checkpointed blocks guesses one gradient per parameter hidden in
// them and releases buckets as they fill (so step 1 does not hold the whole gradient); a weight
// shared by two blocks then delivers its second gradient after its bucket was reduced, and that
// late gradient is reduced on its own after backward. The result must be the same training as
// plain autograd on the whole batch, at step 1 (late path) and step 2 (counts known).
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>
#include <torch/nn/module.h>

#include <functional>
#include <mutex>

#include "support/thread_group.hpp"
#include "zero/activation_checkpointing.hpp"
#include "zero/engine.hpp"

namespace zero::testing {
namespace {

constexpr int kDim = 16, kWorld = 2, kRows = 8, kSteps = 2;
constexpr double kLr = 0.1;

// Registered a, shared, b: laid out b, shared, a (one bucket each at 256-element buckets).
// Backward runs block 2 (b, then shared: its bucket is released) and then block 1 (shared
// again: late, then a).
struct SharedNet : torch::nn::Module {
  explicit SharedNet(bool checkpointed) : checkpointed(checkpointed) {
    // Own generator: ranks are threads, and the global one would interleave their draws.
    at::Generator gen = at::detail::createCPUGenerator(3);
    a = register_parameter("a", at::randn({kDim, kDim}, gen) * 0.3);
    shared = register_parameter("shared", at::randn({kDim, kDim}, gen) * 0.3);
    b = register_parameter("b", at::randn({kDim, kDim}, gen) * 0.3);
  }
  at::Tensor forward(const at::Tensor& x) {
    auto block1 = [this](const at::Tensor& h) {
      return at::matmul(at::tanh(at::matmul(h, a)), shared);
    };
    auto block2 = [this](const at::Tensor& h) {
      return at::matmul(at::tanh(at::matmul(h, shared)), b);
    };
    if (!checkpointed) return block2(block1(x));
    return checkpoint(block2, checkpoint(block1, x));
  }
  bool checkpointed;
  at::Tensor a, shared, b;
};

at::Tensor batch(int step) {
  at::Generator gen = at::detail::createCPUGenerator(100 + step);
  return at::randn({kRows, kDim}, gen);
}

at::Tensor loss_of(SharedNet& net, const at::Tensor& x) { return net.forward(x).pow(2).mean(); }

// Plain autograd, the whole batch, SGD by hand.
std::vector<at::Tensor> reference() {
  SharedNet ref(false);
  for (int s = 0; s < kSteps; ++s) {
    for (auto& p : ref.parameters()) p.mutable_grad().reset();
    loss_of(ref, batch(s)).backward();
    at::NoGradGuard g;
    for (auto& p : ref.parameters()) p.sub_(p.grad() * kLr);
  }
  return ref.parameters();
}

Config sgd_config() {
  Config cfg;
  cfg.zero_optimization.stage = 2;
  cfg.zero_optimization.reduce_bucket_size = kDim * kDim;
  cfg.train_micro_batch_size_per_gpu = kRows / kWorld;
  cfg.optimizer.type = "SGD";
  cfg.optimizer.lr = kLr;
  cfg.optimizer.momentum = 0;
  cfg.optimizer.weight_decay = 0;
  return cfg;
}

// Trains on kWorld ranks, rank r's forward checkpointed when checkpointed(r); every rank's
// parameters must be the reference's.
void expect_trains_as_plain_autograd(const std::function<bool(int)>& checkpointed) {
  const std::vector<at::Tensor> want = reference();
  const Config cfg = sgd_config();
  std::mutex mu;
  std::vector<std::vector<at::Tensor>> after(kWorld);
  run_ranks(kWorld, [&](std::shared_ptr<comm::Group> group) {
    auto net = std::make_shared<SharedNet>(checkpointed(group->rank()));
    auto engine = initialize(net, cfg, group);
    const int r = group->rank();
    for (int s = 0; s < kSteps; ++s) {
      const at::Tensor x = batch(s).narrow(0, r * (kRows / kWorld), kRows / kWorld);
      engine.backward(loss_of(*net, x));
      engine.step();
    }
    std::lock_guard<std::mutex> lock(mu);
    for (const auto& p : net->parameters()) after[r].push_back(p.detach().clone());
  });
  for (int r = 0; r < kWorld; ++r) {
    ASSERT_EQ(after[r].size(), want.size());
    for (size_t i = 0; i < want.size(); ++i) {
      EXPECT_TRUE(at::allclose(after[r][i], want[i], 1e-5, 1e-6))
          << "rank " << r << " parameter " << i << ": max difference "
          << (after[r][i] - want[i]).abs().max().item<double>();
    }
  }
}

TEST(CheckpointedFirstPass, SharedWeightsLateGradientTrainsAsPlainAutograd) {
  expect_trains_as_plain_autograd([](int) { return true; });
}

// Data-dependent checkpointing: only rank 0 runs its blocks through zero::checkpoint, so only
// rank 0 guesses counts on the first pass and has a late gradient. Rank 1 must still take part
// in the agreement on late gradients and in the late bucket's reduction (with zeros): a
// collective only rank 0 issues would hang both (or pair with rank 1's next one).
TEST(CheckpointedFirstPass, OnlyOneRankWithALateGradientTrainsAsPlainAutograd) {
  expect_trains_as_plain_autograd([](int rank) { return rank == 0; });
}

}  // namespace
}  // namespace zero::testing
