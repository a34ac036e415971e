// The host SGD of optimizer offload: torch::optim::SGD's update (coupled decay, momentum started
// as a copy of the first gradient, dampening, Nesterov) and the compute-dtype copy of the new
// weights in one vectorized, threaded pass, rounded as ATen's fused CPU SGD.
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/_fused_sgd.h>
#include <ATen/ops/randn.h>
#include <c10/macros/Macros.h>

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

struct SgdStep {
  float lr, weight_decay, momentum;
  float keep;  // 1 - dampening, rounded once from double as ATen does
  float grad_scale, inv_grad_scale;
  bool decay, first, nesterov;
};

SgdStep sgd_step(const SgdOptions& o, double lr, double weight_decay, bool first,
                 float grad_scale) {
  SgdStep s;
  s.lr = static_cast<float>(lr);
  s.weight_decay = static_cast<float>(weight_decay);
  s.momentum = static_cast<float>(o.momentum);
  s.keep = static_cast<float>(1.0 - o.dampening);
  s.grad_scale = grad_scale;
  s.inv_grad_scale = 1.0f / grad_scale;
  s.decay = weight_decay != 0.0;
  s.first = first;
  s.nesterov = o.nesterov;
  return s;
}

// a * b + c, with one rounding (kFused) or two (Rounding, host_kernels.hpp).
template <Rounding kRounding>
C10_ALWAYS_INLINE float madd(float a, float b, float c) {
  if constexpr (kRounding == Rounding::kFused) {
    return std::fma(a, b, c);
  } else {
    return a * b + c;
  }
}

// torch::optim::SGD, rounded where ATen's fused CPU SGD rounds: the offloaded run is the
// non-offloaded one bit for bit.
template <Out kOut, bool kMomentum, bool kDivide, Rounding kRounding>
ZERO_SIMD_CLONES void sgd_kernel(float* __restrict p, const float* __restrict g,
                                 float* __restrict buf, void* __restrict out, int64_t n,
                                 SgdStep s) {
  const float minus_lr = -s.lr;
  for (int64_t i = 0; i < n; ++i) {
    float d = unscale<kDivide>(g[i], s.grad_scale, s.inv_grad_scale);
    if (s.decay) d = madd<kRounding>(p[i], s.weight_decay, d);
    if constexpr (kMomentum) {
      const float b = s.first ? d : madd<kRounding>(s.keep, d, buf[i] * s.momentum);
      buf[i] = b;
      d = s.nesterov ? madd<kRounding>(b, s.momentum, d) : b;
    }
    const float np = madd<kRounding>(d, minus_lr, p[i]);
    p[i] = np;
    store<kOut>(out, i, np);
  }
}

template <Out kOut>
void sgd_with(Rounding rounding, bool divide, float* p, const float* g, float* buf, void* out,
              int64_t n, const SgdStep& s) {
  const auto run = [&](auto fused) {
    constexpr Rounding kR = decltype(fused)::value ? Rounding::kFused : Rounding::kRounded;
    if (buf != nullptr) {
      divide ? sgd_kernel<kOut, true, true, kR>(p, g, buf, out, n, s)
             : sgd_kernel<kOut, true, false, kR>(p, g, buf, out, n, s);
    } else {
      divide ? sgd_kernel<kOut, false, true, kR>(p, g, nullptr, out, n, s)
             : sgd_kernel<kOut, false, false, kR>(p, g, nullptr, out, n, s);
    }
  };
  if (rounding == Rounding::kFused) {
    run(std::true_type{});
  } else {
    run(std::false_type{});
  }
}

