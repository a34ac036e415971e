// Tensor-parallel layers and their communication (zero/tensor_parallel/), on T gloo ranks as
// threads, against single-process LibTorch on the full tensors: nn::Linear / nn::Embedding built
// from the same full weights, at::cross_entropy on the full logits. Outputs and the gradients of
// inputs and weights (each rank's shard against the same part of the reference's) agree within
// kTol relative (max |a - b| / max |b|; fp32, the difference is summation order only). The
// communication functions are checked against values worked out by hand.
#include <gtest/gtest.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>
#include <torch/utils.h>

#include <chrono>
#include <cmath>
#include <functional>
#include <initializer_list>
#include <map>
#include <stdexcept>
#include <string>
#include <utility>

#include "comm/group.hpp"
#include "support/thread_group.hpp"
#include "support/tp_compare.hpp"
#include "support/tp_net.hpp"
#include "zero/tensor_parallel/cross_entropy.hpp"
#include "zero/tensor_parallel/embedding.hpp"
#include "zero/tensor_parallel/init.hpp"
#include "zero/tensor_parallel/linear.hpp"
#include "zero/tensor_parallel/mappings.hpp"
#include "zero/tensor_parallel/placement.hpp"

namespace zero::tensor_parallel {
namespace {

using testing::expect_rel_close;
using testing::run_ranks;

constexpr double kTol = 1e-6;

at::Tensor randn(at::IntArrayRef sizes, uint64_t seed) {
  at::Generator gen = at::detail::createCPUGenerator(seed);
  return at::randn(sizes, gen);
}

at::Tensor randint(int64_t high, at::IntArrayRef sizes, uint64_t seed) {
  at::Generator gen = at::detail::createCPUGenerator(seed);
  return at::randint(high, sizes, gen);
}

at::Tensor part(const at::Tensor& full, int64_t dim, const comm::Group& g) {
  return full.chunk(g.size(), dim)[g.rank()];
}

torch::nn::Linear full_linear(int64_t in, int64_t out, bool bias, uint64_t seed) {
  torch::nn::Linear lin(torch::nn::LinearOptions(in, out).bias(bias));
  FullLinear w = init_full_linear(in, out, bias, seed);
  torch::NoGradGuard no_grad;
  lin->weight.copy_(w.weight);
  if (bias) lin->bias.copy_(w.bias);
  return lin;
}

// ---- the communication functions --------------------------------------------------------

// x_r differs by rank; the forward value and the gradient that reaches x are worked out by hand.
TEST(TensorParallelMappings, ForwardAndConjugateBackward) {
  for (int world : {1, 2, 4}) {
    SCOPED_TRACE("T=" + std::to_string(world));
    run_ranks(world, [&](std::shared_ptr<comm::Group> g) {
      const int r = g->rank();
      const double rank_sum = world * (world - 1) / 2.0;  // sum of k over ranks
      const double weight_sum = rank_sum + world;         // sum of (k + 1)
      const at::Tensor base = at::arange(2 * 4 * 8, at::kFloat).view({2, 4, 8});  // [B, S, H]

      {  // copy: identity, backward sums the gradients
        at::Tensor x = (base + r).requires_grad_();
        at::Tensor y = copy_to_region(x, g);
        EXPECT_TRUE(at::equal(y, base + r));
        y.backward(base * (r + 1));
        EXPECT_TRUE(at::allclose(x.grad(), base * weight_sum));
      }
      {  // reduce: sum, backward identity
        at::Tensor x = (base + r).requires_grad_();
        at::Tensor y = reduce_from_region(x, g);
        EXPECT_TRUE(at::allclose(y, base * world + rank_sum));
        y.backward(base * (r + 1));
        EXPECT_TRUE(at::equal(x.grad(), base * (r + 1)));
      }
      {  // scatter (last dimension): own part, backward gathers
        at::Tensor x = base.clone().requires_grad_();
        at::Tensor y = scatter_to_region(x, g);
        EXPECT_TRUE(at::equal(y, part(base, -1, *g)));
        y.backward(at::full_like(y, r + 1));
        std::vector<at::Tensor> parts;
        for (int k = 0; k < world; ++k) parts.push_back(at::full_like(y, k + 1));
        EXPECT_TRUE(at::equal(x.grad(), at::cat(parts, -1)));
      }
      {  // gather (last dimension): concatenation, backward keeps own part
        at::Tensor x = part(base, -1, *g).clone().requires_grad_();
        at::Tensor y = gather_from_region(x, g);
        EXPECT_TRUE(at::equal(y, base));
        y.backward(base * (r + 1));
        EXPECT_TRUE(at::equal(x.grad(), part(base * (r + 1), -1, *g)));
      }
      for (int64_t dim : {1, 0}) {
        SCOPED_TRACE("sequence dim " + std::to_string(dim));
        const at::Tensor b = dim == 0 ? base.view({8, 8}) : base;  // dim 0: [S, H]
        {  // scatter to the sequence: own part, backward gathers
          at::Tensor x = b.clone().requires_grad_();
          at::Tensor y = scatter_to_sequence_region(x, g, dim);
          EXPECT_TRUE(at::equal(y, part(b, dim, *g)));
          y.backward(at::full_like(y, r + 1));
          std::vector<at::Tensor> parts;
          for (int k = 0; k < world; ++k) parts.push_back(at::full_like(y, k + 1));
          EXPECT_TRUE(at::equal(x.grad(), at::cat(parts, dim)));
        }
        for (bool grad_is_parallel : {true, false}) {  // gather the sequence
          at::Tensor x = part(b, dim, *g).clone().requires_grad_();
          at::Tensor y = gather_from_sequence_region(x, g, dim, grad_is_parallel);
          EXPECT_TRUE(at::equal(y, b));
          y.backward(b * (r + 1));
          // Partial gradients are summed then split; a full gradient is only split.
          const at::Tensor want = grad_is_parallel ? b * weight_sum : b * (r + 1);
          EXPECT_TRUE(at::allclose(x.grad(), part(want, dim, *g))) << grad_is_parallel;
        }
        {  // reduce-scatter: own part of the sum, backward gathers
          at::Tensor x = (b * (r + 1)).requires_grad_();
          at::Tensor y = reduce_scatter_to_sequence_region(x, g, dim);
          EXPECT_TRUE(at::allclose(y, part(b * weight_sum, dim, *g)));
          y.backward(at::full_like(y, r + 1));
          std::vector<at::Tensor> parts;
          for (int k = 0; k < world; ++k) parts.push_back(at::full_like(y, k + 1));
          EXPECT_TRUE(at::equal(x.grad(), at::cat(parts, dim)));
        }
      }
    });
  }
}

TEST(TensorParallelMappings, SequenceNotDivisibleNamesTheNumbers) {
  run_ranks(2, [&](std::shared_ptr<comm::Group> g) {
    const at::Tensor x = at::ones({2, 3, 4});  // sequence 3 on 2 ranks
    try {
      reduce_scatter_to_sequence_region(x, g, 1);
      ADD_FAILURE() << "no error";
    } catch (const std::invalid_argument& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find("= 3 is not divisible by the tensor-parallel size 2"), std::string::npos)
          << msg;
    }
  });
}

// ---- column -> row MLP ------------------------------------------------------------------

struct MlpCase {
  bool gather_output;  // the column layer gathers; the row layer then splits its input
  bool bias;
};

void check_mlp(int world, MlpCase c) {
  constexpr int64_t H = 8, F = 16, B = 2, S = 3;
  // The reference: two nn::Linear on the full weights.
  auto fc1 = full_linear(H, F, c.bias, 11);
  auto fc2 = full_linear(F, H, c.bias, 12);
  const at::Tensor x0 = randn({B, S, H}, 1);
  const at::Tensor probe = randn({B, S, H}, 2);  // loss = sum(y * probe): every output matters
  at::Tensor x_ref = x0.clone().requires_grad_();
  at::Tensor y_ref = fc2->forward(at::gelu(fc1->forward(x_ref)));
  (y_ref * probe).sum().backward();

  run_ranks(world, [&](std::shared_ptr<comm::Group> g) {
    const bool print = g->rank() == 0;
    ColumnParallelLinear col(
        g, ColumnParallelLinearOptions(H, F).bias(c.bias).gather_output(c.gather_output).seed(11));
    RowParallelLinear row(
        g,
        RowParallelLinearOptions(F, H).bias(c.bias).input_is_parallel(!c.gather_output).seed(12));
    at::Tensor x = x0.clone().requires_grad_();
    at::Tensor y = row->forward(at::gelu(col->forward(x)));
    (y * probe).sum().backward();

    expect_rel_close(y, y_ref, kTol, "output", print);
    expect_rel_close(x.grad(), x_ref.grad(), kTol, "input gradient", print);
    expect_rel_close(col->weight.grad(), part(fc1->weight.grad(), 0, *g), kTol,
                     "column weight gradient (own rows)", print);
    expect_rel_close(row->weight.grad(), part(fc2->weight.grad(), 1, *g), kTol,
                     "row weight gradient (own columns)", print);
    if (c.bias) {
      expect_rel_close(col->bias.grad(), part(fc1->bias.grad(), 0, *g), kTol,
                       "column bias gradient", print);
      expect_rel_close(row->bias.grad(), fc2->bias.grad(), kTol, "row bias gradient (whole)",
                       print);
    }
    // The shards put back together are the full weights they came from.
    EXPECT_TRUE(at::equal(col->gather_full().weight, fc1->weight));
    EXPECT_TRUE(at::equal(row->gather_full().weight, fc2->weight));
  });
}

TEST(TensorParallelLinear, ColumnThenRowEqualsFullMlp) {
  for (int world : {1, 2, 4}) {
    for (MlpCase c : {MlpCase{false, true}, MlpCase{true, true}, MlpCase{false, false}}) {
      SCOPED_TRACE("T=" + std::to_string(world) + " gather_output=" +
                   std::to_string(c.gather_output) + " bias=" + std::to_string(c.bias));
      std::printf("T=%d gather_output=%d bias=%d\n", world, c.gather_output, c.bias);
      check_mlp(world, c);
    }
  }
}

TEST(TensorParallelLinear, LoadFullTakesTheRanksShard) {
  run_ranks(2, [&](std::shared_ptr<comm::Group> g) {
    const at::Tensor w = at::arange(4 * 6, at::kFloat).view({4, 6});
    const at::Tensor b = at::arange(4, at::kFloat);
    ColumnParallelLinear col(g, 6, 4);
    col->load_full(w, b);
    EXPECT_TRUE(at::equal(col->weight, w.narrow(0, 2 * g->rank(), 2)));
    EXPECT_TRUE(at::equal(col->bias, b.narrow(0, 2 * g->rank(), 2)));
    RowParallelLinear row(g, 6, 4);
    row->load_full(w, b);
    EXPECT_TRUE(at::equal(row->weight, w.narrow(1, 3 * g->rank(), 3)));
    EXPECT_TRUE(at::equal(row->bias, b));
    EXPECT_THROW(row->load_full(w.t(), b), std::invalid_argument);
  });
}

TEST(TensorParallelLinear, IndivisibleSizesNameTheNumbers) {
  run_ranks(4, [&](std::shared_ptr<comm::Group> g) {
    auto message = [](auto make) -> std::string {
      try {
        make();
      } catch (const std::invalid_argument& e) {
        return e.what();
      }
      return "no error";
    };
    const std::string col = message([&] { ColumnParallelLinear(g, 8, 10); });
    EXPECT_NE(col.find("ColumnParallelLinear out_features = 10 is not divisible by the "
                       "tensor-parallel size 4"),
              std::string::npos)
        << col;
    const std::string row = message([&] { RowParallelLinear(g, 6, 8); });
    EXPECT_NE(row.find("RowParallelLinear in_features = 6"), std::string::npos) << row;
    const std::string emb = message([&] { VocabParallelEmbedding(g, 30, 8); });
    EXPECT_NE(emb.find("VocabParallelEmbedding vocab = 30 is not divisible by the "
                       "tensor-parallel size 4"),
              std::string::npos)
        << emb;
    const std::string sp = message(
        [&] { RowParallelLinear(g, RowParallelLinearOptions(8, 8).sequence_parallel(true)); });
    EXPECT_NE(sp.find("needs input_is_parallel"), std::string::npos) << sp;
  });
}

// ---- vocabulary-parallel embedding ------------------------------------------------------

TEST(TensorParallelEmbedding, EqualsFullEmbedding) {
  constexpr int64_t V = 16, D = 8;
  const at::Tensor table = init_full_embedding(V, D, 21);
  // Every id once (so every rank's part is used), then random ones, repeats included.
  const at::Tensor ids = at::cat({at::arange(V), randint(V, {8}, 3)}).view({2, 12});
  const at::Tensor probe = randn({2, 12, D}, 4);
  at::Tensor ref_w = table.clone().requires_grad_();
  at::Tensor ref = at::embedding(ref_w, ids);
  (ref * probe).sum().backward();

  for (int world : {1, 2, 4}) {
    SCOPED_TRACE("T=" + std::to_string(world));
    run_ranks(world, [&](std::shared_ptr<comm::Group> g) {
      VocabParallelEmbedding emb(g, VocabParallelEmbeddingOptions(V, D).seed(21));
      EXPECT_EQ(emb->vocab_start(), g->rank() * V / world);
      at::Tensor out = emb->forward(ids);
      (out * probe).sum().backward();
      expect_rel_close(out, ref, kTol, "embedding output", g->rank() == 0);
      expect_rel_close(emb->weight.grad(), part(ref_w.grad(), 0, *g), kTol,
                       "embedding weight gradient (own rows)", g->rank() == 0);
      EXPECT_TRUE(at::equal(emb->gather_full(), table));
      try {
        emb->forward(at::tensor(std::vector<int64_t>{3, V}));
        ADD_FAILURE() << "no error for an id past the vocabulary";
      } catch (const std::invalid_argument& e) {
        EXPECT_NE(std::string(e.what()).find("token id 16 outside the vocabulary [0, 16)"),
                  std::string::npos)
            << e.what();
      }
    });
  }
}

// ---- vocabulary-parallel cross-entropy --------------------------------------------------

// Every reduction against at::cross_entropy_loss with the same one on the full logits, on
// targets of which some are ignored (-100, supervised fine-tuning's masked prompt): the mean
// (the default, as torch's) divides by the tokens that are not ignored, never by every token.
TEST(TensorParallelCrossEntropy, EqualsCrossEntropyOnFullLogits) {
  constexpr int64_t V = 24, B = 3, S = 5;
  for (double scale : {1.0, 60.0}) {  // 60: exp() of unshifted logits would overflow fp32
    const at::Tensor logits = randn({B, S, V}, 5) * scale;
    at::Tensor target = randint(V, {B, S}, 6);
    // 6 of 15 ignored: a mean over every token would be 40 % too small.
    const std::initializer_list<std::pair<int, int>> ignored = {{0, 1}, {2, 4}, {1, 0},
                                                                {1, 1}, {1, 2}, {2, 0}};
    for (const auto& [b, s] : ignored) {
      target.index_put_({b, s}, -100);
    }
    for (const int64_t reduction :
         {at::Reduction::Mean, at::Reduction::Sum, at::Reduction::None}) {
      at::Tensor ref_logits = logits.clone().requires_grad_();
      const at::Tensor ref = at::cross_entropy_loss(ref_logits.view({-1, V}), target.view({-1}),
                                                    {}, reduction)
                                 .view(reduction == at::Reduction::None ? target.sizes()
                                                                        : at::IntArrayRef{});
      // A gradient that weighs each token differently: a per-token loss's gradient is checked
      // for every token, not only their sum's.
      const at::Tensor weights = randn(ref.sizes(), 7);
      (ref * weights).sum().backward();

      for (int world : {1, 2, 4}) {
        SCOPED_TRACE("T=" + std::to_string(world) + " scale=" + std::to_string(scale) +
                     " reduction=" + std::to_string(reduction));
        run_ranks(world, [&](std::shared_ptr<comm::Group> g) {
          at::Tensor shard = part(logits, -1, *g).clone().requires_grad_();
          const at::Tensor loss =
              reduction == at::Reduction::Mean
                  ? vocab_parallel_cross_entropy(shard, target, g)  // the default
                  : vocab_parallel_cross_entropy(shard, target, g, -100, reduction);
          ASSERT_EQ(loss.sizes(), ref.sizes());
          if (reduction == at::Reduction::None) EXPECT_EQ(loss[0][1].item<float>(), 0.0f);
          (loss * weights).sum().backward();
          const bool print = g->rank() == 0;
          expect_rel_close(loss, ref.detach(), kTol, "loss", print);
          expect_rel_close(shard.grad(), part(ref_logits.grad(), -1, *g), kTol,
                           "logits gradient (own vocabulary part)", print);
        });
      }
    }
  }
}

// Every target ignored (a batch of prompt only): torch's mean is NaN (0 / 0) and its gradient
// zero, and so is this one's, on every rank; the sum is 0.
TEST(TensorParallelCrossEntropy, EveryTargetIgnoredAsTorch) {
  constexpr int64_t V = 8;
  const at::Tensor logits = randn({2, 3, V}, 8);
  const at::Tensor target = at::full({2, 3}, -7, at::kLong);  // a custom ignore_index
  at::Tensor ref_logits = logits.clone().requires_grad_();
  const at::Tensor ref =
      at::cross_entropy_loss(ref_logits.view({-1, V}), target.view({-1}), {}, at::Reduction::Mean,
                             /*ignore_index=*/-7);
  ref.backward();
  ASSERT_TRUE(std::isnan(ref.item<double>()));
  ASSERT_EQ(ref_logits.grad().abs().sum().item<double>(), 0.0);
  run_ranks(2, [&](std::shared_ptr<comm::Group> g) {
    at::Tensor shard = part(logits, -1, *g).clone().requires_grad_();
    const at::Tensor mean = vocab_parallel_cross_entropy(shard, target, g, -7);
    mean.backward();
    EXPECT_TRUE(std::isnan(mean.item<double>()));
    ASSERT_TRUE(shard.grad().defined());
    EXPECT_EQ(shard.grad().abs().sum().item<double>(), 0.0);
    EXPECT_EQ(vocab_parallel_cross_entropy(shard, target, g, -7, at::Reduction::Sum).item<double>(),
              0.0);
  });
}

TEST(TensorParallelCrossEntropy, BadTargetsNameTheProblem) {
  run_ranks(2, [&](std::shared_ptr<comm::Group> g) {
    const at::Tensor shard = at::zeros({2, 3, 4});  // vocabulary 8
    EXPECT_THROW(vocab_parallel_cross_entropy(shard, at::zeros({2, 4}, at::kLong), g),
                 std::invalid_argument);
    try {
      vocab_parallel_cross_entropy(shard, at::full({2, 3}, 8, at::kLong), g);
      ADD_FAILURE() << "no error";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find("target id 8 is outside the vocabulary [0, 8)"),
                std::string::npos)
          << e.what();
    }
  });
}

