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

#include <filesystem>
#include <mutex>

#include "support/fake_device.hpp"
#include "support/stage3_net.hpp"
#include "support/thread_group.hpp"
#include "support/timed.hpp"
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

// Rank 0 runs the three marked blocks (one unit each, all of one size) in order, rank 1 in
// reverse: each rank's first gather is of another unit, and the all-gathers pair block 0's
// shards with block 2's without any error from the backend (before the order check this trained
// on, each rank computing with parameters half of another block's). Every rank must fail with
// the same text, naming where the orders part and the units there, within seconds. On the fake
// accelerator the comparison stays on the device and is read one backward later; meanwhile its
// flag skips that pass's optimizer step on the device (review 2026-12-07a L1: the parameters
// after the first step are the initial ones), and a save_checkpoint right after that step
// reads the comparison and fails instead of saving.
enum class Where { kCpu, kDevice, kDeviceSave };

class Stage3GatherOrder : public ::testing::TestWithParam<Where> {};

TEST_P(Stage3GatherOrder, RankDependentUnitOrderFailsOnEveryRankNamingTheUnits) {
  const Where where = GetParam();
  const bool device = where != Where::kCpu;
  constexpr int kRanks = 2;
  constexpr int64_t kGlobal = 16;
  // One bucket per block: with many, the gradient path's bounded buffers make a rank wait for
  // a reduction that its peer, all-gathering in another order, launches only later, and the
  // device's pass (compared one backward late) would end in the comm timeout instead.
  Config cfg = test_config(3, kGlobal / kRanks, 1, /*clip=*/0.0, /*bucket=*/4096);
  cfg.zero_optimization.stage3.param_persistence_threshold = 0;
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / "zero_test_stage3_order_save";
  std::filesystem::remove_all(dir);
  std::vector<Outcome> outcome(kRanks);
  std::vector<int> steps_done(kRanks, 0);
  std::vector<at::Tensor> initial(kRanks), after_first(kRanks);
  run_ranks(
      kRanks,
      [&](std::shared_ptr<comm::Group> group) {
        const int r = group->rank();
        const c10::Device d = device ? fake::device(r) : c10::Device(c10::kCPU);
        auto net = make_stage3_net(3, /*mark=*/true);
        net->to(d);
        auto engine = initialize(net, cfg, group);
        initial[r] = engine.flat_parameters().cpu();
        const size_t n = net->body->size();
        outcome[r] = timed([&] {
          for (int s = 0; s < 3; ++s) {
            const Batch b = rank_micro_batch(global_batch(s, kGlobal), r, kRanks, 0, 1);
            at::Tensor h = at::tanh(net->inp(b.x.to(d)));
            for (size_t k = 0; k < n; ++k) h = net->body->block(r == 1 ? n - 1 - k : k, h);
            engine.backward(mse(net->head(h), b.y.to(d)));
            engine.step();
            ++steps_done[r];
            if (s == 0) after_first[r] = engine.flat_parameters().cpu();
            if (where == Where::kDeviceSave) engine.save_checkpoint(dir.string(), "t");
          }
        });
      },
      std::chrono::seconds(20), device ? fake::device().type() : c10::DeviceType::CPU);
  for (int r = 0; r < kRanks; ++r) {
    SCOPED_TRACE("rank " + std::to_string(r));
    const std::string& e = outcome[r].error;
    EXPECT_NE(e.find("the ranks all-gathered their units in different orders"), std::string::npos)
        << e;
    EXPECT_NE(e.find("rank 1: its gather 1 was of unit 'body.block2' where rank 0's was of "
                     "'body.block0'"),
              std::string::npos)
        << e;
    EXPECT_NE(e.find("zero::run_unit"), std::string::npos) << e;
    EXPECT_EQ(e.find("rank 0:"), std::string::npos) << e;  // rank 0's order is the reference
    EXPECT_LT(outcome[r].seconds, 10.0);
    // The CPU check reads the comparison in the first backward, the device's one later.
    EXPECT_EQ(steps_done[r], device ? 1 : 0);
    if (device) {
      EXPECT_NE(e.find("were never applied"), std::string::npos) << e;
      // The step of the pass that mixed the units' shards was skipped on the device.
      ASSERT_TRUE(after_first[r].defined());
      EXPECT_TRUE(at::equal(after_first[r], initial[r]))
          << "max change " << (after_first[r] - initial[r]).abs().max().item<double>();
    }
  }
  if (where == Where::kDeviceSave) {
    EXPECT_FALSE(std::filesystem::exists(dir / "t")) << "a mixed pass was saved";
  }
  std::filesystem::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(CpuAndDevice, Stage3GatherOrder,
                         ::testing::Values(Where::kCpu, Where::kDevice, Where::kDeviceSave),
                         [](const ::testing::TestParamInfo<Where>& i) {
                           return std::string(i.param == Where::kCpu      ? "Cpu"
                                              : i.param == Where::kDevice ? "FakeDevice"
                                                                          : "FakeDeviceSave");
                         });

}  // namespace
}  // namespace zero::testing
