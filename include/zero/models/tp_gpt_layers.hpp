// The tensor-parallel GPT (tp_gpt.hpp) as a pipeline's list of layers, as gpt_layers.hpp
// does for the plain one: the vocabulary-parallel embedding, each block, then the final norm with
// the head; the loss (tp_gpt_loss) the vocabulary-parallel cross-entropy on the last stage. Every
// tensor-parallel rank of a stage builds the same list over its own shards, so the pipeline's
// partition (by parameter count) cuts every rank's list at the same layers. A tied head reads the
// embedding's vocabulary shard under the key "embed" in the first and the last layer: stage 0's
// tensor-parallel rank r and the last stage's rank r hold the same shard (the pipeline group
// joins ranks of one tensor-parallel rank), so the tie's exchange over the pipeline group keeps
// shard r equal to shard r.
#pragma once

#include <vector>

#include "zero/models/tp_gpt.hpp"
#include "zero/pipeline.hpp"

namespace zero::models {

// The final RMSNorm and the head (a ColumnParallelLinear without gather, or the tied
// embedding's shard) as one module: [batch, seq, dim] -> this rank's logits [.., vocab / T].
// Under sequence parallelism its input is this rank's [batch, seq / T, dim]: the norm sees that
// part only (its weight's gradient is partial, marked so) and the head gathers the sequence.
struct TpGptHeadImpl : torch::nn::Module, tensor_parallel::SequenceParallelModule {
  TpGptHeadImpl(tensor_parallel::GroupPtr group, RMSNorm norm,
                tensor_parallel::ColumnParallelLinear head, at::Tensor tied_weight,
                bool sequence_parallel = false);
  at::Tensor forward(const at::Tensor& x);
  tensor_parallel::SequenceShare sequence_share(const std::string& name) const override;
  tensor_parallel::GroupPtr group;
  bool sequence_parallel;
  RMSNorm norm{nullptr};
  tensor_parallel::ColumnParallelLinear head{nullptr};  // null when tied
  at::Tensor tied_weight;                               // the embedding's shard when tied
};
TORCH_MODULE(TpGptHead);

// 2 + cfg.layers layers: "embed", "block 0" .. "block n-1", "head". A model built with sequence
// parallelism sends each rank's 1/T of the sequence between stages (the embedding's output is
// scattered, the head gathers it); the stage's engine sums the marked norms' partial gradients
// over tp (tensor_parallel.sequence_parallel in its config). Costs (pipeline.partition: compute)
// are one tensor-parallel rank's, for sequences of `seq_len` tokens (0: the model's max_seq).
std::vector<zero::pipeline::Layer> tp_gpt_pipeline_layers(const TpGpt& model, int64_t seq_len = 0);

// The last stage's loss: the mean vocabulary-parallel cross-entropy over `group`, as
// TpGptImpl::loss (the same value on every tensor-parallel rank).
zero::pipeline::LossFn tp_gpt_loss(tensor_parallel::GroupPtr group);

}  // namespace zero::models
