#include "zero/models/tp_gpt_layers.hpp"

#include <ATen/ATen.h>

#include <stdexcept>

#include "zero/models/gpt_layers.hpp"

namespace zero::models {

namespace tp = zero::tensor_parallel;

TpGptHeadImpl::TpGptHeadImpl(tp::GroupPtr g, RMSNorm n, tp::ColumnParallelLinear h, at::Tensor tied,
                             bool sp)
    : group(std::move(g)), sequence_parallel(sp) {
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
  // An untied head was built with the model's sequence_parallel: it gathers the sequence itself.
  if (head) return head->forward(h);
  // As TpGptImpl::forward's tied head: the input enters the tensor-parallel region (under SP
  // all-gathered along the sequence, backward reduce-scatters; otherwise copied, backward
  // all-reduces), then this rank's vocabulary shard of the logits.
  const at::Tensor in = sequence_parallel ? tp::gather_from_sequence_region(h, group, /*dim=*/1)
                                          : tp::copy_to_region(h, group);
  return at::linear(in, tied_weight);
}

tp::SequenceShare TpGptHeadImpl::sequence_share(const std::string& name) const {
  // The norm runs before the head gathers the sequence.
  if (name.rfind("norm.", 0) == 0) return tp::SequenceShare::kPartial;
  // The embedding's vocabulary shard, here again: where the embedding shares the stage, the engine
  // takes its placement from the embedding (listed first); elsewhere the copy is not the stage's.
  if (name == "tied_weight") return tp::SequenceShare::kWhole;
  return tp::SequenceShare::kUnsaid;
}

std::vector<zero::pipeline::Layer> tp_gpt_pipeline_layers(const TpGpt& model, int64_t seq_len) {
  return rope_gpt_layers<TpBlockImpl>(
      model->embed, model->blocks,
      TpGptHead(model->group, model->norm, model->head,
                model->cfg.tied ? model->embed->weight : at::Tensor(), model->sequence_parallel),
      model->cfg.tied, model->rope_cos, model->rope_sin, model->cfg.max_seq,
      seq_len > 0 ? seq_len : model->cfg.max_seq, model->group->size(),
      model->sequence_parallel ? model->group->size() : 1);
}

zero::pipeline::LossFn tp_gpt_loss(tp::GroupPtr group) {
  return [group](const at::Tensor& logits, const at::Tensor& targets) {
    return tp::vocab_parallel_cross_entropy(logits, targets, group);  // mean over targets != -100
  };
}

}  // namespace zero::models
