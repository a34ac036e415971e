#include "zero/models/gpt.hpp"

#include <ATen/ATen.h>

#include <ATen/CPUGeneratorImpl.h>

#include <cmath>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "zero/host_counting.hpp"
#include "zero/models/rope.hpp"
#include "zero/sharding.hpp"

namespace zero::models {

RMSNormImpl::RMSNormImpl(int64_t dim, double eps) : eps(eps) {
  weight = register_parameter("weight", at::ones({dim}));
}

at::Tensor RMSNormImpl::forward(const at::Tensor& x) {
  // Normalise in fp32 even for bf16 activations: the mean of squares loses too much otherwise.
  auto xf = x.to(at::kFloat);
  auto y = xf * at::rsqrt(xf.square().mean({-1}, true) + eps);
  return y.to(x.scalar_type()) * weight;
}

namespace {

torch::nn::Linear linear(int64_t in, int64_t out, bool bias = false) {
  return torch::nn::Linear(torch::nn::LinearOptions(in, out).bias(bias));
}

// Rotates channel pairs (i, i + d/2) by position-dependent angles (the "rotate half" form).
at::Tensor apply_rope(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  const int64_t half = x.size(-1) / 2;
  auto x1 = x.narrow(-1, 0, half);
  auto x2 = x.narrow(-1, half, half);
  auto rotated = at::cat({-x2, x1}, -1);
  return x * cos + rotated * sin;
}

}  // namespace

BlockImpl::BlockImpl(const GptConfig& c) : heads(c.heads), kv_heads(c.kv_heads_count()) {
  const int64_t kv_dim = kv_heads * c.head_dim();
  // Registered in LlamaDecoderLayer's order (attention, MLP, then the two norms), so the
  // parameters flatten as transformers' do: DeepSpeed partitions the flat buffer in that order.
  wq = register_module("wq", linear(c.dim, c.dim, c.qkv_bias));
  wk = register_module("wk", linear(c.dim, kv_dim, c.qkv_bias));
  wv = register_module("wv", linear(c.dim, kv_dim, c.qkv_bias));
  wo = register_module("wo", linear(c.dim, c.dim, c.o_bias));
  w_gate = register_module("w_gate", linear(c.dim, c.ffn_dim()));
  w_up = register_module("w_up", linear(c.dim, c.ffn_dim()));
  w_down = register_module("w_down", linear(c.ffn_dim(), c.dim));
  attn_norm = register_module("attn_norm", RMSNorm(c.dim, c.norm_eps));
  mlp_norm = register_module("mlp_norm", RMSNorm(c.dim, c.norm_eps));
}

at::Tensor causal_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                            int64_t heads, int64_t kv_heads, int64_t head_dim,
                            const at::Tensor& cos, const at::Tensor& sin) {
  auto split = [&](const at::Tensor& t, int64_t n) {
    return t.view({t.size(0), t.size(1), n, head_dim}).transpose(1, 2);
  };
  auto qh = apply_rope(split(q, heads), cos, sin);
  auto kh = apply_rope(split(k, kv_heads), cos, sin);
  auto vh = split(v, kv_heads);
  if (kv_heads != heads) {
    // Grouped-query attention: query head i reads key/value head i / (heads / kv_heads).
    kh = kh.repeat_interleave(heads / kv_heads, 1);
    vh = vh.repeat_interleave(heads / kv_heads, 1);
  }
  return at::scaled_dot_product_attention(qh, kh, vh, {}, 0.0, /*is_causal=*/true)
      .transpose(1, 2)
      .flatten(2);
}

at::Tensor BlockImpl::forward(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  const int64_t hd = x.size(2) / heads;
  auto h = attn_norm->forward(x);
  // q, k, v in this order, each its own statement (function arguments are evaluated in an
  // unspecified order; GCC goes right to left): autograd sums h's gradient in the reverse order
  // of the projections' creation, v + k + q, as for transformers' LlamaAttention, and bf16
  // parity with DeepSpeed (bench/ds_parity.py) depends on that order bit for bit.
  const at::Tensor q = wq->forward(h);
  const at::Tensor k = wk->forward(h);
  const at::Tensor v = wv->forward(h);
  const at::Tensor a = causal_attention(q, k, v, heads, kv_heads, hd, cos, sin);
  auto out = x + wo->forward(a);
  auto m = mlp_norm->forward(out);
  return out + w_down->forward(at::silu(w_gate->forward(m)) * w_up->forward(m));
}

