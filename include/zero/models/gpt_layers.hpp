// The GPT (gpt.hpp) as a pipeline's list of layers (include/zero/pipeline.hpp): the embedding, each
// block, then the final norm with the head; the loss (gpt_loss) on the last stage. The layers
// share the model's modules, so training them trains the model's parameters. A tied head names
// the embedding's weight under the key "embed" in both the first and the last layer, so a
// pipeline that puts them on different stages sums their gradients (DeepSpeed's TiedLayerSpec).
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "zero/models/gpt.hpp"
#include "zero/pipeline.hpp"
#include "zero/pipeline_flops.hpp"

namespace zero::models {

// The final RMSNorm and the head (a Linear, or the tied embedding's weight) as one module.
struct GptHeadImpl : torch::nn::Module {
  GptHeadImpl(RMSNorm norm, torch::nn::Linear head, at::Tensor tied_weight);
  at::Tensor forward(const at::Tensor& x);  // [batch, seq, dim] -> logits [batch, seq, vocab]
  RMSNorm norm{nullptr};
  torch::nn::Linear head{nullptr};  // null when tied
  at::Tensor tied_weight;           // the embedding's weight when tied
};
TORCH_MODULE(GptHead);

// The rotary tables as a stage's blocks read them: the model's tables in the activations' dtype
// on their device, made once (not per micro-batch and block) and shared by the blocks. They
// follow the activations rather than the model: a pipeline that moves only its stage's layers to
// a GPU (PipelineEngine's `device`) leaves the model's tables on the host, and they reach the GPU
// at the stage's first forward.
class RopeRows {
 public:
  RopeRows(at::Tensor cos, at::Tensor sin, int64_t max_seq)
      : cos_(std::move(cos)), sin_(std::move(sin)), max_seq_(max_seq) {}
  // The first `x.size(1) x shards` rows of both tables, as x's dtype on x's device: under
  // sequence parallelism a block's input is this rank's 1/shards of the sequence, and its
  // attention runs on the whole sequence (gathered inside the block).
  std::pair<at::Tensor, at::Tensor> rows(const at::Tensor& x, int64_t shards = 1) {
    const int64_t s = x.size(1) * shards;
    if (s > max_seq_) throw std::invalid_argument("sequence longer than the model's max_seq");
    std::lock_guard<std::mutex> lock(mu_);
    if (!cos_at_.defined() || cos_at_.device() != x.device() ||
        cos_at_.scalar_type() != x.scalar_type()) {
      cos_at_ = cos_.to(x.device(), x.scalar_type());
      sin_at_ = sin_.to(x.device(), x.scalar_type());
    }
    return {cos_at_.narrow(0, 0, s), sin_at_.narrow(0, 0, s)};
  }

 private:
  at::Tensor cos_, sin_, cos_at_, sin_at_;
  int64_t max_seq_;
  std::mutex mu_;
};

// Parameters of a module and its submodules (a tied weight registered twice counts once).
inline int64_t module_params(const torch::nn::Module& m) {
  int64_t n = 0;
  for (const auto& p : m.parameters()) n += p.numel();
  return n;
}

// A GPT (plain or tensor-parallel) as pipeline layers: the embedding, each block run as the
// model's forward runs it (the first S rows of its rotary tables in the input's dtype), then the
// head module (final norm and head). A tied table is named "embed" on the first and last layer.
// Each layer declares its training FLOPs per token on one tensor-parallel rank of `tp`
// (include/zero/pipeline_flops.hpp) at sequence length `seq_len`: the embedding its lookup, a
// block 6 x its parameters + attention's 12·s·h / T, the head 6 x its parameters (the tied
// table is registered on it too) + the cross-entropy over its V / T logits. `sequence_shards`:
// the parts a block's input holds of the sequence (T under sequence parallelism, else 1).
template <class BlockImpl, class Embed, class Head>
std::vector<zero::pipeline::Layer> rope_gpt_layers(Embed embed, const torch::nn::ModuleList& blocks,
                                                   Head head, bool tied, at::Tensor cos_table,
                                                   at::Tensor sin_table, int64_t max_seq,
                                                   int64_t seq_len, int64_t tp,
                                                   int64_t sequence_shards = 1) {
  namespace pp = zero::pipeline;
  const int64_t vocab_rows = embed->weight.size(0), hidden = embed->weight.size(1);
  std::vector<pp::Layer> layers;
  pp::Layer first{"embed",
                  embed.ptr(),
                  [embed](const at::Tensor& tokens) mutable { return embed->forward(tokens); },
                  {}};
  first.flops_per_token = pp::embedding_flops_per_token(hidden);
  if (tied) first.tied["embed"] = embed->weight;
  layers.push_back(std::move(first));
  auto rope = std::make_shared<RopeRows>(std::move(cos_table), std::move(sin_table), max_seq);
  for (size_t i = 0; i < blocks->size(); ++i) {
    auto block = blocks->ptr<BlockImpl>(i);
    auto run = [block, rope, sequence_shards](const at::Tensor& x) {
      const auto [cos, sin] = rope->rows(x, sequence_shards);
      return block->forward(x, cos, sin);
    };
    pp::Layer l{"block " + std::to_string(i), block, std::move(run), {}};
    l.flops_per_token = pp::matmul_flops_per_token(module_params(*block)) +
                        pp::attention_flops_per_token(hidden, seq_len) / tp;
    layers.push_back(std::move(l));
  }
  pp::Layer last{
      "head", head.ptr(), [head](const at::Tensor& x) mutable { return head->forward(x); }, {}};
  last.flops_per_token = pp::lm_head_flops_per_token(module_params(*head), vocab_rows);
  if (tied) last.tied["embed"] = embed->weight;
  layers.push_back(std::move(last));
  return layers;
}

// 2 + cfg.layers layers: "embed", "block 0" .. "block n-1", "head"; their costs declared for
// sequences of `seq_len` tokens (0: the model's max_seq).
std::vector<zero::pipeline::Layer> gpt_pipeline_layers(const Gpt& model, int64_t seq_len = 0);

// The GPT's name (GptImpl's named_parameters) of a parameter that a pipeline's engine
// names by its layer's index in gpt_pipeline_layers (PipelineEngine's checkpoints): "0.weight"
// -> "embed.weight", "3.wq.weight" -> "blocks.2.wq.weight", "<layers - 1>.norm.weight" ->
// "norm.weight". `layers`: the list's length (2 + blocks). "" for a name that is no such layer's.
std::string gpt_name_of_layer_param(const std::string& name, int layers);

// The last stage's loss: mean next-token cross-entropy of logits [batch, seq, vocab] against
// targets [batch, seq], as GptImpl::loss computes it.
at::Tensor gpt_loss(const at::Tensor& logits, const at::Tensor& targets);

}  // namespace zero::models
