// A tensor-parallel form of the example GPT's decoder block (examples/gpt.*), Megatron's layout:
// the query/key/value projections column-parallel (each rank its heads, rows being head-major),
// the attention output row-parallel, SwiGLU's gate and up column-parallel, down row-parallel,
// the RMSNorms replicated; optionally sequence-parallel around them. Checked at T=2 and T=4
// against models::Block, the same weights in one process: output and the gradients of the input
// and of every weight (each rank's shard against the same part) within 1e-6 relative, with
// grouped-query attention (kv heads split across ranks as well).
//
// And the whole model, models::TpGpt (tiny preset, T = 2 and 4, with and without sequence
// parallelism, tied and untied head) against models::Gpt with the same weights: the loss and
// every gathered gradient within 1e-5 relative.
#include <gtest/gtest.h>
#include <torch/utils.h>

#include <ATen/CPUGeneratorImpl.h>

#include <map>
#include <string>

#include "comm/group.hpp"
#include "support/thread_group.hpp"
#include "support/tp_compare.hpp"
#include "zero/models/gpt.hpp"
#include "zero/models/tp_gpt.hpp"
#include "zero/tensor_parallel.hpp"

namespace zero::tensor_parallel {
namespace {

using models::BlockImpl;
using models::TpBlock;
using models::TpBlockImpl;

using testing::run_ranks;

constexpr double kTol = 1e-6;

// models::TpBlock with the weights of a plain models::Block.
void load_block(TpBlockImpl& block, const BlockImpl& full, bool sp) {
  std::map<std::string, at::Tensor> by_name;
  for (const auto& p : full.named_parameters()) by_name[p.key()] = p.value().detach();
  load_full(
      placements(block, sp), [&](const std::string& n) { return by_name.at(n); },
      *block.wq->group());
}

TEST(TensorParallelGpt, BlockEqualsExampleBlock) {
  models::GptConfig c;
  c.vocab = 32;
  c.dim = 32;
  c.layers = 1;
  c.heads = 8;
  c.kv_heads = 4;  // grouped-query: two query heads per key/value head
  c.ffn = 64;
  c.max_seq = 16;
  constexpr int64_t B = 2, S = 8;
  models::Gpt gpt(c);
  auto* full = (*gpt->blocks)[0]->as<models::BlockImpl>();
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
        load_block(*block, *full, sp);
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
  models::GptConfig c;
  c.dim = 24;
  c.heads = 3;
  c.ffn = 48;
  run_ranks(2, [&](std::shared_ptr<comm::Group> g) {
    try {
      TpBlock(g, c, false);
      ADD_FAILURE() << "no error";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find("heads (heads) = 3 is not divisible by the "
                                           "tensor-parallel size tensor_parallel.autotp_size = 2"),
                std::string::npos)
          << e.what();
    }
  });
}

// The whole model: TpGpt holding a plain Gpt's weights computes the same loss and, gathered,
// the same gradients.
class TensorParallelGptModel : public ::testing::TestWithParam<std::tuple<int, bool, bool>> {};

TEST_P(TensorParallelGptModel, LossAndGradientsEqualPlainGpt) {
  const auto [world, sp, tied] = GetParam();
  models::GptConfig c = models::gpt_preset("tiny");
  c.tied = tied;
  constexpr int64_t B = 2, S = 8;
  models::Gpt gpt(c);
  at::Generator gen = at::detail::createCPUGenerator(11);
  {  // norms that are not all ones, so their gradients matter
    torch::NoGradGuard no_grad;
    for (auto& p : gpt->named_parameters()) {
      if (p.key().find("norm") != std::string::npos)
        p.value().copy_(1 + 0.1 * at::randn({c.dim}, gen));
    }
  }
  const at::Tensor tokens = at::randint(c.vocab, {B, S}, gen);
  const at::Tensor targets = at::randint(c.vocab, {B, S}, gen);
  const at::Tensor loss_ref = gpt->loss(tokens, targets);
  loss_ref.backward();
  std::map<std::string, at::Tensor> grads;
  for (const auto& p : gpt->named_parameters()) grads[p.key()] = p.value().grad();

  run_ranks(world, [&](std::shared_ptr<comm::Group> g) {
    const bool print = g->rank() == 0;
    models::TpGpt model(g, c, sp);
    model->load_full(*gpt);
    const at::Tensor loss = model->loss(tokens, targets);
    loss.backward();
    const auto params = model->placements();
    all_reduce_partial_grads(params, *g);
    if (print) {
      std::printf("T=%d sp=%d tied=%d loss %.8f reference %.8f\n", world, sp, tied,
                  loss.item<double>(), loss_ref.item<double>());
    }
    EXPECT_NEAR(loss.item<double>(), loss_ref.item<double>(), 1e-6 * loss_ref.item<double>());
    // Gathered to full shapes by name: every parameter of the plain model, each once.
    std::vector<NamedPlacement> with_grads;
    for (const auto& p : params) {
      with_grads.push_back({p.name, p.param.grad(), p.placement});
    }
    const auto full_grads = gather_full(with_grads, *g);
    ASSERT_EQ(full_grads.size(), grads.size());
    for (const auto& [name, grad] : full_grads) {
      testing::expect_rel_close(grad, grads.at(name), 1e-5, "gradient of " + name, print);
    }
  });
}

INSTANTIATE_TEST_SUITE_P(Layouts, TensorParallelGptModel,
                         ::testing::Combine(::testing::Values(2, 4), ::testing::Bool(),
                                            ::testing::Bool()),
                         [](const auto& info) {
                           return "T" + std::to_string(std::get<0>(info.param)) +
                                  (std::get<1>(info.param) ? "_sequence_parallel" : "") +
                                  (std::get<2>(info.param) ? "_tied" : "_untied");
                         });

// init_like_gpt draws, shard by shard, exactly the weights the plain Gpt's constructor draws
// from a generator in the same state (zero-train's tp T starts where tp 1 does).
TEST(TensorParallelGpt, InitLikeGptDrawsThePlainGptsWeights) {
  for (bool variant : {false, true}) {
    models::GptConfig c = models::gpt_preset("tiny");
    c.tied = !variant;  // untied, with q/k/v and o biases, grouped-query attention
    c.qkv_bias = c.o_bias = variant;
    c.kv_heads = variant ? 2 : 0;
    // The default generator's state as the plain constructor finds it: each rank thread replays
    // it on a generator of its own (never the shared global one).
    const at::Generator before = at::detail::getDefaultCPUGenerator().clone();
    models::Gpt gpt(c);
    std::map<std::string, at::Tensor> want;
    for (const auto& p : gpt->named_parameters()) want[p.key()] = p.value().detach();
    run_ranks(2, [&](std::shared_ptr<comm::Group> g) {
      models::TpGpt model(g, c);
      models::init_like_gpt(*model, before.clone());
      const auto full = model->gather_full();
      ASSERT_EQ(full.size(), want.size());
      for (const auto& [name, value] : full) {
        EXPECT_TRUE(at::equal(value, want.at(name))) << name << " variant " << variant;
      }
    });
  }
}

TEST(TensorParallelGpt, VocabularyNotDivisibleNamesTheNumbers) {
  models::GptConfig c = models::gpt_preset("tiny");
  c.vocab = 255;
  try {
    models::check_tensor_parallel_shape(c, 2);
    ADD_FAILURE() << "no error";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("vocabulary (vocab) = 255 is not divisible"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace zero::tensor_parallel
