// zero::run_unit and UnitBoundary against a mock stage-3 runtime (a small ZeRO-3 written here:
// each rank keeps 1/N of every block's parameters, all-gathers a block into its UnitStorage on
// demand, reduce-scatters its gradients when the last of them arrived and then releases it). The
// gathers and releases come in the order and number design §3.2-3.4 says (forward, backward
// re-gather, eval, zero::checkpoint around a unit), and training on 1 and 2 gloo thread-ranks
// gives the parameters of plain single-process training with SGD and AdamW.
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>

#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "comm/group.hpp"
#include "support/block_mlp.hpp"
#include "support/thread_group.hpp"
#include "zero/sharding.hpp"
#include "zero/units/unit_function.hpp"
#include "zero/units/unit_registry.hpp"
#include "zero/units/unit_runtime.hpp"
#include "zero/units/unit_storage.hpp"

namespace zero::testing {
namespace {

using units::UnitRuntime;
using units::UnitStorage;

constexpr int kBlocks = 3;
constexpr int64_t kWidth = 8;
constexpr int64_t kRows = 8;

class MockRuntime final : public UnitRuntime, public std::enable_shared_from_this<MockRuntime> {
 public:
  struct Unit {
    std::unique_ptr<UnitStorage> storage;
    int64_t padded = 0;
    at::Tensor shard;       // this rank's fp32 part of the unit: the master the optimizer steps
    at::Tensor grad_flat;   // the unit's gradients as they arrive (padded)
    at::Tensor grad_shard;  // this rank's part of their mean over ranks
    size_t arrived = 0;
    comm::Work pending;
    bool gathered = false;
  };

  MockRuntime(std::shared_ptr<comm::Group> g, BlockMlp& model) : group_(std::move(g)) {
    const int world = group_->size();
    units_.resize(model.size() + 1);  // unit 0: the root, empty here
    for (size_t b = 0; b < model.size(); ++b) {
      Unit& u = units_[b + 1];
      std::vector<UnitStorage::Param> ps;
      int64_t offset = 0;
      for (const at::Tensor& p : model.block_module(b).parameters()) {
        ps.push_back({p, offset});
        offset += p.numel();
      }
      u.padded = (offset + world - 1) / world * world;
      at::Tensor buffer = at::zeros({u.padded});
      {
        at::NoGradGuard g;
        for (const auto& p : ps) {
          buffer.narrow(0, p.offset, p.tensor.numel()).copy_(p.tensor.reshape({-1}));
        }
      }
      const int64_t part = u.padded / world;
      u.shard = buffer.narrow(0, group_->rank() * part, part).clone();
      u.grad_flat = at::zeros({u.padded});
      u.grad_shard = at::zeros({part});
      u.storage = std::make_unique<UnitStorage>(buffer, std::move(ps));
      u.storage->release();  // between uses a unit holds only its shard
    }
  }

  // Registers the blocks and the hooks that "launch" a unit's gradients (the engine's buckets).
  void install(BlockMlp& model) {
    for (size_t b = 0; b < model.size(); ++b) {
      units::bind(model.block_module(b), shared_from_this(), static_cast<int>(b) + 1);
      for (const auto& p : units_[b + 1].storage->params()) {
        torch::autograd::impl::set_post_acc_grad_hooks(
            p.tensor, std::make_unique<Arrival>(this, static_cast<int>(b) + 1, p.offset));
      }
    }
  }

  void gather(int u) override {
    Unit& x = units_.at(u);
    EXPECT_FALSE(x.gathered) << "gather of a gathered unit " << u;
    log("G" + std::to_string(u));
    x.storage->allocate();
    at::Tensor out = x.storage->buffer();
    x.pending = group_->all_gather(out, x.shard, "gather unit " + std::to_string(u));
    x.gathered = true;
  }
  void wait(int u) override {
    Unit& x = units_.at(u);
    EXPECT_TRUE(x.gathered);
    x.pending.wait();
    x.pending = comm::Work();
    x.storage->view_params();
  }
  void release(int u) override {
    Unit& x = units_.at(u);
    EXPECT_TRUE(x.gathered) << "release of a released unit " << u;
    log("R" + std::to_string(u));
    x.pending.wait();
    x.storage->release();
    x.gathered = false;
  }
  bool gathered(int u) const override { return units_.at(u).gathered; }
  void entered_forward(int u) override { log("F" + std::to_string(u)); }
  void entered_backward(int u) override { log("B" + std::to_string(u)); }
  void prefetch() override { ++prefetch_calls; }
  bool in_backward() const override { return in_backward_; }
  bool keep_after_forward(int) const override { return keep_; }
  std::string unit_name(int u) const override { return "block" + std::to_string(u - 1); }

