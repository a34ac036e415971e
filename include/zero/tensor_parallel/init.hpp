// Full (unsplit) initial weights from a seed, drawn the way torch::nn::Linear and Embedding draw
// theirs, from a generator of their own: every tensor-parallel rank draws the same full tensor
// and keeps its part (Megatron's CPU initialisation), and a test or a single-process reference
// builds the identical full model from the same seed. Independent of the global RNG, so ranks
// running as threads do not race on it.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace zero::tensor_parallel {

struct FullLinear {
  at::Tensor weight;  // [out, in]
  at::Tensor bias;    // [out], undefined without bias
};

// weight and bias ~ U(-1/sqrt(in), 1/sqrt(in)): nn::Linear's kaiming_uniform_(a = sqrt(5)).
FullLinear init_full_linear(int64_t in_features, int64_t out_features, bool bias, uint64_t seed);

// weight ~ N(0, 1), [vocab, dim]: nn::Embedding's default.
at::Tensor init_full_embedding(int64_t vocab, int64_t dim, uint64_t seed);

}  // namespace zero::tensor_parallel
