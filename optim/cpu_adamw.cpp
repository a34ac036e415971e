// The host AdamW of optimizer offload: decay, both moments, the update and the compute-dtype copy
// of the new weights in one vectorized, threaded pass, rounded as ATen's fused CPU AdamW.
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/_fused_adamw.h>
#include <ATen/ops/full.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/zeros.h>

#include <algorithm>
#include <cmath>
#include <optional>

#include "optim/cpu_adamw.hpp"
#include "optim/host_kernels.hpp"
#include "optim/host_optimizer.hpp"

namespace zero::optim {
namespace {

using host::has_exact_inverse;
using host::HostOptimizerBase;
using host::Out;
using host::Rounding;
using host::store;
using host::unscale;
using host::with_out;

struct AdamStep {
  float lr, beta1, beta2, eps;
  float one_minus_beta1, one_minus_beta2;  // rounded from double, as torch does
  float decay;      // 1 - lr x weight_decay (decoupled), 1 outside the decay ranges
  float step_size;  // lr / (1 - beta1^t)
  float bc2_sqrt;   // sqrt(1 - beta2^t)
  float grad_scale;
  float inv_grad_scale;  // 1 / grad_scale, used only where that is exact (see unscale)
};

// One element's update is torch's AdamW in fp32, rounded where ATen's fused CPU kernel rounds
// (Rounding, host_kernels.hpp): the offloaded run is the non-offloaded one bit for bit.
template <Out kOut, bool kDivide, Rounding kRounding>
ZERO_SIMD_CLONES void adamw_kernel(float* __restrict p, const float* __restrict g,
                                   float* __restrict m, float* __restrict v, void* __restrict out,
                                   int64_t n, AdamStep s) {
  // lerp(m, g, w) = m + w (g - m) for a small weight, g - (1 - w)(g - m) otherwise.
  const float w = s.one_minus_beta1;
  const bool small = std::abs(w) < 0.5f;
  const float coeff = small ? w : w - 1.0f;
  const float c2 = s.one_minus_beta2, minus_step = -s.step_size;
  for (int64_t i = 0; i < n; ++i) {
    const float grad = unscale<kDivide>(g[i], s.grad_scale, s.inv_grad_scale);
    const float param = p[i] * s.decay;
    const float base = small ? m[i] : grad;
    float mi, vi;
    if constexpr (kRounding == Rounding::kFused) {
      mi = std::fma(coeff, grad - m[i], base);
      vi = std::fma(c2 * grad, grad, v[i] * s.beta2);
    } else {
      mi = coeff * (grad - m[i]) + base;
      vi = v[i] * s.beta2 + c2 * grad * grad;
    }
    const float denom = std::sqrt(vi) / s.bc2_sqrt + s.eps;
    const float np = param + minus_step * mi / denom;
    m[i] = mi;
    v[i] = vi;
    p[i] = np;
    store<kOut>(out, i, np);
  }
}

// torch's step constants for step t, computed in double as torch does and rounded once.
AdamStep adam_step(const AdamWOptions& o, double lr, double weight_decay, double t,
                   float grad_scale) {
  AdamStep s;
  s.lr = static_cast<float>(lr);
  s.beta1 = static_cast<float>(o.beta1);
  s.beta2 = static_cast<float>(o.beta2);
  s.eps = static_cast<float>(o.eps);
  s.one_minus_beta1 = static_cast<float>(1.0 - o.beta1);
  s.one_minus_beta2 = static_cast<float>(1.0 - o.beta2);
  s.decay = static_cast<float>(1.0 - lr * weight_decay);
  s.step_size = static_cast<float>(lr / (1.0 - std::pow(o.beta1, t)));
  s.bc2_sqrt = static_cast<float>(std::sqrt(1.0 - std::pow(o.beta2, t)));
  s.grad_scale = grad_scale;
  s.inv_grad_scale = 1.0f / grad_scale;
  return s;
}

template <Out kOut, bool kDivide>
void adamw_with(Rounding rounding, float* p, const float* g, float* m, float* v, void* out,
                int64_t n, const AdamStep& s) {
  if (rounding == Rounding::kFused) {
    adamw_kernel<kOut, kDivide, Rounding::kFused>(p, g, m, v, out, n, s);
  } else {
    adamw_kernel<kOut, kDivide, Rounding::kRounded>(p, g, m, v, out, n, s);
  }
}

// Mismatching elements between ATen's _fused_adamw_ and the kernel with `rounding`, over three
// steps of random gradients from the same start, on whole vectors (ATen's remainder loop rounds
// otherwise; CpuAdamW hands remainders to ATen's kernel itself).
int64_t probe_mismatches(Rounding rounding) {
  constexpr int64_t kN = 4096;
  const AdamWOptions o{0.9, 0.999, 1e-8, 0.1};
  at::Generator gen = at::detail::createCPUGenerator(20261205);
  at::Tensor p = at::randn({kN}, gen, at::kFloat), m = at::zeros({kN}, at::kFloat),
             v = at::zeros({kN}, at::kFloat);
  at::Tensor ours = p.clone(), om = m.clone(), ov = v.clone();
  int64_t mismatches = 0;
  for (int t = 1; t <= 3; ++t) {
    const at::Tensor g = at::randn({kN}, gen, at::kFloat);
    at::_fused_adamw_({p}, {g.clone()}, {m}, {v}, {},
                      {at::full({}, static_cast<double>(t), at::kFloat)}, 1e-2, o.beta1, o.beta2,
                      o.weight_decay, o.eps, /*amsgrad=*/false,
                      /*maximize=*/false, std::nullopt, std::nullopt);
    adamw_with<Out::kNone, true>(rounding, ours.data_ptr<float>(), g.data_ptr<float>(),
                                 om.data_ptr<float>(), ov.data_ptr<float>(), nullptr, kN,
                                 adam_step(o, 1e-2, o.weight_decay, t, 1.0f));
    mismatches += ours.ne(p).sum().item<int64_t>();
  }
  return mismatches;
}

Rounding aten_adamw_rounding() {
  static const Rounding found = host::pick_rounding("AdamW", probe_mismatches);
  return found;
}

class CpuAdamW final : public HostOptimizerBase {
 public:
  CpuAdamW(const AdamWOptions& o, int64_t numel, std::vector<ParamGroup> groups,
           const at::TensorOptions& opts, const HostOptimizerOptions& host)
      : HostOptimizerBase(numel, std::move(groups), opts, host), o_(o) {
    exp_avg_ = state_zeros();
    exp_avg_sq_ = state_zeros();
  }