  // The engine's run_backward: the pass, then the sweep of what is still gathered.
  void backward(const at::Tensor& loss) {
    in_backward_ = true;
    loss.backward();
    in_backward_ = false;
    for (size_t u = 1; u < units_.size(); ++u) {
      if (units_[u].gathered) {
        log("S" + std::to_string(u));
        release(static_cast<int>(u));
      }
    }
  }

  std::vector<at::Tensor> shards() {
    std::vector<at::Tensor> s;
    for (size_t u = 1; u < units_.size(); ++u) {
      s.push_back(units_[u].shard);
      s.back().mutable_grad() = units_[u].grad_shard;
    }
    return s;
  }

  // Every unit gathered, parameters viewed (to compare them with the reference's).
  void gather_all() {
    for (size_t u = 1; u < units_.size(); ++u) {
      if (!gathered(static_cast<int>(u))) gather(static_cast<int>(u));
      wait(static_cast<int>(u));
    }
  }

  std::vector<std::string> take_log() {
    std::lock_guard<std::mutex> lock(mu_);
    return std::exchange(log_, {});
  }

  bool keep_ = false;
  int prefetch_calls = 0;

 private:
  struct Arrival final : torch::autograd::PostAccumulateGradHook {
    Arrival(MockRuntime* rt, int unit, int64_t offset) : rt(rt), unit(unit), offset(offset) {}
    void operator()(const torch::autograd::Variable& p) override { rt->arrive(unit, offset, p); }
    MockRuntime* rt;
    int unit;
    int64_t offset;
  };

  // A gradient landed: into the unit's flat gradient, out of .grad (as the engine's buckets
  // take it). The last one of the unit launches the reduce-scatter and releases the unit: §3.3.
  void arrive(int u, int64_t offset, const torch::autograd::Variable& p) {
    Unit& x = units_.at(u);
    at::Tensor param = p;
    {
      at::NoGradGuard g;
      x.grad_flat.narrow(0, offset, param.grad().numel()).add_(param.grad().reshape({-1}));
    }
    param.mutable_grad() = at::Tensor();
    if (++x.arrived < x.storage->params().size()) return;
    x.arrived = 0;
    log("L" + std::to_string(u));
    group_->reduce_scatter_sum(x.grad_shard, x.grad_flat, "reduce unit " + std::to_string(u))
        .wait();
    x.grad_shard.div_(group_->size());
    x.grad_flat.zero_();
    release(u);
  }

  void log(std::string e) {
    std::lock_guard<std::mutex> lock(mu_);
    log_.push_back(std::move(e));
  }