namespace {

// The GPT-2 style init of one parameter, as the constructor gives it: small normal weights,
// residual projections scaled by depth; norm weights 1, attention biases (Qwen2-shaped models) 0.
void init_parameter(const std::string& name, at::Tensor& p, int64_t layers,
                    const std::optional<at::Generator>& gen) {
  if (p.dim() < 2) {
    if (name.find(".bias") != std::string::npos) {
      p.zero_();
    } else {
      p.fill_(1.0);
    }
    return;
  }
  const double std = 0.02, resid = 0.02 / std::sqrt(2.0 * static_cast<double>(layers));
  const bool residual =
      name.find("wo.") != std::string::npos || name.find("w_down.") != std::string::npos;
  p.normal_(0.0, residual ? resid : std, gen);
}

}  // namespace

GptImpl::GptImpl(const GptConfig& c) : GptImpl(c, nullptr) {}

GptImpl::GptImpl(const GptConfig& c, const zero::Deferred& deferred) : GptImpl(c, &deferred) {}

GptImpl::GptImpl(const GptConfig& c, const zero::Deferred* deferred) : cfg(c) {
  if (c.dim % c.heads != 0 || (c.dim / c.heads) % 2 != 0) {
    throw std::invalid_argument("model dim must split into heads of an even size");
  }
  if (c.kv_heads < 0 || c.heads % c.kv_heads_count() != 0) {
    throw std::invalid_argument("kv_heads must divide heads");
  }
  // Deferred: each child's constructor draws as it would eagerly (the generator must pass
  // through the same states), then its parameters become placeholders before the next is built.
  const auto built = [deferred](torch::nn::Module& m) {
    if (deferred != nullptr) zero::defer_parameters(m, deferred->device);
  };
  embed = register_module("embed", torch::nn::Embedding(c.vocab, c.dim));
  built(*embed);
  blocks = register_module("blocks", torch::nn::ModuleList());
  for (int64_t i = 0; i < c.layers; ++i) {
    blocks->push_back(Block(c));
    built(*(*blocks)[i]);
  }
  norm = register_module("norm", RMSNorm(c.dim, c.norm_eps));
  built(*norm);
  if (!c.tied) {
    head = register_module("head", linear(c.dim, c.vocab));
    built(*head);
  }
  // At ZeRO stage 3 every module with parameters is a unit of its own, gathered around its
  // run_unit in forward (FSDP2's fully_shard on each block and on the embedding and head), so
  // nothing stays whole in the root but what stage3_param_persistence_threshold keeps (the
  // norms, at DeepSpeed's default). A tied head is the embedding's unit run a second time.
  // The marks change nothing below stage 3.
  zero::shard(*embed);
  for (const auto& b : *blocks) zero::shard(*b);
  zero::shard(*norm);
  if (head) zero::shard(*head);

  // HF Llama's RoPE formulas, op for op and in fp32 (not the exact angle in double): the
  // tables are then bit-identical to transformers' and so are the logits and gradients of a
  // model loaded from its weights (a last-bit difference here moved fp32 training off it).
  auto [cos, sin] = rope_tables(c);
  const c10::Device home = deferred != nullptr ? deferred->device : c10::Device(c10::kCPU);
  rope_cos = register_buffer("rope_cos", cos.to(home));
  rope_sin = register_buffer("rope_sin", sin.to(home));

  at::NoGradGuard g;
  if (deferred == nullptr) {
    for (auto& item : named_parameters()) init_parameter(item.key(), item.value(), c.layers, {});
    return;
  }
  init_generator_ = at::detail::getDefaultCPUGenerator().clone();
  // The same draws into scratch tensors, one at a time, so that the global generator ends where
  // the eager build leaves it (data order, dropout: whatever draws next sees the same stream).
  for (auto& item : named_parameters()) {
    at::Tensor scratch = at::empty(item.value().sizes());
    init_parameter(item.key(), scratch, c.layers, {});
  }
}

