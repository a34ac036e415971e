// A tensor-parallel form of the example GPT's decoder block (examples/gpt.*), Megatron's layout:
// the query/key/value projections column-parallel (each rank its heads, rows being head-major),
// the attention output row-parallel, SwiGLU's gate and up column-parallel, down row-parallel,
// the RMSNorms replicated; optionally sequence-parallel around them. Checked at T=2 and T=4
// against examples::Block, the same weights in one process: output and the gradients of the input
// and of every weight (each rank's shard against the same part) within 1e-6 relative, with
// grouped-query attention (kv heads split across ranks as well).
//
// The block lives in this test for now: examples link only the public zero target, and the
// tensor-parallel layers have no public header yet (they take the private comm::Group).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <ATen/CPUGeneratorImpl.h>

#include <map>
#include <string>

#include "comm/group.hpp"
#include "gpt.hpp"
#include "support/thread_group.hpp"
#include "support/tp_compare.hpp"
#include "zero/tensor_parallel/linear.hpp"
#include "zero/tensor_parallel/placement.hpp"
#include "zero/tensor_parallel/shard.hpp"

namespace zero::tensor_parallel {
namespace {

using testing::run_ranks;

constexpr double kTol = 1e-6;

class TpBlockImpl : public torch::nn::Module {
 public:
  TpBlockImpl(GroupPtr g, const examples::GptConfig& c, bool sp)
      : heads(divide(c.heads, g->size(), "heads")),
        kv_heads(divide(c.kv_heads_count(), g->size(), "kv_heads")),
        head_dim(c.head_dim()),
        sp(sp) {
    const int64_t kv_dim = c.kv_heads_count() * c.head_dim();
    auto column = [&](int64_t in, int64_t out) {
      return ColumnParallelLinear(
          g,
          ColumnParallelLinearOptions(in, out).bias(false).gather_output(false).sequence_parallel(
              sp));
    };
    auto row = [&](int64_t in, int64_t out) {
      return RowParallelLinear(
          g,
          RowParallelLinearOptions(in, out).bias(false).input_is_parallel(true).sequence_parallel(
              sp));
    };
    wq = register_module("wq", column(c.dim, c.dim));
    wk = register_module("wk", column(c.dim, kv_dim));
    wv = register_module("wv", column(c.dim, kv_dim));
    wo = register_module("wo", row(c.dim, c.dim));
    w_gate = register_module("w_gate", column(c.dim, c.ffn_dim()));
    w_up = register_module("w_up", column(c.dim, c.ffn_dim()));
    w_down = register_module("w_down", row(c.ffn_dim(), c.dim));
    attn_norm = register_module("attn_norm", examples::RMSNorm(c.dim, c.norm_eps));
    mlp_norm = register_module("mlp_norm", examples::RMSNorm(c.dim, c.norm_eps));
  }

  // x: [B, S, D], or under sequence parallelism this rank's [B, S / T, D]; cos/sin: [S, hd].
  at::Tensor forward(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
    auto h = attn_norm->forward(x);
    auto split = [&](const at::Tensor& t, int64_t n) {
      return t.view({t.size(0), t.size(1), n, head_dim}).transpose(1, 2);
    };
    // After the column layers the sequence is whole (gathered under SP) and the heads are this
    // rank's: query head j reads key/value head j / (heads / kv_heads) of the same rank.
    auto q = rope(split(wq->forward(h), heads), cos, sin);
    auto k = rope(split(wk->forward(h), kv_heads), cos, sin);
    auto v = split(wv->forward(h), kv_heads);
    if (kv_heads != heads) {
      k = k.repeat_interleave(heads / kv_heads, 1);
      v = v.repeat_interleave(heads / kv_heads, 1);
    }
    auto a = at::scaled_dot_product_attention(q, k, v, {}, 0.0, /*is_causal=*/true);
    auto out = x + wo->forward(a.transpose(1, 2).flatten(2));
    auto m = mlp_norm->forward(out);
    return out + w_down->forward(at::silu(w_gate->forward(m)) * w_up->forward(m));
  }

  void load_full(const examples::BlockImpl& full) {
    wq->load_full(full.wq->weight);
    wk->load_full(full.wk->weight);
    wv->load_full(full.wv->weight);
    w_gate->load_full(full.w_gate->weight);
    w_up->load_full(full.w_up->weight);
    wo->load_full(full.wo->weight);
    w_down->load_full(full.w_down->weight);
    torch::NoGradGuard no_grad;
    attn_norm->weight.copy_(full.attn_norm->weight);
    mlp_norm->weight.copy_(full.mlp_norm->weight);
  }

