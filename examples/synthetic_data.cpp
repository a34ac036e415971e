#include "synthetic_data.hpp"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <cmath>

namespace zero::examples {

SyntheticCorpus::SyntheticCorpus(int64_t vocab, uint64_t seed, int successors)
    : vocab_(vocab), seed_(seed) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  next_ = at::randint(vocab, {vocab, successors}, gen, at::kLong);
  // Skewed successor probabilities (0.5, 0.25, ...): low entropy, but not deterministic.
  std::vector<double> p(successors);
  double total = 0;
  for (int i = 0; i < successors; ++i) total += (p[i] = std::pow(0.5, i + 1));
  double acc = 0;
  for (int i = 0; i < successors; ++i) p[i] = (acc += p[i] / total);
  probs_ = at::tensor(p, at::kDouble);
}

at::Tensor SyntheticCorpus::sample(int64_t index, int64_t len) const {
  // Each sample has its own generator: any rank can produce any sample, in any order.
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed_ * 0x9E3779B97F4A7C15ULL + index);
  at::Tensor u = at::rand({len + 1}, gen, at::kDouble);
  at::Tensor out = at::empty({len + 1}, at::kLong);
  auto* o = out.data_ptr<int64_t>();
  const auto* uu = u.data_ptr<double>();
  const auto* nx = next_.data_ptr<int64_t>();
  const auto* cp = probs_.data_ptr<double>();
  const int64_t k = next_.size(1);
  o[0] = static_cast<int64_t>(uu[0] * vocab_) % vocab_;
  for (int64_t t = 1; t <= len; ++t) {
    int64_t j = 0;
    while (j < k - 1 && uu[t] > cp[j]) ++j;
    o[t] = nx[o[t - 1] * k + j];
  }
  return out;
}

std::pair<at::Tensor, at::Tensor> SyntheticCorpus::batch(int64_t first, int64_t rows,
                                                         int64_t len) const {
  std::vector<at::Tensor> s;
  for (int64_t i = 0; i < rows; ++i) s.push_back(sample(first + i, len));
  at::Tensor all = at::stack(s);
  return {all.narrow(1, 0, len).contiguous(), all.narrow(1, 1, len).contiguous()};
}

double SyntheticCorpus::entropy() const {
  const auto* cp = probs_.data_ptr<double>();
  double h = 0, prev = 0;
  for (int64_t j = 0; j < probs_.numel(); ++j) {
    const double p = cp[j] - prev;
    prev = cp[j];
    if (p > 0) h -= p * std::log(p);
  }
  return h;
}

}  // namespace zero::examples