  std::vector<std::pair<std::string, at::Tensor>> state() const override {
    return {{"exp_avg", exp_avg_}, {"exp_avg_sq", exp_avg_sq_}};
  }
  std::string name() const override { return "adamw"; }

 private:
  void apply_chunk(Out kind, float* p, const float* g, int64_t offset, int64_t n, double lr,
                   float grad_scale, std::optional<double> weight_decay, void* out) override {
    const AdamStep s = adam_step(o_, lr, weight_decay.value_or(o_.weight_decay),
                                 static_cast<double>(steps_), grad_scale);
    float* m = exp_avg_.data_ptr<float>() + offset;
    float* v = exp_avg_sq_.data_ptr<float>() + offset;
    with_out(kind, [&](auto k) {
      if (has_exact_inverse(grad_scale)) {
        adamw_with<decltype(k)::value, false>(rounding_, p, g, m, v, out, n, s);
      } else {
        adamw_with<decltype(k)::value, true>(rounding_, p, g, m, v, out, n, s);
      }
    });
  }

  // ATen's remainder loop is compiled otherwise again (in the 2.13 wheel's AVX-512 build: its
  // first 8 elements as the body, the rest as fma(v, beta2, (1 - beta2) g g)). Rather than copy
  // one compiler's choices, the remainder (< 16 elements per slice) runs through ATen's kernel
  // itself: both runs then round every element alike, whatever the build.
  void apply_remainder(Out kind, float* p, const float* g, int64_t offset, int64_t n, double lr,
                       float grad_scale, std::optional<double> weight_decay, void* out) override {
    const host::RemainderGrad rg = host::remainder_grad(g, n, grad_scale);
    at::_fused_adamw_({host::view(p, n)}, {rg.grad},
                      {host::view(exp_avg_.data_ptr<float>() + offset, n)},
                      {host::view(exp_avg_sq_.data_ptr<float>() + offset, n)}, {},
                      {at::full({}, static_cast<double>(steps_), at::kFloat)}, lr, o_.beta1,
                      o_.beta2, weight_decay.value_or(o_.weight_decay), o_.eps,
                      /*amsgrad=*/false, /*maximize=*/false, rg.scale, std::nullopt);
    host::round_to(kind, p, out, n);
  }

  AdamWOptions o_;
  Rounding rounding_ = aten_adamw_rounding();
  at::Tensor exp_avg_;
  at::Tensor exp_avg_sq_;
};

}  // namespace

std::unique_ptr<HostShardOptimizer> make_grouped_cpu_adamw(const AdamWOptions& options,
                                                           int64_t numel,
                                                           std::vector<ParamGroup> groups,
                                                           const at::TensorOptions& opts,
                                                           const HostOptimizerOptions& host) {
  // make_adamw's checks, with its messages.
  make_adamw(options, 0, {}, opts);
  return std::make_unique<CpuAdamW>(options, numel, std::move(groups), opts, host);
}

std::unique_ptr<HostShardOptimizer> make_cpu_adamw(const AdamWOptions& options, int64_t numel,
                                                   std::vector<Range> decay_ranges,
                                                   const at::TensorOptions& opts,
                                                   const HostOptimizerOptions& host) {
  return make_grouped_cpu_adamw(options, numel, decay_groups(numel, std::move(decay_ranges)), opts,
                                host);
}

}  // namespace zero::optim
