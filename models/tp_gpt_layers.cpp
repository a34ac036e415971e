#include "zero/models/tp_gpt_layers.hpp"

#include <ATen/ATen.h>

#include <stdexcept>

#include "zero/models/gpt_layers.hpp"

namespace zero::models {

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

std::vector<zero::pipeline::Layer> tp_gpt_pipeline_layers(const TpGpt& model, int64_t seq_len) {
  if (model->sequence_parallel)
    throw std::invalid_argument(
        "tensor_parallel.sequence_parallel with pipeline.stages > 1 is not built yet; set "
        "tensor_parallel.sequence_parallel: false");
  return rope_gpt_layers<TpBlockImpl>(
      model->embed, model->blocks,
      TpGptHead(model->group, model->norm, model->head,
                model->cfg.tied ? model->embed->weight : at::Tensor()),
      model->cfg.tied, model->rope_cos, model->rope_sin, model->cfg.max_seq,
      seq_len > 0 ? seq_len : model->cfg.max_seq, model->group->size());
}

zero::pipeline::LossFn tp_gpt_loss(tp::GroupPtr group) {
  return [group](const at::Tensor& logits, const at::Tensor& targets) {
    return tp::vocab_parallel_cross_entropy(logits, targets, group);  // mean over targets != -100
  };
}

}  // namespace zero::models