// A bad batch on one rank only: that rank must not throw alone while its peers enter the
// forward's collective and wait for it until comm_timeout_s (20 s here). Every rank throws the
// same error, naming the rank and the id, at once.
TEST(TensorParallelBadInput, OneRanksBadIdsStopEveryRankAtOnce) {
  constexpr int64_t V = 16, D = 4;
  std::vector<std::string> messages(2);
  std::vector<double> seconds(2);
  auto expect_agreed = [&](const std::function<void(std::shared_ptr<comm::Group>, int)>& fn) {
    messages.assign(2, "");
    run_ranks(
        2,
        [&](std::shared_ptr<comm::Group> g) {
          const auto t0 = std::chrono::steady_clock::now();
          try {
            fn(g, g->rank());
            ADD_FAILURE() << "rank " << g->rank() << ": no error";
          } catch (const std::invalid_argument& e) {
            messages[g->rank()] = e.what();
          }
          seconds[g->rank()] =
              std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        },
        std::chrono::seconds(20));
    EXPECT_EQ(messages[0], messages[1]);
    for (int r = 0; r < 2; ++r) EXPECT_LT(seconds[r], 10.0) << "rank " << r << " waited";
    return messages[0];
  };
  std::string m = expect_agreed([&](std::shared_ptr<comm::Group> g, int r) {
    VocabParallelEmbedding emb(g, VocabParallelEmbeddingOptions(V, D).seed(3));
    emb->forward(at::tensor(std::vector<int64_t>{3, r == 1 ? V + 2 : 4}));
  });
  EXPECT_NE(m.find("token id 18 outside the vocabulary [0, 16) on tensor-parallel rank 1 of 2"),
            std::string::npos)
      << m;

  const at::Tensor shard = at::zeros({2, 3, 4});  // vocabulary 8
  m = expect_agreed([&](std::shared_ptr<comm::Group> g, int r) {
    vocab_parallel_cross_entropy(shard, at::full({2, 3}, r == 0 ? -5 : 1, at::kLong), g);
  });
  EXPECT_NE(m.find("target id -5 is outside the vocabulary [0, 8) and is not ignore_index -100, "
                   "on tensor-parallel rank 0 of 2"),
            std::string::npos)
      << m;
  m = expect_agreed([&](std::shared_ptr<comm::Group> g, int r) {
    vocab_parallel_cross_entropy(shard, at::zeros({2, r == 1 ? 4 : 3}, at::kLong), g);
  });
  EXPECT_NE(m.find("on tensor-parallel rank 1 of 2 (every rank of the group stops): target shape "
                   "[2, 4] must be the logits' shape [2, 3, 4]"),
            std::string::npos)
      << m;
}