// Mismatching elements between ATen's _fused_sgd_ and the kernel with `rounding` on whole
// vectors: a first step and two more with dampening, then with Nesterov momentum.
int64_t probe_mismatches(Rounding rounding) {
  constexpr int64_t kN = 4096;
  at::Generator gen = at::detail::createCPUGenerator(20261205);
  int64_t mismatches = 0;
  for (const SgdOptions o : {SgdOptions{0.9, 0.1, 0.01, false}, SgdOptions{0.9, 0, 0.01, true}}) {
    at::Tensor p = at::randn({kN}, gen, at::kFloat), buf = at::zeros({kN}, at::kFloat);
    at::Tensor ours = p.clone(), obuf = buf.clone();
    for (int t = 1; t <= 3; ++t) {
      const at::Tensor g = at::randn({kN}, gen, at::kFloat);
      at::_fused_sgd_({p}, {g.clone()}, {buf}, o.weight_decay, o.momentum, 0.05, o.dampening,
                      o.nesterov, /*maximize=*/false, /*is_first_step=*/t == 1, std::nullopt,
                      std::nullopt);
      sgd_with<Out::kNone>(rounding, /*divide=*/true, ours.data_ptr<float>(), g.data_ptr<float>(),
                           obuf.data_ptr<float>(), nullptr, kN,
                           sgd_step(o, 0.05, o.weight_decay, t == 1, 1.0f));
      mismatches += ours.ne(p).sum().item<int64_t>() + obuf.ne(buf).sum().item<int64_t>();
    }
  }
  return mismatches;
}

Rounding aten_sgd_rounding() {
  static const Rounding found = host::pick_rounding("SGD", probe_mismatches);
  return found;
}

class CpuSgd final : public HostOptimizerBase {
 public:
  CpuSgd(const SgdOptions& o, int64_t numel, std::vector<ParamGroup> groups,
         const at::TensorOptions& opts, const HostOptimizerOptions& host)
      : HostOptimizerBase(numel, std::move(groups), opts, host), o_(o) {
    if (o_.momentum != 0) momentum_buffer_ = state_zeros();
  }

  std::vector<std::pair<std::string, at::Tensor>> state() const override {
    if (!momentum_buffer_.defined()) return {};
    return {{"momentum_buffer", momentum_buffer_}};
  }
  std::string name() const override { return "sgd"; }

 private:
  void apply_chunk(Out kind, float* p, const float* g, int64_t offset, int64_t n, double lr,
                   float grad_scale, std::optional<double> weight_decay, void* out) override {
    const SgdStep s = sgd_step(o_, lr, weight_decay.value_or(o_.weight_decay),
                               /*first=*/steps_ == 1,  // begin_step() counted this step already
                               grad_scale);
    float* buf = momentum_buffer_.defined() ? momentum_buffer_.data_ptr<float>() + offset : nullptr;
    const bool divide = !has_exact_inverse(grad_scale);
    with_out(kind, [&](auto k) {
      sgd_with<decltype(k)::value>(rounding_, divide, p, g, buf, out, n, s);
    });
  }

  // ATen's remainder loop is compiled otherwise again; it runs through ATen's kernel itself.
  void apply_remainder(Out kind, float* p, const float* g, int64_t offset, int64_t n, double lr,
                       float grad_scale, std::optional<double> weight_decay, void* out) override {
    const host::RemainderGrad rg = host::remainder_grad(g, n, grad_scale);
    std::vector<at::Tensor> buf;
    if (momentum_buffer_.defined()) {
      buf.push_back(host::view(momentum_buffer_.data_ptr<float>() + offset, n));
    }
    at::_fused_sgd_({host::view(p, n)}, {rg.grad}, buf, weight_decay.value_or(o_.weight_decay),
                    o_.momentum, lr, o_.dampening, o_.nesterov, /*maximize=*/false,
                    /*is_first_step=*/steps_ == 1, rg.scale, std::nullopt);
    host::round_to(kind, p, out, n);
  }

  SgdOptions o_;
  Rounding rounding_ = aten_sgd_rounding();
  at::Tensor momentum_buffer_;
};

}  // namespace

std::unique_ptr<HostShardOptimizer> make_grouped_cpu_sgd(const SgdOptions& options, int64_t numel,
                                                         std::vector<ParamGroup> groups,
                                                         const at::TensorOptions& opts,
                                                         const HostOptimizerOptions& host) {
  make_sgd(options, 0, {}, opts);  // make_sgd's checks, with its messages
  return std::make_unique<CpuSgd>(options, numel, std::move(groups), opts, host);
}

std::unique_ptr<HostShardOptimizer> make_cpu_sgd(const SgdOptions& options, int64_t numel,
                                                 std::vector<Range> decay_ranges,
                                                 const at::TensorOptions& opts,
                                                 const HostOptimizerOptions& host) {
  return make_grouped_cpu_sgd(options, numel, decay_groups(numel, std::move(decay_ranges)), opts,
                              host);
}

}  // namespace zero::optim
