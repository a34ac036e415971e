// Megatron's VocabParallelEmbedding: the table [vocab, dim] split by vocabulary rows, rank r
// holding ids [r * vocab / T, (r + 1) * vocab / T). Each rank looks up the ids in its range,
// writes zeros for the others, and the partial results are all-reduced (under sequence
// parallelism reduce-scattered along the sequence, so each rank continues with its part).
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include <cstdint>

#include "zero/tensor_parallel/mappings.hpp"
#include "zero/tensor_parallel/placement.hpp"

namespace zero::tensor_parallel {

struct VocabParallelEmbeddingOptions {
  VocabParallelEmbeddingOptions(int64_t vocab, int64_t dim) : vocab_(vocab), dim_(dim) {}
  TORCH_ARG(int64_t, vocab);  // divisible by the tensor-parallel size
  TORCH_ARG(int64_t, dim);
  TORCH_ARG(bool, sequence_parallel) = false;
  TORCH_ARG(int64_t, sequence_dim) = 1;  // of the output [batch, sequence, dim]
  TORCH_ARG(uint64_t, seed) = 0;         // of the full initial table (init_full_embedding)
  // forward checks the ids against the vocabulary, agreed over the group (each rank's [min, max]
  // id all-gathered: a collective and a host read per call, which on a GPU waits for the
  // queued work) and every rank throws naming the bad id and its rank. Off: no collective and
  // no host read; an id outside the vocabulary embeds to zeros, as in Megatron-LM (never an
  // out-of-bounds read). For data checked already (zero-train's datasets check every token
  // against the model's vocabulary when they open).
  TORCH_ARG(bool, check_ids) = true;
};

class VocabParallelEmbeddingImpl : public torch::nn::Module, public TensorParallelLayer {
 public:
  VocabParallelEmbeddingImpl(GroupPtr group, VocabParallelEmbeddingOptions options);
  VocabParallelEmbeddingImpl(GroupPtr group, int64_t vocab, int64_t dim)
      : VocabParallelEmbeddingImpl(std::move(group), VocabParallelEmbeddingOptions(vocab, dim)) {}

  // ids: integer tensor of any shape, every id in [0, vocab) (checked unless options().check_ids
  // is off: an id out of range would otherwise silently embed to zeros). Returns [ids..., dim].
  at::Tensor forward(const at::Tensor& ids);
  // Turns options().check_ids on or off (the same on every rank of the group).
  void set_check_ids(bool on) { options_.check_ids(on); }

  // Keeps this rank's rows of the full table [vocab, dim].
  void load_full(const at::Tensor& weight);
  at::Tensor gather_full() const;  // a collective

  Placement placement(const std::string& param_name) const override;

  // This rank's ids: [vocab_start(), vocab_start() + weight.size(0)).
  int64_t vocab_start() const;

  const VocabParallelEmbeddingOptions& options() const { return options_; }
  const GroupPtr& group() const { return group_; }

  at::Tensor weight;  // [vocab / T, dim]

 private:
  VocabParallelEmbeddingOptions options_;
  GroupPtr group_;
};
TORCH_MODULE(VocabParallelEmbedding);

}  // namespace zero::tensor_parallel
