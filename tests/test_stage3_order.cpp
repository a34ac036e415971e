// ZeRO stage 3 with a data-dependent graph (review 2026-12-06e H1): a marked block holds a
// branch that rank 0 runs and rank 1 skips, each of the branch's parameters in a bucket of its
// own (reduce_bucket_size 0). Rank 1's branch buckets count as delivered when its backward
// starts, so they are reduce-scattered as soon as their turn in the agreed order comes, before
// rank 1 reaches the block's boundary and all-gathers the block; rank 0 all-gathers first and
// reduce-scatters the branch after. On one communicator those are two different sequences of
// collectives (gloo: an error or a timeout; NCCL: a hang or mixed data). Trained on 2 real gloo
// ranks against one process training on the concatenated batch, each half through the graph its
// rank runs. The comm timeout is short, so a mismatch fails in seconds instead of hanging.
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>
#include <torch/nn/modules/linear.h>

#include <mutex>

#include "support/thread_group.hpp"
#include "support/tiny_net.hpp"
#include "zero/engine.hpp"
#include "zero/sharding.hpp"

namespace zero::testing {
namespace {

constexpr int64_t kWidth = 16;

// fc, then (when `branch`) a two-layer branch added to its output: four parameters, four
// buckets at reduce_bucket_size 0, reached only by the ranks that run the branch.
struct BranchBlock : torch::nn::Module {
  BranchBlock() {
    fc = register_module("fc", torch::nn::Linear(kWidth, kWidth));
    b1 = register_module("b1", torch::nn::Linear(kWidth, kWidth));
    b2 = register_module("b2", torch::nn::Linear(kWidth, kWidth));
  }
  at::Tensor forward(const at::Tensor& x, bool branch) {
    at::Tensor h = at::tanh(fc(x));
    if (branch) h = h + b2(at::tanh(b1(h)));
    return h;
  }
  torch::nn::Linear fc{nullptr}, b1{nullptr}, b2{nullptr};
};

struct BranchNet : torch::nn::Module {
  BranchNet() {
    inp = register_module("inp", torch::nn::Linear(12, kWidth));
    blk0 = register_module("blk0", std::make_shared<BranchBlock>());
    blk1 = register_module("blk1", std::make_shared<BranchBlock>());
    head = register_module("head", torch::nn::Linear(kWidth, 5));
  }
  at::Tensor forward(const at::Tensor& x, bool branch) {
    at::Tensor h = at::tanh(inp(x));
    for (BranchBlock* b : {blk0.get(), blk1.get()}) {
      h = run_unit(
          *b, [b, branch](const at::Tensor& t) { return b->forward(t, branch); }, h);
    }
    return head(h);
  }
  torch::nn::Linear inp{nullptr}, head{nullptr};
  std::shared_ptr<BranchBlock> blk0, blk1;
};

std::shared_ptr<BranchNet> make_branch_net(bool mark) {
  auto net = std::make_shared<BranchNet>();
  auto gen = at::make_generator<at::CPUGeneratorImpl>(5);
  at::NoGradGuard g;
  for (auto& p : net->parameters()) p.copy_(at::randn(p.sizes(), gen) * 0.3);
  if (mark) {
    zero::shard(*net->blk0);
    zero::shard(*net->blk1);
  }
  return net;
}

constexpr int kWorld = 2;
constexpr int kSteps = 4;
constexpr int64_t kRows = 16;

Config branch_config(bool sgd) {
  Config cfg = test_config(3, kRows / kWorld, 1, /*clip=*/0.0, /*bucket=*/0);
  if (sgd) {
    cfg.optimizer.type = "SGD";
    cfg.optimizer.lr = 0.05;
    cfg.optimizer.momentum = 0.9;
  }
  cfg.zero_optimization.stage3.param_persistence_threshold = 0;
  return cfg;
}

class Stage3Branch : public ::testing::TestWithParam<bool> {};

TEST_P(Stage3Branch, BranchRunByOneRankOnlyTrainsAsOneProcess) {
  const bool sgd = GetParam();
  const Config cfg = branch_config(sgd);
  // The reference: rank r's rows are the r-th half of each global batch; the first half runs
  // the branch, the second does not, and the loss is the mean over both (equal halves).
  auto ref_net = make_branch_net(false);
  const ReferenceResult ref =
      train_reference(cfg, kSteps, kRows, *ref_net, [&](const at::Tensor& x) {
        const int64_t half = x.size(0) / 2;
        return at::cat({ref_net->forward(x.narrow(0, 0, half), true),
                        ref_net->forward(x.narrow(0, half, half), false)});
      });
  std::mutex mu;
  std::vector<at::Tensor> got(kWorld);
  run_ranks(
      kWorld,
      [&](std::shared_ptr<comm::Group> group) {
        auto net = make_branch_net(true);
        auto engine = initialize(net, cfg, group);
        const int r = group->rank();
        for (int s = 0; s < kSteps; ++s) {
          const Batch b = rank_micro_batch(global_batch(s, kRows), r, kWorld, 0, 1);
          engine.backward(mse(net->forward(b.x, /*branch=*/r == 0), b.y));
          engine.step();
        }
        at::Tensor flat = engine.flat_parameters();
        std::lock_guard<std::mutex> lock(mu);
        got[r] = flat;
      },
      std::chrono::seconds(10));
  for (int r = 0; r < kWorld; ++r) {
    ASSERT_TRUE(got[r].defined()) << "rank " << r;
    const double diff = ((got[r] - ref.params).abs().max() / ref.params.abs().max()).item<double>();
    EXPECT_LT(diff, 1e-6) << "rank " << r;
  }
  // The branch trained (rank 0's half reaches it), so agreement is not trivial.
  EXPECT_GT((ref.params - flatten(*make_branch_net(false))).abs().max().item<double>(), 1e-2);
}

INSTANTIATE_TEST_SUITE_P(Optimizers, Stage3Branch, ::testing::Values(false, true),
                         [](const ::testing::TestParamInfo<bool>& i) {
                           return std::string(i.param ? "SGD" : "AdamW");
                         });

}  // namespace
}  // namespace zero::testing
