#include "zero/models/tp_gpt.hpp"

#include <ATen/ATen.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/utils.h>

#include <cmath>
#include <map>
#include <stdexcept>

#include "zero/models/rope.hpp"

namespace zero::models {

namespace tp = zero::tensor_parallel;
using tp::NamedPlacement;

namespace {

void require_divisible(int64_t total, int tp_size, const std::string& what) {
  if (total % tp_size != 0) {
    throw std::invalid_argument(
        "zero: the model's " + what + " = " + std::to_string(total) +
        " is not divisible by the tensor-parallel size tensor_parallel.autotp_size = " +
        std::to_string(tp_size) + " (each rank holds an equal part); choose a size that divides " +
        std::to_string(total));
  }
}

}  // namespace

void check_tensor_parallel_shape(const GptConfig& c, int tp_size) {
  if (tp_size < 1) {
    throw std::invalid_argument("zero: tensor_parallel.autotp_size = " + std::to_string(tp_size) +
                                " must be >= 1");
  }
  require_divisible(c.heads, tp_size, "attention heads (heads)");
  require_divisible(c.kv_heads_count(), tp_size, "key/value heads (kv_heads)");
  require_divisible(c.ffn_dim(), tp_size, "MLP width (ffn)");
  require_divisible(c.vocab, tp_size, "vocabulary (vocab)");
}

TpBlockImpl::TpBlockImpl(tp::GroupPtr g, const GptConfig& c, bool sp)
    : heads(c.heads / g->size()), kv_heads(c.kv_heads_count() / g->size()), head_dim(c.head_dim()) {
  check_tensor_parallel_shape(c, g->size());
  const int64_t kv_dim = c.kv_heads_count() * c.head_dim();
  // Column rows are head-major (head h's rows are [h * hd, (h + 1) * hd)), so rank r's
  // contiguous part of them is its heads.
  auto column = [&](int64_t in, int64_t out, bool bias) {
    return tp::ColumnParallelLinear(
        g,
        tp::ColumnParallelLinearOptions(in, out).bias(bias).gather_output(false).sequence_parallel(
            sp));
  };
  auto row = [&](int64_t in, int64_t out, bool bias) {
    return tp::RowParallelLinear(
        g,
        tp::RowParallelLinearOptions(in, out).bias(bias).input_is_parallel(true).sequence_parallel(
            sp));
  };
  // gpt.cpp's registration order, so named_parameters() lists the same names in the same order.
  wq = register_module("wq", column(c.dim, c.dim, c.qkv_bias));
  wk = register_module("wk", column(c.dim, kv_dim, c.qkv_bias));
  wv = register_module("wv", column(c.dim, kv_dim, c.qkv_bias));
  wo = register_module("wo", row(c.dim, c.dim, c.o_bias));
  w_gate = register_module("w_gate", column(c.dim, c.ffn_dim(), false));
  w_up = register_module("w_up", column(c.dim, c.ffn_dim(), false));
  w_down = register_module("w_down", row(c.ffn_dim(), c.dim, false));
  attn_norm = register_module("attn_norm", RMSNorm(c.dim, c.norm_eps));
  mlp_norm = register_module("mlp_norm", RMSNorm(c.dim, c.norm_eps));
}

tp::SequenceShare TpBlockImpl::sequence_share(const std::string& name) const {
  const bool norm = name.rfind("attn_norm.", 0) == 0 || name.rfind("mlp_norm.", 0) == 0;
  return norm ? tp::SequenceShare::kPartial : tp::SequenceShare::kUnsaid;
}

at::Tensor TpBlockImpl::forward(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  // Each sub-block's input enters the tensor-parallel region once, shared by its column layers,
  // as Megatron's fused linear_qkv and linear_fc1 do: one all-reduce of its gradient in
  // backward (under SP one all-gather forward; backward one reduce-scatter and one re-gather,
  // keeping only the sequence shard in between) instead of one per
  // projection (q, k, v: 3; gate, up: 2), which sent 7 all-reduces of b·s·h per block and step
  // instead of Megatron's 4 (tests/test_tensor_parallel_comm.cpp counts them).
  // After entering, the sequence is whole (all-gathered under SP) and the heads are this
  // rank's: its query head j reads its key/value head j / (heads / kv_heads), as in the full
  // model, since both are split into the same number of contiguous groups.
  const auto qkv = tp::column_parallel_products(attn_norm->forward(x), {wq, wk, wv});
  const at::Tensor &q = qkv[0], &k = qkv[1], &v = qkv[2];
  const at::Tensor a = causal_attention(q, k, v, heads, kv_heads, head_dim, cos, sin);
  auto out = x + wo->forward(a);
  const auto gate_up = tp::column_parallel_products(mlp_norm->forward(out), {w_gate, w_up});
  return out + w_down->forward(at::silu(gate_up[0]) * gate_up[1]);
}

TpGptImpl::TpGptImpl(tp::GroupPtr g, const GptConfig& c, bool sp)
    : TpGptImpl(std::move(g), c, sp, nullptr) {}

TpGptImpl::TpGptImpl(tp::GroupPtr g, const GptConfig& c, bool sp, const zero::Deferred& deferred)
    : TpGptImpl(std::move(g), c, sp, &deferred) {}

TpGptImpl::TpGptImpl(tp::GroupPtr g, const GptConfig& c, bool sp, const zero::Deferred* deferred)
    : cfg(c), group(std::move(g)), sequence_parallel(sp) {
  TORCH_CHECK(group, "zero: TpGpt needs the tensor-parallel process group");
  if (c.dim % c.heads != 0 || (c.dim / c.heads) % 2 != 0) {
    throw std::invalid_argument("model dim must split into heads of an even size");
  }
  if (c.kv_heads < 0 || c.heads % c.kv_heads_count() != 0) {
    throw std::invalid_argument("kv_heads must divide heads");
  }
  check_tensor_parallel_shape(c, group->size());
  // Deferred: a child's constructor draws as it would eagerly, then its parameters become
  // placeholders before the next is built (GptImpl's rule): one block's part held at a time.
  const auto built = [deferred](torch::nn::Module& m) {
    if (deferred != nullptr) zero::defer_parameters(m, deferred->device);
  };
  embed = register_module(
      "embed", tp::VocabParallelEmbedding(
                   group, tp::VocabParallelEmbeddingOptions(c.vocab, c.dim).sequence_parallel(sp)));
  built(*embed);
  blocks = register_module("blocks", torch::nn::ModuleList());
  for (int64_t i = 0; i < c.layers; ++i) {
    blocks->push_back(TpBlock(group, c, sp));
    built(*(*blocks)[i]);
  }
  norm = register_module("norm", RMSNorm(c.dim, c.norm_eps));
  built(*norm);
  if (!c.tied) {
    head = register_module(
        "head", tp::ColumnParallelLinear(group, tp::ColumnParallelLinearOptions(c.dim, c.vocab)
                                                    .bias(false)
                                                    .gather_output(false)
                                                    .sequence_parallel(sp)));
    built(*head);
  }
  // As Gpt's: the embedding, each block, the final norm and the head a unit of its own at ZeRO
  // stage 3, holding the data-parallel shard of this tensor-parallel rank's part; a tied head
  // runs the embedding's unit again. Nothing changes below stage 3.
  zero::shard(*embed);
  for (const auto& b : *blocks) zero::shard(*b);
  zero::shard(*norm);
  if (head) zero::shard(*head);
  auto [cos, sin] = rope_tables(c);
  const c10::Device home = deferred != nullptr ? deferred->device : c10::Device(c10::kCPU);
  rope_cos = register_buffer("rope_cos", cos.to(home));
  rope_sin = register_buffer("rope_sin", sin.to(home));
}

at::Tensor TpGptImpl::forward(const at::Tensor& tokens) {
  const int64_t S = tokens.size(1);
  if (S > cfg.max_seq) throw std::invalid_argument("sequence longer than the model's max_seq");
  if (sequence_parallel && S % group->size() != 0) {
    throw std::invalid_argument("zero: sequence parallelism splits the sequence over the " +
                                std::to_string(group->size()) +
                                " tensor-parallel ranks: seq_len = " + std::to_string(S) +
                                " must be a multiple of " + std::to_string(group->size()));
  }
  // [B, S, D], or [B, S / T, D] under SP
  auto x = zero::run_unit(
      *embed, [this](const at::Tensor& t) { return embed->forward(t); }, tokens);
  const auto dtype = x.scalar_type();
  auto cos = rope_cos.narrow(0, 0, S).to(dtype);
  auto sin = rope_sin.narrow(0, 0, S).to(dtype);
  zero::CheckpointOptions opts;
  x = run_blocks<TpBlockImpl>(blocks, x, cos, sin, checkpointing, opts);
  x = zero::run_unit(
      *norm, [this](const at::Tensor& t) { return norm->forward(t); }, x);
  if (head)
    return zero::run_unit(
        *head, [this](const at::Tensor& t) { return head->forward(t); }, x);
  // Tied: the embedding's vocabulary shard is this rank's part of the head (Megatron's
  // parallel_lm_logits), run as the embedding's unit again. The input enters the region:
  // all-gathered along the sequence under SP (backward reduce-scatters the partial gradients),
  // otherwise copied (backward all-reduces).
  return zero::run_unit(
      *embed,
      [this](const at::Tensor& t) {
        const at::Tensor in = sequence_parallel
                                  ? tp::gather_from_sequence_region(t, group, /*dim=*/1)
                                  : tp::copy_to_region(t, group);
        return at::linear(in, embed->weight);
      },
      x);
}

at::Tensor TpGptImpl::loss(const at::Tensor& tokens, const at::Tensor& targets) {
  // The mean over the targets that are not -100, as Gpt::loss (at::cross_entropy_loss).
  return tp::vocab_parallel_cross_entropy(forward(tokens), targets, group, -100,
                                          at::Reduction::Mean, check_inputs_);
}

void TpGptImpl::set_check_inputs(bool on) {
  check_inputs_ = on;
  embed->set_check_ids(on);
}

tp::SequenceShare TpGptImpl::sequence_share(const std::string& name) const {
  // The final norm runs before the head gathers the sequence.
  return name.rfind("norm.", 0) == 0 ? tp::SequenceShare::kPartial : tp::SequenceShare::kUnsaid;
}

std::vector<tp::NamedPlacement> TpGptImpl::placements() const {
  return tp::placements(*this, sequence_parallel);
}

void TpGptImpl::load_full(const GptImpl& full) {
  std::map<std::string, at::Tensor> by_name;
  for (const auto& p : full.named_parameters()) by_name[p.key()] = p.value().detach();
  tp::load_full(
      placements(),
      [&](const std::string& name) {
        auto it = by_name.find(name);
        return it == by_name.end() ? at::Tensor() : it->second;
      },
      *group);
}

std::vector<std::pair<std::string, at::Tensor>> TpGptImpl::gather_full() const {
  return tp::gather_full(placements(), *group);
}

namespace {

// GptImpl's draws, in its order, from `gen`: first what its submodules' constructors draw
// (overwritten there, but the generator moves past them), then each parameter's full tensor.
class LikeGptDraws {
 public:
  LikeGptDraws(const TpGptImpl& model, at::Generator gen)
      : cfg_(model.cfg), tp_(model.group->size()), gen_(std::move(gen)) {
    const GptConfig& c = cfg_;
    const int64_t kv_dim = c.kv_heads_count() * c.head_dim();
    torch::NoGradGuard no_grad;
    // nn::Embedding's normal_, each nn::Linear's kaiming_uniform_(a = sqrt(5)) =
    // U(-1/sqrt(in), 1/sqrt(in)) and its bias's uniform_.
    auto linear_draws = [&](int64_t in, int64_t out, bool bias) {
      const double bound = 1.0 / std::sqrt(static_cast<double>(in));
      at::empty({out, in}, f32_).uniform_(-bound, bound, gen_);
      if (bias) at::empty({out}, f32_).uniform_(-bound, bound, gen_);
    };
    at::empty({c.vocab, c.dim}, f32_).normal_(0.0, 1.0, gen_);
    for (int64_t i = 0; i < c.layers; ++i) {
      linear_draws(c.dim, c.dim, c.qkv_bias);
      linear_draws(c.dim, kv_dim, c.qkv_bias);
      linear_draws(c.dim, kv_dim, c.qkv_bias);
      linear_draws(c.dim, c.dim, c.o_bias);
      linear_draws(c.dim, c.ffn_dim(), false);
      linear_draws(c.dim, c.ffn_dim(), false);
      linear_draws(c.ffn_dim(), c.dim, false);
    }
    if (!c.tied) linear_draws(c.dim, c.vocab, false);
  }