zero::InitialValues GptImpl::initial_values() const {
  TORCH_CHECK(init_generator_.defined(),
              "zero::models::Gpt::initial_values: the model was built eagerly (its weights are "
              "in its parameters); build it with zero::Deferred{device} to initialise it sharded");
  struct Draws {
    at::Generator gen;
    std::vector<std::pair<std::string, std::vector<int64_t>>> params;
    size_t next = 0;
    int64_t layers = 0;
    at::Tensor draw() {
      const auto& [name, shape] = params[next++];
      at::Tensor t = at::empty(shape);
      init_parameter(name, t, layers, gen);
      return t;
    }
  };
  auto d = std::make_shared<Draws>();
  d->gen = init_generator_.clone();
  d->layers = cfg.layers;
  for (const auto& item : named_parameters()) {
    d->params.emplace_back(item.key(), item.value().sizes().vec());
  }
  return [d](const std::string& name, at::IntArrayRef shape,
             const std::vector<zero::ParamPiece>& pieces) {
    at::NoGradGuard g;
    // Parameters nobody asks for (none, through zero::initialize) are drawn all the same: the
    // values after them depend on the generator passing through their draws.
    while (d->next < d->params.size() && d->params[d->next].first != name) d->draw();
    TORCH_CHECK(d->next < d->params.size(), "zero::models::Gpt: initial values asked for '", name,
                "', which is not a parameter of the model or was asked for out of registration "
                "order; a source serves one zero::initialize, in named_parameters() order");
    TORCH_CHECK(shape.vec() == d->params[d->next].second, "zero::models::Gpt: '", name,
                "' asked for with shape ", shape, ", the model's is ",
                at::IntArrayRef(d->params[d->next].second));
    const at::Tensor full = d->draw().reshape({-1});
    for (const zero::ParamPiece& piece : pieces) {
      piece.out.copy_(full.narrow(0, piece.begin, piece.out.numel()));
    }
  };
}

at::Tensor GptImpl::forward(const at::Tensor& tokens) {
  const int64_t T = tokens.size(1);
  if (T > cfg.max_seq) throw std::invalid_argument("sequence longer than the model's max_seq");
  auto x = zero::run_unit(
      *embed, [this](const at::Tensor& t) { return embed->forward(t); }, tokens);
  const auto dtype = x.scalar_type();
  auto cos = rope_cos.narrow(0, 0, T).to(dtype);
  auto sin = rope_sin.narrow(0, 0, T).to(dtype);
  zero::CheckpointOptions opts;
  opts.offload = offloader.get();
  x = run_blocks<BlockImpl>(blocks, x, cos, sin, checkpointing, opts);
  x = zero::run_unit(
      *norm, [this](const at::Tensor& t) { return norm->forward(t); }, x);
  if (head)
    return zero::run_unit(
        *head, [this](const at::Tensor& t) { return head->forward(t); }, x);
  // Tied: the embedding's unit again, gathered for the head (or still gathered, within
  // stage3_max_reuse_distance); its weight's two gradients meet in one accumulator, so the unit
  // is released, and reduced, once both are in.
  return zero::run_unit(
      *embed, [this](const at::Tensor& t) { return at::linear(t, embed->weight); }, x);
}

void apply_activation_checkpointing(Gpt& model, const CheckpointPolicy& policy) {
  if (policy.every < 1) throw std::invalid_argument("checkpoint every must be >= 1");
  model->checkpointing = policy;
  model->offloader = policy.enabled && policy.cpu_offload
                         ? std::make_unique<zero::ActivationOffloader>()
                         : nullptr;
}

at::Tensor GptImpl::loss(const at::Tensor& tokens, const at::Tensor& targets) {
  auto logits = forward(tokens);
  // On a CPU run that counts its storages, the output and the loss are counted apart from the
  // activations (what a peak is made of; nothing otherwise).
  if (zero::HostCountingAllocator::installed() && logits.is_cpu() && logits.has_storage()) {
    zero::HostCountingAllocator::retag(logits.storage().data(), zero::HostTag::kLogits);
  }
  const zero::HostCountingAllocator::Tag tag(zero::HostTag::kLogits);
  return at::cross_entropy_loss(logits.reshape({-1, logits.size(-1)}).to(at::kFloat),
                                targets.reshape({-1}));
}

}  // namespace zero::models
