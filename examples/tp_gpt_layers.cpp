#include "tp_gpt_layers.hpp"

#include <ATen/ATen.h>

#include <stdexcept>

#include "gpt_layers.hpp"

namespace zero::examples {

namespace tp = zero::tensor_parallel;

TpGptHeadImpl::TpGptHeadImpl(tp::GroupPtr g, RMSNorm n, tp::ColumnParallelLinear h, at::Tensor tied)
    : group(std::move(g)) {
  norm = register_module("norm", std::move(n));
  if (h) {
    head = register_module("head", std::move(h));
  } else {
    // Registered here as well as on the embedding, so that the last stage's partition count
    // sees it (its engine leaves the copy out: the first stage owns it).
    tied_weight = register_parameter("tied_weight", std::move(tied));
  }
}

at::Tensor TpGptHeadImpl::forward(const at::Tensor& x) {
  auto h = norm->forward(x);
  if (head) return head->forward(h);
  // As TpGptImpl::forward's tied head: the input enters the tensor-parallel region (backward
  // all-reduces its gradient), then this rank's vocabulary shard of the logits.
  return at::linear(tp::copy_to_region(h, group), tied_weight);
}

std::vector<zero::pipeline::Layer> tp_gpt_pipeline_layers(const TpGpt& model) {
  if (model->sequence_parallel)
    throw std::invalid_argument(
        "tensor_parallel.sequence_parallel with pipeline.stages > 1 is not built yet; set "
        "tensor_parallel.sequence_parallel: false");
  std::vector<zero::pipeline::Layer> layers;
  auto embed = model->embed;
  zero::pipeline::Layer first{
      "embed",
      embed.ptr(),
      [embed](const at::Tensor& tokens) mutable { return embed->forward(tokens); },
      {}};
  if (model->cfg.tied) first.tied["embed"] = embed->weight;
  layers.push_back(std::move(first));

  const int64_t max_seq = model->cfg.max_seq;
  at::Tensor cos_table = model->rope_cos, sin_table = model->rope_sin;
  for (size_t i = 0; i < model->blocks->size(); ++i) {
    auto block = model->blocks->ptr<TpBlockImpl>(i);
    layers.push_back(rope_block_layer(i, block, cos_table, sin_table, max_seq));
  }

  auto head = TpGptHead(model->group, model->norm, model->head,
                        model->cfg.tied ? embed->weight : at::Tensor());
  zero::pipeline::Layer last{
      "head", head.ptr(), [head](const at::Tensor& x) mutable { return head->forward(x); }, {}};
  if (model->cfg.tied) last.tied["embed"] = embed->weight;
  layers.push_back(std::move(last));
  return layers;
}

zero::pipeline::LossFn tp_gpt_loss(tp::GroupPtr group) {
  return [group](const at::Tensor& logits, const at::Tensor& targets) {
    return tp::vocab_parallel_cross_entropy(logits, targets, group).mean();
  };
}

}  // namespace zero::examples
