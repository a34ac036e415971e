// Built-in synthetic corpus with learnable structure: token sequences drawn from a fixed sparse
// Markov chain (each token has a few likely successors), so the loss visibly falls from
// ln(vocab) towards the chain's entropy within a minute on a CPU.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace zero::examples {

class SyntheticCorpus {
 public:
  SyntheticCorpus(int64_t vocab, uint64_t seed, int successors = 4);
  // Sample `index` of the infinite corpus: `len + 1` tokens (inputs and shifted targets).
  at::Tensor sample(int64_t index, int64_t len) const;
  // Rows [first, first + rows) as (tokens, targets), each [rows, len].
  std::pair<at::Tensor, at::Tensor> batch(int64_t first, int64_t rows, int64_t len) const;
  // The chain's entropy rate in nats: the loss a perfect model reaches.
  double entropy() const;

 private:
  int64_t vocab_;
  uint64_t seed_;
  at::Tensor next_;   // [vocab, successors] int64
  at::Tensor probs_;  // [successors] cumulative probabilities, shared by all tokens
};

}  // namespace zero::examples
