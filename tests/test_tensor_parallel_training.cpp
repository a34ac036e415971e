// Training with tensor parallelism (zero/tensor_parallel/), without the ZeRO engine: TpNet
// (vocabulary-parallel embedding, LayerNorm, a column -> row MLP, LayerNorm, vocabulary-parallel
// head and cross-entropy) trained for 10 steps with torch::optim::SGD on each rank's shards
// against FullNet, the same model from plain LibTorch modules trained in one process on the same
// batches: the loss of every step and every parameter at the end (each rank's shard against the
// same part of the reference) within 1e-5 relative.
//
// Which gradients need a tensor-parallel all-reduce (Megatron's rule, here
// tensor_parallel::placements): without sequence parallelism none, every replicated parameter
// (the LayerNorms, the row layer's bias) sees the full activations on every rank; with it, each
// of those sees only its rank's part of the sequence, so their gradients are partial sums and are
// all-reduced over the tensor-parallel group before the step (all_reduce_partial_grads).
#include <gtest/gtest.h>
#include <torch/optim/sgd.h>

#include <ATen/CPUGeneratorImpl.h>

#include <map>
#include <string>
#include <vector>

#include "comm/group.hpp"
#include "support/thread_group.hpp"
#include "support/tp_compare.hpp"
#include "support/tp_net.hpp"
#include "zero/tensor_parallel/placement.hpp"

namespace zero::testing {
namespace {

constexpr int kSteps = 10;
constexpr double kLr = 0.5;
constexpr double kTol = 1e-5;
constexpr int64_t kBatch = 4, kSeq = 8;

struct Batch {
  at::Tensor ids, target;
};

Batch batch(int step, int64_t vocab) {
  at::Generator gen = at::detail::createCPUGenerator(1000 + step);
  Batch b;
  b.ids = at::randint(vocab, {kBatch, kSeq}, gen);
  // A learnable target: the next id, so the loss falls.
  b.target = (b.ids + 1) % vocab;
  return b;
}

struct Reference {
  std::vector<double> losses;
  std::map<std::string, at::Tensor> params;  // after the last step
};

Reference train_full(const TpNetShape& shape) {
  FullNet net(shape);
  torch::optim::SGD opt(net->parameters(), torch::optim::SGDOptions(kLr));
  Reference ref;
  for (int step = 0; step < kSteps; ++step) {
    const Batch b = batch(step, shape.vocab);
    opt.zero_grad();
    at::Tensor loss = net->forward(b.ids, b.target);
    loss.backward();
    opt.step();
    ref.losses.push_back(loss.item<double>());
  }
  for (const auto& p : net->named_parameters()) ref.params[p.key()] = p.value().detach().clone();
  return ref;
}

void train_parallel(int world, bool sp, const TpNetShape& shape, const Reference& ref) {
  run_ranks(world, [&](std::shared_ptr<comm::Group> g) {
    const bool print = g->rank() == 0;
    TpNet net(g, sp, shape);
    const auto params = tensor_parallel::placements(*net, sp);
    torch::optim::SGD opt(net->parameters(), torch::optim::SGDOptions(kLr));
    for (int step = 0; step < kSteps; ++step) {
      const Batch b = batch(step, shape.vocab);
      opt.zero_grad();
      at::Tensor loss = net->forward(b.ids, b.target).mean();
      loss.backward();
      tensor_parallel::all_reduce_partial_grads(params, *g);
      opt.step();
      const double got = loss.item<double>();
      EXPECT_NEAR(got, ref.losses[step], kTol * std::abs(ref.losses[step])) << "step " << step;
      if (print) {
        std::printf("  step %d loss %.7f reference %.7f rel err %.2g\n", step, got,
                    ref.losses[step], std::abs(got - ref.losses[step]) / ref.losses[step]);
      }
    }
    for (const auto& p : params) {
      const at::Tensor& whole = ref.params.at(p.name);
      const at::Tensor want = p.placement.sharded
                                  ? whole.chunk(g->size(), p.placement.partition_dim)[g->rank()]
                                  : whole;
      expect_rel_close(p.param, want, kTol, "trained " + p.name, print);
    }
  });
}

class TensorParallelTraining : public ::testing::TestWithParam<std::tuple<int, bool>> {};

TEST_P(TensorParallelTraining, SgdEqualsSingleProcessTraining) {
  const auto [world, sp] = GetParam();
  const TpNetShape shape;
  const Reference ref = train_full(shape);
  ASSERT_LT(ref.losses.back(), ref.losses.front());  // it learns something
  train_parallel(world, sp, shape, ref);
}

// The all-reduce is what makes sequence parallelism right: without it each rank steps its
// replicated parameters with the gradient of its part of the sequence and they drift apart from
// the reference (and from each other).
TEST(TensorParallelTraining, SequenceParallelWithoutTheAllReduceDrifts) {
  const TpNetShape shape;
  const Reference ref = train_full(shape);
  run_ranks(2, [&](std::shared_ptr<comm::Group> g) {
    TpNet net(g, /*sequence_parallel=*/true, shape);
    torch::optim::SGD opt(net->parameters(), torch::optim::SGDOptions(kLr));
    for (int step = 0; step < kSteps; ++step) {
      const Batch b = batch(step, shape.vocab);
      opt.zero_grad();
      net->forward(b.ids, b.target).mean().backward();
      opt.step();
    }
    EXPECT_GT(max_rel_err(net->norm1->weight, ref.params.at("norm1.weight")), 1e-3);
    EXPECT_GT(max_rel_err(net->fc2->bias, ref.params.at("fc2.bias")), 1e-3);
  });
}

INSTANTIATE_TEST_SUITE_P(Layouts, TensorParallelTraining,
                         ::testing::Combine(::testing::Values(2, 4), ::testing::Bool()),
                         [](const auto& info) {
                           return "T" + std::to_string(std::get<0>(info.param)) +
                                  (std::get<1>(info.param) ? "_sequence_parallel" : "");
                         });

}  // namespace
}  // namespace zero::testing