  // GptImpl's own init of the parameter `p` (named_parameters order, the same names here):
  // matrices ~ N(0, 0.02), residual projections scaled by depth; norms 1, biases 0. Full shape.
  at::Tensor full(const NamedPlacement& p) {
    torch::NoGradGuard no_grad;
    std::vector<int64_t> shape = p.param.sizes().vec();
    if (p.placement.sharded) shape[p.placement.partition_dim] *= tp_;
    if (shape.size() < 2) {
      return p.name.find(".bias") != std::string::npos ? at::zeros(shape, f32_)
                                                       : at::ones(shape, f32_);
    }
    const double std = 0.02, resid = 0.02 / std::sqrt(2.0 * cfg_.layers);
    const bool residual =
        p.name.find("wo.") != std::string::npos || p.name.find("w_down.") != std::string::npos;
    return at::empty(shape, f32_).normal_(0.0, residual ? resid : std, gen_);
  }

 private:
  GptConfig cfg_;
  int tp_;
  at::Generator gen_;
  at::TensorOptions f32_ = at::TensorOptions().dtype(at::kFloat);
};

}  // namespace

void init_like_gpt(TpGptImpl& model, at::Generator gen) {
  LikeGptDraws draws(model, std::move(gen));
  const auto params = model.placements();
  tensor_parallel::load_full(
      params,
      [&](const std::string& name) {
        for (const auto& q : params) {
          if (q.name == name) return draws.full(q);
        }
        return at::Tensor();
      },
      *model.group);
}

zero::InitialValues initial_values_like_gpt(const TpGptImpl& model, at::Generator gen) {
  struct Source {
    LikeGptDraws draws;
    std::vector<NamedPlacement> params;
    size_t next = 0;
    int rank = 0;
  };
  auto s = std::make_shared<Source>(
      Source{LikeGptDraws(model, gen.clone()), model.placements(), 0, model.group->rank()});
  return [s](const std::string& name, at::IntArrayRef shape,
             const std::vector<zero::ParamPiece>& pieces) {
    at::NoGradGuard g;
    // Every parameter is drawn in turn, asked for or not: the later draws depend on it.
    while (s->next < s->params.size() && s->params[s->next].name != name) {
      s->draws.full(s->params[s->next++]);
    }
    TORCH_CHECK(s->next < s->params.size(), "zero::models::TpGpt: initial values asked for '", name,
                "', which is not a parameter of the model or was asked for out of "
                "registration order; a source serves one zero::initialize, in named_parameters() "
                "order");
    const NamedPlacement& p = s->params[s->next++];
    TORCH_CHECK(shape == p.param.sizes(), "zero::models::TpGpt: '", name, "' asked for with shape ",
                shape, ", this rank's part is ", p.param.sizes());
    const at::Tensor whole = s->draws.full(p);
    // tensor_parallel::load_full's part: equal blocks along the partition dimension, in rank
    // order (shard_of).
    const int64_t dim = p.placement.partition_dim, n = p.param.size(dim < 0 ? 0 : dim);
    const at::Tensor part = (p.placement.sharded ? whole.narrow(dim, s->rank * n, n) : whole)
                                .contiguous()
                                .reshape({-1});
    for (const zero::ParamPiece& piece : pieces) {
      piece.out.copy_(part.narrow(0, piece.begin, piece.out.numel()));
    }
  };
}

}  // namespace zero::models