// The checks off (check_ids, check_targets: data checked before, no collective or host read per
// call): valid input gives exactly the checked result; an id outside the vocabulary embeds to
// zeros and a target outside it gets Megatron-LM's masked loss (the target's shifted logit taken
// as 0: log sum exp minus the row's maximum), on
// every tensor-parallel size, T = 1 included: never an out-of-bounds read, never a throw.
TEST(TensorParallelBadInput, UncheckedInputsMaskWhatIsOutOfRange) {
  constexpr int64_t V = 16, D = 4;
  const at::Tensor logits = randn({2, 3, V}, 9);
  at::Tensor target = randint(V, {2, 3}, 10);
  const at::Tensor masked_loss = at::logsumexp(logits, -1) - logits.amax(-1);
  for (int world : {1, 2}) {
    SCOPED_TRACE("T=" + std::to_string(world));
    run_ranks(world, [&](std::shared_ptr<comm::Group> g) {
      VocabParallelEmbedding checked(g, VocabParallelEmbeddingOptions(V, D).seed(3));
      VocabParallelEmbedding unchecked(
          g, VocabParallelEmbeddingOptions(V, D).seed(3).check_ids(false));
      const at::Tensor ids = at::tensor(std::vector<int64_t>{3, 15, 0});
      EXPECT_TRUE(at::equal(unchecked->forward(ids), checked->forward(ids)));
      const at::Tensor out = unchecked->forward(at::tensor(std::vector<int64_t>{3, V + 2, -1}));
      EXPECT_TRUE(at::equal(out[0], checked->forward(ids)[0]));
      EXPECT_EQ(out[1].abs().sum().item<float>(), 0.0f);
      EXPECT_EQ(out[2].abs().sum().item<float>(), 0.0f);

      const at::Tensor shard = part(logits, -1, *g);
      const auto ce = [&](const at::Tensor& t, bool check) {
        return vocab_parallel_cross_entropy(shard, t, g, -100, at::Reduction::None, check);
      };
      EXPECT_TRUE(at::equal(ce(target, false), ce(target, true)));
      at::Tensor bad = target.clone();
      bad.index_put_({0, 1}, V + 5);
      const at::Tensor loss = ce(bad, false);
      EXPECT_NEAR(loss[0][1].item<float>(), masked_loss[0][1].item<float>(), 1e-5);
      EXPECT_TRUE(at::equal(loss[1], ce(target, true)[1]));
    });
  }
}

}  // namespace
}  // namespace zero::tensor_parallel