  std::shared_ptr<comm::Group> group_;
  std::vector<Unit> units_;
  bool in_backward_ = false;
  std::mutex mu_;
  std::vector<std::string> log_;
};

using Log = std::vector<std::string>;

std::shared_ptr<BlockMlp> model_like(const BlockMlp& src) {
  auto m = std::make_shared<BlockMlp>(kBlocks, kWidth, 0.0);
  at::NoGradGuard g;
  auto from = src.parameters();
  auto to = m->parameters();
  for (size_t i = 0; i < to.size(); ++i) to[i].copy_(from[i]);
  for (size_t b = 0; b < m->size(); ++b) zero::shard(m->block_module(b));
  return m;
}

struct Data {
  std::vector<at::Tensor> x, y;  // per step, the global batch
};

Data make_data(int steps) {
  Data d;
  for (int s = 0; s < steps; ++s) {
    d.x.push_back(at::randn({kRows, kWidth}));
    d.y.push_back(at::randn({kRows, kWidth}));
  }
  return d;
}

at::Tensor mse(const at::Tensor& a, const at::Tensor& b) { return (a - b).pow(2).mean(); }

enum class Opt { kSgd, kAdamW };

std::unique_ptr<torch::optim::Optimizer> make_optimizer(Opt o, std::vector<at::Tensor> params) {
  if (o == Opt::kSgd) {
    return std::make_unique<torch::optim::SGD>(params, torch::optim::SGDOptions(0.1));
  }
  return std::make_unique<torch::optim::AdamW>(params,
                                               torch::optim::AdamWOptions(0.01).weight_decay(0.1));
}

// Plain single-process training on the global batches: no runtime, run_unit is fn(inputs).
std::vector<at::Tensor> train_reference(const BlockMlp& src, const Data& d, Opt o, bool ckpt) {
  auto m = model_like(src);
  auto opt = make_optimizer(o, m->parameters());
  CheckpointOptions copts;
  for (size_t s = 0; s < d.x.size(); ++s) {
    opt->zero_grad();
    mse(m->forward(d.x[s], ckpt ? &copts : nullptr), d.y[s]).backward();
    opt->step();
  }
  std::vector<at::Tensor> out;
  for (const auto& p : m->parameters()) out.push_back(p.detach().clone());
  return out;
}

// The same on `world` thread-ranks through the mock runtime, each on its rows of the batch.
void check_training(int world, Opt o, bool ckpt) {
  // The reference on as many intra-op threads as the ranks run (run_ranks sets 1): a LayerNorm
  // or matmul reduction split over 2 threads rounds differently (ctest runs each test in a
  // fresh process, where the count is still the default).
  at::set_num_threads(1);
  at::manual_seed(11);
  BlockMlp src(kBlocks, kWidth, 0.0);
  const Data d = make_data(3);
  const std::vector<at::Tensor> want = train_reference(src, d, o, ckpt);
  std::mutex mu;
  std::vector<std::vector<at::Tensor>> got(world);
  run_ranks(world, [&](std::shared_ptr<comm::Group> g) {
    std::shared_ptr<BlockMlp> m;
    {
      std::lock_guard<std::mutex> lock(mu);
      m = model_like(src);
    }
    auto rt = std::make_shared<MockRuntime>(g, *m);
    rt->install(*m);
    auto opt = make_optimizer(o, rt->shards());
    const int64_t rows = kRows / world;
    CheckpointOptions copts;
    for (size_t s = 0; s < d.x.size(); ++s) {
      const at::Tensor x = d.x[s].narrow(0, g->rank() * rows, rows);
      const at::Tensor y = d.y[s].narrow(0, g->rank() * rows, rows);
      rt->backward(mse(m->forward(x, ckpt ? &copts : nullptr), y));
      opt->step();
      // Nothing stays gathered into the step, and every block went through its whole cycle.
      for (int u = 1; u <= kBlocks; ++u) EXPECT_FALSE(rt->gathered(u));
    }
    rt->gather_all();
    std::lock_guard<std::mutex> lock(mu);
    for (const auto& p : m->parameters()) got[g->rank()].push_back(p.detach().clone());
    units::unbind(*rt);
  });
  for (int r = 0; r < world; ++r) {
    ASSERT_EQ(got[r].size(), want.size());
    for (size_t i = 0; i < want.size(); ++i) {
      const float diff = (got[r][i] - want[i]).abs().max().item<float>();
      if (world == 1) {
        // One rank: the same operations on the same numbers (SGD and AdamW).
        EXPECT_TRUE(at::equal(got[r][i], want[i])) << "parameter " << i << " max diff " << diff;
      } else {
        // Two ranks average two half-batch means: equal up to rounding.
        EXPECT_TRUE(at::allclose(got[r][i], want[i], 1e-5, 1e-6))
            << "parameter " << i << " max diff " << diff;
      }
    }
  }
  // Training moved the parameters (the comparison is not between two copies of the start).
  EXPECT_FALSE(at::allclose(want[0], src.parameters()[0], 1e-3, 1e-3));
}

TEST(RunUnit, SgdOnOneRankIsPlainTraining) { check_training(1, Opt::kSgd, false); }
TEST(RunUnit, AdamWOnOneRankIsBitwisePlainTraining) { check_training(1, Opt::kAdamW, false); }
TEST(RunUnit, SgdOnTwoRanksIsPlainTraining) { check_training(2, Opt::kSgd, false); }
TEST(RunUnit, AdamWOnTwoRanksIsPlainTraining) { check_training(2, Opt::kAdamW, false); }
TEST(RunUnit, CheckpointAroundUnitsOnTwoRanksIsPlainTraining) {
  check_training(2, Opt::kAdamW, true);
}

// One rank's pass, logged: G gather, F/B entered forward/backward, R release, L gradients
// launched, S released by the end-of-backward sweep.
struct Single {
  std::shared_ptr<BlockMlp> m;
  std::shared_ptr<MockRuntime> rt;
};

Single single_rank() {
  at::manual_seed(3);
  BlockMlp src(kBlocks, kWidth, 0.0);
  Single s;
  s.m = model_like(src);
  s.rt = std::make_shared<MockRuntime>(comm::Group::single(), *s.m);
  s.rt->install(*s.m);
  return s;
}

TEST(RunUnit, ForwardReleasesEachUnitAndBackwardGathersItAgainInReverse) {
  Single s = single_rank();
  const at::Tensor x = at::randn({4, kWidth});
  at::Tensor loss = s.m->forward(x).sum();
  EXPECT_EQ(s.rt->take_log(), (Log{"G1", "F1", "R1", "G2", "F2", "R2", "G3", "F3", "R3"}));
  EXPECT_EQ(s.rt->prefetch_calls, 3);
  // Between the passes the parameters are empty: nothing of the model is held but its shards.
  for (const auto& p : s.m->parameters()) EXPECT_EQ(p.numel(), 0);
  s.rt->backward(loss);
  EXPECT_EQ(s.rt->take_log(),
            (Log{"G3", "B3", "L3", "R3", "G2", "B2", "L2", "R2", "G1", "B1", "L1", "R1"}));
  EXPECT_EQ(s.rt->prefetch_calls, 6);
  units::unbind(*s.rt);
}

TEST(RunUnit, KeptAfterForwardAUnitIsNotGatheredAgainInBackward) {
  Single s = single_rank();
  s.rt->keep_ = true;  // every unit recurs within the reuse distance (DeepSpeed's default)
  at::Tensor loss = s.m->forward(at::randn({4, kWidth})).sum();
  EXPECT_EQ(s.rt->take_log(), (Log{"G1", "F1", "G2", "F2", "G3", "F3"}));
  s.rt->backward(loss);
  EXPECT_EQ(s.rt->take_log(), (Log{"B3", "L3", "R3", "B2", "L2", "R2", "B1", "L1", "R1"}));
  units::unbind(*s.rt);
}

TEST(RunUnit, EvalGathersAndReleasesWithoutABoundary) {
  Single s = single_rank();
  s.rt->keep_ = true;  // irrelevant without a backward
  at::NoGradGuard no_grad;
  const at::Tensor y = s.m->forward(at::randn({4, kWidth}));
  EXPECT_FALSE(y.requires_grad());
  EXPECT_EQ(y.grad_fn(), nullptr);
  EXPECT_EQ(s.rt->take_log(), (Log{"G1", "F1", "R1", "G2", "F2", "R2", "G3", "F3", "R3"}));
  units::unbind(*s.rt);
}

TEST(RunUnit, CheckpointAroundAUnitGathersForTheRecomputationAndKeepsItForItsBackward) {
  Single s = single_rank();
  CheckpointOptions copts;
  at::Tensor loss = s.m->forward(at::randn({4, kWidth}), &copts).sum();
  // The checkpoint's forward runs without grad: the eval path.
  EXPECT_EQ(s.rt->take_log(), (Log{"G1", "F1", "R1", "G2", "F2", "R2", "G3", "F3", "R3"}));
  s.rt->backward(loss);
  // The recomputation gathers (no forward entry: it is backward), is not released when it
  // ends, and its nested backward enters the boundary and launches the gradients.
  EXPECT_EQ(s.rt->take_log(),
            (Log{"G3", "B3", "L3", "R3", "G2", "B2", "L2", "R2", "G1", "B1", "L1", "R1"}));
  units::unbind(*s.rt);
}

TEST(RunUnit, AUnitWhoseGradientsNeverArriveIsReleasedByTheSweep) {
  Single s = single_rank();
  // Only block 0's output feeds the loss. Block 1 runs under no grad (gathered and released at
  // once); block 2 is kept after its forward but backward never reaches it: the sweep frees it.
  const at::Tensor x = at::randn({4, kWidth});
  at::Tensor h = s.m->block(0, x);
  {
    at::NoGradGuard g;
    (void)s.m->block(1, h);
  }
  s.rt->keep_ = true;
  (void)s.m->block(2, h);  // kept after forward, never reached by backward
  EXPECT_EQ(s.rt->take_log(), (Log{"G1", "F1", "R1", "G2", "F2", "R2", "G3", "F3"}));
  s.rt->backward(h.sum());
  EXPECT_EQ(s.rt->take_log(), (Log{"G1", "B1", "L1", "R1", "S3", "R3"}));
  units::unbind(*s.rt);
}

TEST(RunUnit, WithoutARuntimeItIsTheBlockItself) {
  BlockMlp m(1, kWidth, 0.0);
  zero::shard(m.block_module(0));  // marked, but no engine runs it
  EXPECT_TRUE(zero::is_sharded(m.block_module(0)));
  EXPECT_FALSE(zero::is_sharded(m));
  int calls = 0;
  const at::Tensor x = at::randn({2, kWidth});
  const at::Tensor same = x * 2;
  const std::vector<at::Tensor> out = zero::run_unit(m.block_module(0),
                                                     [&](const std::vector<at::Tensor>& in) {
                                                       ++calls;
                                                       return std::vector<at::Tensor>{same, in[0]};
                                                     },
                                                     {x});
  EXPECT_EQ(calls, 1);
  ASSERT_EQ(out.size(), 2u);
  EXPECT_TRUE(out[0].is_same(same));  // the very tensors fn returned
  EXPECT_TRUE(out[1].is_same(x));
  EXPECT_EQ(units::marked_names(m), (std::vector<std::string>{"block0"}));
}

TEST(RunUnit, BackwardAfterTheRuntimeIsGoneNamesTheUnit) {
  Single s = single_rank();
  at::Tensor loss = s.m->forward(at::randn({4, kWidth})).sum();
  units::unbind(*s.rt);
  s.rt.reset();
  try {
    loss.backward();
    FAIL() << "backward should have failed";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("block2"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("destroyed"), std::string::npos) << e.what();
  }
}

TEST(RunUnit, IntegerOutputsPassThroughNonDifferentiable) {
  Single s = single_rank();
  const at::Tensor x = at::randn({4, kWidth});
  auto out = zero::run_unit(s.m->block_module(0),
                            [&](const std::vector<at::Tensor>& in) {
                              at::Tensor y = s.m->block_module(0).forward(in[0]);
                              return std::vector<at::Tensor>{y, y.argmax(1), at::Tensor()};
                            },
                            {x});
  ASSERT_EQ(out.size(), 3u);
  EXPECT_TRUE(out[0].requires_grad());
  EXPECT_NE(out[0].grad_fn(), nullptr);
  EXPECT_FALSE(out[1].requires_grad());
  EXPECT_EQ(out[1].scalar_type(), at::kLong);
  EXPECT_FALSE(out[2].defined());
  s.rt->backward(out[0].sum());
  EXPECT_EQ(s.rt->take_log(), (Log{"G1", "F1", "R1", "G1", "B1", "L1", "R1"}));
  units::unbind(*s.rt);
}

}  // namespace
}  // namespace zero::testing
