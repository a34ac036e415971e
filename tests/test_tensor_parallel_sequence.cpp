// Sequence parallelism in the tensor-parallel layers (zero/tensor_parallel/), on T gloo ranks as
// threads: the activations outside each column/row pair split along the sequence give the same
// loss and gradients as plain tensor parallelism, which match single-process LibTorch on the full
// tensors (kTol relative, fp32: summation order only); a replicated parameter that sequence
// parallelism would leave with a partial gradient must be marked, or it is refused by name.
#include <gtest/gtest.h>
#include <torch/nn/modules/normalization.h>

#include <cmath>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>

#include "comm/group.hpp"
#include "support/thread_group.hpp"
#include "support/tp_compare.hpp"
#include "support/tp_net.hpp"
#include "zero/tensor_parallel/mappings.hpp"
#include "zero/tensor_parallel/placement.hpp"

namespace zero::tensor_parallel {
namespace {

using testing::expect_rel_close;
using testing::run_ranks;

constexpr double kTol = 1e-6;

at::Tensor randint(int64_t high, at::IntArrayRef sizes, uint64_t seed) {
  at::Generator gen = at::detail::createCPUGenerator(seed);
  return at::randint(high, sizes, gen);
}

at::Tensor part(const at::Tensor& full, int64_t dim, const comm::Group& g) {
  return full.chunk(g.size(), dim)[g.rank()];
}

// ---- sequence parallelism ---------------------------------------------------------------

// TpNet (tests/support/tp_net.hpp): vocabulary-parallel embedding, LayerNorm, column -> row MLP,
// LayerNorm, vocabulary-parallel head and cross-entropy. With sequence parallelism the
// activations outside the column/row pairs are split along the sequence; the loss and, after
// the all-reduce of the partial gradients, every gradient equal the plain tensor-parallel ones,
// which equal the single-process model's.
TEST(TensorParallelSequence, SequenceParallelEqualsTensorParallelEqualsFull) {
  const testing::TpNetShape shape;
  constexpr int64_t B = 2, S = 8;
  const at::Tensor ids = randint(shape.vocab, {B, S}, 41);
  const at::Tensor target = randint(shape.vocab, {B, S}, 42);
  testing::FullNet full(shape);
  at::Tensor loss_full = full->forward(ids, target);
  loss_full.backward();
  std::map<std::string, at::Tensor> full_grads;
  double full_norm_sq = 0;
  for (const auto& p : full->named_parameters()) {
    full_grads[p.key()] = p.value().grad();
    full_norm_sq += p.value().grad().to(at::kDouble).square().sum().item<double>();
  }

  for (int world : {2, 4}) {
    SCOPED_TRACE("T=" + std::to_string(world));
    run_ranks(world, [&](std::shared_ptr<comm::Group> g) {
      const bool print = g->rank() == 0;
      testing::TpNet plain(g, false, shape);
      testing::TpNet seq(g, true, shape);
      at::Tensor loss_plain = plain->forward(ids, target).mean();
      at::Tensor loss_seq = seq->forward(ids, target).mean();
      loss_plain.backward();
      loss_seq.backward();
      expect_rel_close(loss_plain, loss_full, kTol, "TP loss vs full", print);
      expect_rel_close(loss_seq, loss_plain, kTol, "SP loss vs TP", print);

      const auto plain_params = placements(*plain, false);
      const auto seq_params = placements(*seq, true);
      ASSERT_EQ(plain_params.size(), seq_params.size());
      ASSERT_EQ(plain_params.size(), full_grads.size());
      // Before the all-reduce a norm's gradient covers this rank's part of the sequence only.
      EXPECT_GT(testing::max_rel_err(seq->norm1->weight.grad(), plain->norm1->weight.grad()), 1e-3);
      all_reduce_partial_grads(seq_params, *g);
      // The global gradient norm counts each shard once and each replicated parameter once.
      const double full_norm = std::sqrt(full_norm_sq);
      EXPECT_NEAR(std::sqrt(grad_norm_sq(plain_params, *g)), full_norm, kTol * full_norm);
      EXPECT_NEAR(std::sqrt(grad_norm_sq(seq_params, *g)), full_norm, kTol * full_norm);
      for (size_t i = 0; i < seq_params.size(); ++i) {
        const auto& p = seq_params[i];
        const auto& q = plain_params[i];
        ASSERT_EQ(p.name, q.name);
        // Replicated: the norms and the row layer's bias; under SP all three need the
        // all-reduce, without SP none does.
        const bool replicated = p.name.rfind("norm", 0) == 0 || p.name == "fc2.bias";
        EXPECT_EQ(p.placement.sharded, !replicated) << p.name;
        EXPECT_EQ(p.placement.grad_needs_all_reduce, replicated) << p.name;
        EXPECT_FALSE(q.placement.grad_needs_all_reduce) << p.name;
        const at::Tensor& whole = full_grads.at(p.name);
        const at::Tensor want =
            p.placement.sharded ? part(whole, p.placement.partition_dim, *g) : whole;
        expect_rel_close(q.param.grad(), want, kTol, "TP gradient of " + p.name + " vs full",
                         print);
        expect_rel_close(p.param.grad(), q.param.grad(), kTol, "SP gradient of " + p.name, print);
      }
    });
  }
}

// Sequence parallelism cannot tell a replicated parameter acting on this rank's part of the
// sequence (partial gradient: sum it) from one acting on the whole sequence (whole gradient:
// summing would multiply it by T). An unmarked one is refused with its name and the fix; a
// marked one gets what its innermost marking module says.
struct SpTail : torch::nn::Module, SequenceParallelModule {
  explicit SpTail(bool mark) : mark(mark) {
    ln = register_module("ln", torch::nn::LayerNorm(torch::nn::LayerNormOptions({4})));
  }
  SequenceShare sequence_share(const std::string& name) const override {
    // Says kWhole for its norm's bias: the outer model's kPartial for it must not win.
    return mark && name == "ln.bias" ? SequenceShare::kWhole : SequenceShare::kUnsaid;
  }
  bool mark;
  torch::nn::LayerNorm ln{nullptr};
};

struct SpModel : torch::nn::Module, SequenceParallelModule {
  SpModel(GroupPtr g, bool mark) : mark(mark) {
    fc = register_module(
        "fc",
        ColumnParallelLinear(
            g, ColumnParallelLinearOptions(4, 8).gather_output(false).sequence_parallel(true)));
    tail = register_module("tail", std::make_shared<SpTail>(mark));
    gate = register_parameter("gate", at::ones({1}));
  }
  SequenceShare sequence_share(const std::string& name) const override {
    if (!mark) return SequenceShare::kUnsaid;
    if (name == "gate") return SequenceShare::kWhole;
    return name.rfind("tail.ln.", 0) == 0 ? SequenceShare::kPartial : SequenceShare::kUnsaid;
  }
  bool mark;
  ColumnParallelLinear fc{nullptr};
  std::shared_ptr<SpTail> tail;
  at::Tensor gate;
};

TEST(TensorParallelSequence, UnmarkedReplicatedParameterIsRefusedByName) {
  run_ranks(2, [&](std::shared_ptr<comm::Group> g) {
    const SpModel unmarked(g, false);
    try {
      placements(unmarked, /*sequence_parallel=*/true);
      ADD_FAILURE() << "an unmarked replicated parameter was guessed";
    } catch (const std::invalid_argument& e) {
      const std::string m = e.what();
      EXPECT_NE(m.find("'gate', 'tail.ln.weight', 'tail.ln.bias' are not marked"),
                std::string::npos)
          << m;
      EXPECT_NE(m.find("SequenceParallelModule"), std::string::npos) << m;
      EXPECT_EQ(m.find("fc."), std::string::npos) << "the layer's own are not asked: " << m;
    }
    // Without sequence parallelism nothing is partial and nothing needs saying.
    for (const auto& p : placements(unmarked, false)) {
      EXPECT_FALSE(p.placement.grad_needs_all_reduce) << p.name;
    }

    const SpModel marked(g, true);
    std::map<std::string, Placement> got;
    for (const auto& p : placements(marked, true)) got[p.name] = p.placement;
    ASSERT_EQ(got.size(), 5u);
    EXPECT_TRUE(got.at("fc.weight").sharded);
    EXPECT_FALSE(got.at("gate").grad_needs_all_reduce);
    EXPECT_TRUE(got.at("tail.ln.weight").grad_needs_all_reduce);
    EXPECT_FALSE(got.at("tail.ln.bias").grad_needs_all_reduce) << "the inner module's word wins";
  });
}

}  // namespace
}  // namespace zero::tensor_parallel
