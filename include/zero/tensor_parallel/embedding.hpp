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
};

class VocabParallelEmbeddingImpl : public torch::nn::Module, public TensorParallelLayer {
 public:
  VocabParallelEmbeddingImpl(GroupPtr group, VocabParallelEmbeddingOptions options);
  VocabParallelEmbeddingImpl(GroupPtr group, int64_t vocab, int64_t dim)
      : VocabParallelEmbeddingImpl(std::move(group), VocabParallelEmbeddingOptions(vocab, dim)) {}

  // ids: integer tensor of any shape, every id in [0, vocab) (checked: an id out of range would
  // otherwise silently embed to zeros). Returns [ids..., dim].
  at::Tensor forward(const at::Tensor& ids);

  // Keeps this rank's rows of the full table [vocab, dim].
  void load_full(const at::Tensor& weight);
  at::Tensor gather_full() const;  // a collective

  Placement placement(const std::string& param_name) const override;

  // This rank's ids: [vocab_start(), vocab_start() + weight.size(0)).
  int64_t vocab_start() const;

  const VocabParallelEmbeddingOptions& options() const { return options_; }

  at::Tensor weight;  // [vocab / T, dim]

 private:
  VocabParallelEmbeddingOptions options_;
  GroupPtr group_;
};
TORCH_MODULE(VocabParallelEmbedding);

}  // namespace zero::tensor_parallel
