#include "zero/tensor_parallel/init.hpp"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <cmath>

namespace zero::tensor_parallel {

FullLinear init_full_linear(int64_t in_features, int64_t out_features, bool bias, uint64_t seed) {
  at::Generator gen = at::detail::createCPUGenerator(seed);
  const double bound = 1.0 / std::sqrt(static_cast<double>(in_features));
  FullLinear full;
  full.weight = at::empty({out_features, in_features}, at::kFloat).uniform_(-bound, bound, gen);
  if (bias) full.bias = at::empty({out_features}, at::kFloat).uniform_(-bound, bound, gen);
  return full;
}

at::Tensor init_full_embedding(int64_t vocab, int64_t dim, uint64_t seed) {
  at::Generator gen = at::detail::createCPUGenerator(seed);
  return at::empty({vocab, dim}, at::kFloat).normal_(0.0, 1.0, gen);
}

}  // namespace zero::tensor_parallel
