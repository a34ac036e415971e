// The column-parallel products (with and without sequence parallelism) under autocast, the way a
// user's AMP step runs them: forward inside an autocast region, backward outside it. The
// reference is the unsharded model in one process: at::linear per product under the same
// autocast, plain autograd. Each rank's outputs and gradients must be the reference's shard of
// them, in the reference's dtypes, to bf16 accuracy.
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/autocast_mode.h>

#include <memory>
#include <string>
#include <vector>

#include "comm/group.hpp"
#include "support/thread_group.hpp"
#include "zero/tensor_parallel/column_parallel_linears.hpp"
#include "zero/tensor_parallel/sequence_parallel_linear.hpp"

namespace zero::testing {
namespace {

using tensor_parallel::column_parallel_linears;
using tensor_parallel::sequence_parallel_linears;

constexpr int64_t B = 2, S = 8, H = 16, O = 8;  // O: each product's output features, whole
constexpr int kProducts = 3;                    // q, k, v of one input

// A CPU bf16 autocast region on this thread (autocast state is thread-local: each rank thread
// opens its own). Leaving it clears the weight-cast cache, as Python's outermost autocast does.
class CpuAutocast {
 public:
  CpuAutocast() {
    at::autocast::set_autocast_dtype(at::kCPU, at::kBFloat16);
    at::autocast::set_autocast_enabled(at::kCPU, true);
    at::autocast::increment_nesting();
  }
  ~CpuAutocast() {
    at::autocast::set_autocast_enabled(at::kCPU, false);
    if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
  }
  CpuAutocast(const CpuAutocast&) = delete;
  CpuAutocast& operator=(const CpuAutocast&) = delete;
};

// Which products have a bias: every one, none, or some (the mixed case adds biases outside the
// custom function).
enum class Biases { All, None, Some };

struct Problem {
  at::Tensor x;                     // [B, S, H], whole
  std::vector<at::Tensor> w, b, dy;  // whole: [O, H], [O] or undefined, [B, S, O]
};

Problem make_problem(Biases biases) {
  at::Generator gen = at::detail::createCPUGenerator(11);
  Problem p;
  p.x = at::randn({B, S, H}, gen);
  for (int i = 0; i < kProducts; ++i) {
    p.w.push_back(at::randn({O, H}, gen) / 4);
    const bool has = biases == Biases::All || (biases == Biases::Some && i != 1);
    p.b.push_back(has ? at::randn({O}, gen) : at::Tensor());
    p.dy.push_back(at::randn({B, S, O}, gen) * (i + 1));
  }
  return p;
}

struct Result {
  std::vector<at::Tensor> out, dw, db;
  at::Tensor dx;
};

// Forward under autocast, backward after it: the loss sums y_i * dy_i, so dy_i is the output
// gradient. `linears` computes the products from (x, weights, biases).
template <typename Linears>
Result run(at::Tensor x, std::vector<at::Tensor> w, std::vector<at::Tensor> b,
           const std::vector<at::Tensor>& dy, Linears&& linears) {
  x = x.clone().requires_grad_();
  for (at::Tensor& t : w) t = t.clone().requires_grad_();
  for (at::Tensor& t : b)
    if (t.defined()) t = t.clone().requires_grad_();
  std::vector<at::Tensor> y;
  {
    CpuAutocast autocast;
    y = linears(x, w, b);
  }
  at::Tensor loss;
  for (size_t i = 0; i < y.size(); ++i) {
    const at::Tensor term = (y[i] * dy[i]).sum();
    loss = loss.defined() ? loss + term : term;
  }
  loss.backward();
  Result r;
  for (const at::Tensor& t : y) r.out.push_back(t.detach());
  r.dx = x.grad();
  for (size_t i = 0; i < w.size(); ++i) {
    r.dw.push_back(w[i].grad());
    r.db.push_back(b[i].defined() ? b[i].grad() : at::Tensor());
  }
  return r;
}

Result reference(const Problem& p) {
  return run(p.x, p.w, p.b, p.dy, [](const at::Tensor& x, auto& w, auto& b) {
    std::vector<at::Tensor> y;
    for (size_t i = 0; i < w.size(); ++i) y.push_back(at::linear(x, w[i], b[i]));
    return y;
  });
}

// `got` equals `want` in dtype and shape, and to bf16 accuracy relative to want's scale.
void expect_close(const at::Tensor& got, const at::Tensor& want, const std::string& what) {
  ASSERT_TRUE(got.defined()) << what;
  EXPECT_EQ(got.scalar_type(), want.scalar_type()) << what;
  ASSERT_EQ(got.sizes(), want.sizes()) << what;
  const double scale = want.to(at::kFloat).abs().max().item<double>();
  const double err = (got.to(at::kFloat) - want.to(at::kFloat)).abs().max().item<double>();
  EXPECT_LE(err, 2e-2 * scale) << what << ": max error " << err << " at scale " << scale;
}

// Column-parallel (whole input on every rank) or sequence-parallel (each rank a part of the
// sequence along dim 1): rank r holds rows r of each weight and bias and computes columns r of
// each output.
void check(int T, bool sp, Biases biases, const std::string& what) {
  const Problem p = make_problem(biases);
  const Result want = reference(p);
  ASSERT_EQ(want.out[0].scalar_type(), at::kBFloat16) << "autocast must matter for this test";
  run_ranks(T, [&](std::shared_ptr<comm::Group> g) {
    const int r = g->rank();
    auto shard = [&](const at::Tensor& t, int64_t dim) {
      return t.defined() ? t.chunk(T, dim)[r].contiguous() : at::Tensor();
    };
    std::vector<at::Tensor> w, b, dy;
    for (int i = 0; i < kProducts; ++i) {
      w.push_back(shard(p.w[i], 0));
      b.push_back(shard(p.b[i], 0));
      dy.push_back(shard(p.dy[i], -1));
    }
    const at::Tensor x = sp ? shard(p.x, 1) : p.x;
    const std::shared_ptr<zero::Group> group = g;
    const Result got = run(x, w, b, dy, [&](const at::Tensor& x, auto& w, auto& b) {
      return sp ? sequence_parallel_linears(w, b, x, group, 1)
                : column_parallel_linears(w, b, x, group);
    });
    const std::string at_rank = what + ", rank " + std::to_string(r);
    expect_close(got.dx, sp ? shard(want.dx, 1) : want.dx, at_rank + ": input gradient");
    for (int i = 0; i < kProducts; ++i) {
      const std::string product = at_rank + ", product " + std::to_string(i);
      expect_close(got.out[i], shard(want.out[i], -1), product + ": output");
      expect_close(got.dw[i], shard(want.dw[i], 0), product + ": weight gradient");
      if (want.db[i].defined()) expect_close(got.db[i], shard(want.db[i], 0), product + ": bias gradient");
    }
    EXPECT_FALSE(at::autocast::is_autocast_enabled(at::kCPU));
  });
}

TEST(TensorParallelAutocast, ColumnParallelMatchesUnshardedLinearUnderAutocast) {
  for (Biases biases : {Biases::All, Biases::None, Biases::Some})
    check(2, /*sp=*/false, biases, "biases " + std::to_string(static_cast<int>(biases)));
}

TEST(TensorParallelAutocast, SequenceParallelMatchesUnshardedLinearUnderAutocast) {
  for (Biases biases : {Biases::All, Biases::None, Biases::Some})
    check(2, /*sp=*/true, biases, "biases " + std::to_string(static_cast<int>(biases)));
}

}  // namespace
}  // namespace zero::testing
