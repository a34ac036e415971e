#include "support/tp_net.hpp"

#include <ATen/CPUGeneratorImpl.h>

#include "zero/tensor_parallel/cross_entropy.hpp"
#include "zero/tensor_parallel/init.hpp"

namespace zero::testing {

namespace tp = tensor_parallel;

namespace {

// Seeds of each layer's full initial weights, shared by both forms.
constexpr uint64_t kEmbSeed = 31, kFc1Seed = 32, kFc2Seed = 33, kHeadSeed = 34, kNormSeed = 35;

// Not the default ones and zeros, so that the norms' gradients carry information.
void init_norm(torch::nn::LayerNorm& norm, int64_t hidden, uint64_t seed) {
  at::Generator gen = at::detail::createCPUGenerator(seed);
  torch::NoGradGuard no_grad;
  norm->weight.copy_(1 + 0.1 * at::randn({hidden}, gen));
  norm->bias.copy_(0.1 * at::randn({hidden}, gen));
}

}  // namespace

TpNetImpl::TpNetImpl(std::shared_ptr<comm::Group> g, bool sp, TpNetShape s) : group(g) {
  const int64_t V = s.vocab, H = s.hidden, F = s.ffn;
  emb = register_module(
      "emb", tp::VocabParallelEmbedding(
                 g, tp::VocabParallelEmbeddingOptions(V, H).sequence_parallel(sp).seed(kEmbSeed)));
  norm1 = register_module("norm1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({H})));
  fc1 = register_module(
      "fc1",
      tp::ColumnParallelLinear(
          g, tp::ColumnParallelLinearOptions(H, F).gather_output(false).sequence_parallel(sp).seed(
                 kFc1Seed)));
  fc2 = register_module(
      "fc2",
      tp::RowParallelLinear(
          g, tp::RowParallelLinearOptions(F, H).input_is_parallel(true).sequence_parallel(sp).seed(
                 kFc2Seed)));
  norm2 = register_module("norm2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({H})));
  head = register_module("head", tp::ColumnParallelLinear(g, tp::ColumnParallelLinearOptions(H, V)
                                                                 .bias(false)
                                                                 .gather_output(false)
                                                                 .sequence_parallel(sp)
                                                                 .seed(kHeadSeed)));
  init_norm(norm1, H, kNormSeed);
  init_norm(norm2, H, kNormSeed + 1);
}

at::Tensor TpNetImpl::forward(const at::Tensor& ids, const at::Tensor& target) {
  at::Tensor x = emb->forward(ids);  // sequence parallel: [B, S / T, H]
  x = x + fc2->forward(at::gelu(fc1->forward(norm1->forward(x))));
  at::Tensor logits = head->forward(norm2->forward(x));  // [B, S, V / T]
  return tp::vocab_parallel_cross_entropy(logits, target, group, -100, at::Reduction::None);
}

FullNetImpl::FullNetImpl(TpNetShape s) {
  const int64_t V = s.vocab, H = s.hidden, F = s.ffn;
  auto linear = [](int64_t in, int64_t out, bool bias, uint64_t seed) {
    torch::nn::Linear lin(torch::nn::LinearOptions(in, out).bias(bias));
    tp::FullLinear w = tp::init_full_linear(in, out, bias, seed);
    torch::NoGradGuard no_grad;
    lin->weight.copy_(w.weight);
    if (bias) lin->bias.copy_(w.bias);
    return lin;
  };
  emb = register_module("emb", torch::nn::Embedding(V, H));
  {
    torch::NoGradGuard no_grad;
    emb->weight.copy_(tp::init_full_embedding(V, H, kEmbSeed));
  }
  norm1 = register_module("norm1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({H})));
  fc1 = register_module("fc1", linear(H, F, true, kFc1Seed));
  fc2 = register_module("fc2", linear(F, H, true, kFc2Seed));
  norm2 = register_module("norm2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({H})));
  head = register_module("head", linear(H, V, false, kHeadSeed));
  init_norm(norm1, H, kNormSeed);
  init_norm(norm2, H, kNormSeed + 1);
}

at::Tensor FullNetImpl::forward(const at::Tensor& ids, const at::Tensor& target) {
  at::Tensor x = emb->forward(ids);
  x = x + fc2->forward(at::gelu(fc1->forward(norm1->forward(x))));
  at::Tensor logits = head->forward(norm2->forward(x));
  return at::cross_entropy_loss(logits.reshape({-1, logits.size(-1)}), target.reshape({-1}));
}

}  // namespace zero::testing