  int64_t heads, kv_heads, head_dim;
  bool sp;
  examples::RMSNorm attn_norm{nullptr}, mlp_norm{nullptr};
  ColumnParallelLinear wq{nullptr}, wk{nullptr}, wv{nullptr}, w_gate{nullptr}, w_up{nullptr};
  RowParallelLinear wo{nullptr}, w_down{nullptr};

 private:
  // examples/gpt.cpp's rotate-half RoPE.
  static at::Tensor rope(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
    const int64_t half = x.size(-1) / 2;
    auto rotated = at::cat({-x.narrow(-1, half, half), x.narrow(-1, 0, half)}, -1);
    return x * cos + rotated * sin;
  }
};
TORCH_MODULE(TpBlock);

TEST(TensorParallelGpt, BlockEqualsExampleBlock) {
  examples::GptConfig c;
  c.vocab = 32;
  c.dim = 32;
  c.layers = 1;
  c.heads = 8;
  c.kv_heads = 4;  // grouped-query: two query heads per key/value head
  c.ffn = 64;
  c.max_seq = 16;
  constexpr int64_t B = 2, S = 8;
  examples::Gpt gpt(c);
  auto* full = (*gpt->blocks)[0]->as<examples::BlockImpl>();
  {  // norms that are not all ones, so their gradients matter
    at::Generator gen = at::detail::createCPUGenerator(7);
    torch::NoGradGuard no_grad;
    full->attn_norm->weight.copy_(1 + 0.1 * at::randn({c.dim}, gen));
    full->mlp_norm->weight.copy_(1 + 0.1 * at::randn({c.dim}, gen));
  }
  const at::Tensor cos = gpt->rope_cos.narrow(0, 0, S);
  const at::Tensor sin = gpt->rope_sin.narrow(0, 0, S);
  at::Generator gen = at::detail::createCPUGenerator(8);
  const at::Tensor x0 = at::randn({B, S, c.dim}, gen);
  const at::Tensor probe = at::randn({B, S, c.dim}, gen);
  at::Tensor x_ref = x0.clone().requires_grad_();
  at::Tensor y_ref = full->forward(x_ref, cos, sin);
  (y_ref * probe).sum().backward();
  std::map<std::string, at::Tensor> grads;
  for (const auto& p : full->named_parameters()) grads[p.key()] = p.value().grad();

  for (int world : {2, 4}) {
    for (bool sp : {false, true}) {
      SCOPED_TRACE("T=" + std::to_string(world) + " sequence_parallel=" + std::to_string(sp));
      run_ranks(world, [&](std::shared_ptr<comm::Group> g) {
        const bool print = g->rank() == 0;
        if (print) std::printf("T=%d sequence_parallel=%d\n", world, sp);
        TpBlock block(g, c, sp);
        block->load_full(*full);
        auto part = [&](const at::Tensor& t, int64_t dim) {
          return t.chunk(g->size(), dim)[g->rank()];
        };
        at::Tensor x = (sp ? part(x0, 1) : x0).clone().requires_grad_();
        at::Tensor y = block->forward(x, cos, sin);
        (y * (sp ? part(probe, 1) : probe)).sum().backward();
        const auto params = placements(*block, sp);
        all_reduce_partial_grads(params, *g);

        testing::expect_rel_close(y, sp ? part(y_ref, 1) : y_ref, kTol, "block output", print);
        testing::expect_rel_close(x.grad(), sp ? part(x_ref.grad(), 1) : x_ref.grad(), kTol,
                                  "input gradient", print);
        ASSERT_EQ(params.size(), grads.size());
        for (const auto& p : params) {
          const at::Tensor& whole = grads.at(p.name);
          testing::expect_rel_close(
              p.param.grad(), p.placement.sharded ? part(whole, p.placement.partition_dim) : whole,
              kTol, "gradient of " + p.name, print);
        }
      });
    }
  }
}

TEST(TensorParallelGpt, HeadsNotDivisibleNameTheNumbers) {
  examples::GptConfig c;
  c.dim = 24;
  c.heads = 3;
  c.ffn = 48;
  run_ranks(2, [&](std::shared_ptr<comm::Group> g) {
    try {
      TpBlock(g, c, false);
      ADD_FAILURE() << "no error";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find("heads = 3 is not divisible by the tensor-parallel "
                                           "size 2"),
                std::string::npos)
          << e.what();
    }
  });
}

}  // namespace
}  // namespace zero::tensor_parallel
