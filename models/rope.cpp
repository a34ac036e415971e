#include "zero/models/rope.hpp"

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <stdexcept>

namespace zero::models {
namespace {

// Python's `1.0 / t` and `x / t` are t.reciprocal() * x (torch/_tensor.py, __rdiv__): two
// roundings, kept here so that the tables equal transformers' to the last bit.
at::Tensor rdiv(double x, const at::Tensor& t) { return at::reciprocal(t) * x; }

// 1 / theta^(2i/d), as transformers' default RoPE.
at::Tensor default_inv_freq(double theta, int64_t dim) {
  return at::reciprocal(at::pow(theta, at::arange(0, dim, 2, at::kFloat) / dim));
}

double yarn_mscale(double scale, double mscale) {
  return scale <= 1 ? 1.0 : 0.1 * mscale * std::log(scale) + 1.0;
}

RopeFrequencies llama3(const GptConfig& c) {
  const RopeScaling& r = c.rope;
  const at::Tensor inv = default_inv_freq(c.rope_theta, c.head_dim());
  const double old = static_cast<double>(r.original_max_seq);
  const double low_wavelen = old / r.low_freq_factor, high_wavelen = old / r.high_freq_factor;
  const at::Tensor wavelen = rdiv(2 * M_PI, inv);
  at::Tensor out = at::where(wavelen > low_wavelen, inv / r.factor, inv);
  const at::Tensor smooth =
      (rdiv(old, wavelen) - r.low_freq_factor) / (r.high_freq_factor - r.low_freq_factor);
  const at::Tensor smoothed = at::rsub(smooth, 1) * out / r.factor + smooth * out;
  const at::Tensor medium =
      (wavelen < high_wavelen).logical_not() & (wavelen > low_wavelen).logical_not();
  return {at::where(medium, smoothed, out), 1.0};
}

RopeFrequencies yarn(const GptConfig& c) {
  const RopeScaling& r = c.rope;
  const int64_t dim = c.head_dim();
  const double base = c.rope_theta, factor = r.factor;
  double attention = r.attention_factor;
  if (attention <= 0) {
    attention = r.mscale != 0 && r.mscale_all_dim != 0
                    ? yarn_mscale(factor, r.mscale) / yarn_mscale(factor, r.mscale_all_dim)
                    : yarn_mscale(factor, 1.0);
  }
  const double orig = static_cast<double>(r.original_max_seq);
  auto correction_dim = [&](double rotations) {
    return (dim * std::log(orig / (rotations * 2 * M_PI))) / (2 * std::log(base));
  };
  double low = correction_dim(r.beta_fast), high = correction_dim(r.beta_slow);
  if (r.truncate) low = std::floor(low), high = std::ceil(high);
  low = std::max(low, 0.0), high = std::min(high, static_cast<double>(dim - 1));
  if (low == high) high += 0.001;  // transformers' guard against a zero-width ramp

  const at::Tensor pos = at::pow(base, at::arange(0, dim, 2, at::kFloat) / dim);
  const at::Tensor extrapolation = rdiv(1.0, pos);
  const at::Tensor interpolation = rdiv(1.0, pos * factor);
  const at::Tensor ramp = at::clamp((at::arange(dim / 2, at::kFloat) - low) / (high - low), 0, 1);
  const at::Tensor extra = at::rsub(ramp, 1);
  return {interpolation * at::rsub(extra, 1) + extrapolation * extra, attention};
}

}  // namespace

bool rope_type_known(const std::string& type) {
  return type == "default" || type == "linear" || type == "dynamic" || type == "llama3" ||
         type == "yarn";
}

RopeFrequencies rope_frequencies(const GptConfig& c) {
  const std::string& type = c.rope.type;
  const int64_t dim = c.head_dim();
  if (type == "default") return {default_inv_freq(c.rope_theta, dim), 1.0};
  if (type == "linear") return {default_inv_freq(c.rope_theta, dim).div_(c.rope.factor), 1.0};
  if (type == "dynamic") {
    // Dynamic NTK at sequence lengths up to max_position_embeddings, which the GPT never
    // exceeds (transformers recomputes the frequencies only past it): the base is rescaled by
    // ((factor * L / L) - (factor - 1))^(d / (d - 2)) with L = max_position_embeddings.
    const double f = c.rope.factor, L = static_cast<double>(c.max_seq);
    const double base =
        c.rope_theta * std::pow(f * L / L - (f - 1), static_cast<double>(dim) / (dim - 2));
    return {rdiv(1.0, at::pow(base, at::arange(0, dim, 2, at::kFloat) / dim)), 1.0};
  }
  if (type == "llama3") return llama3(c);
  if (type == "yarn") return yarn(c);
  throw std::invalid_argument("unknown rope type '" + type + "'");
}

std::pair<at::Tensor, at::Tensor> rope_tables(const GptConfig& c) {
  const RopeFrequencies f = rope_frequencies(c);
  auto angles = at::outer(at::arange(c.max_seq, at::kFloat), f.inv_freq);  // [T, hd/2]
  angles = at::cat({angles, angles}, -1);
  at::Tensor cos = at::cos(angles), sin = at::sin(angles);
  if (f.attention_scaling != 1.0) {
    cos = cos * f.attention_scaling;
    sin = sin * f.attention_scaling;
  }
  return {cos, sin};
}

}  // namespace zero::models
