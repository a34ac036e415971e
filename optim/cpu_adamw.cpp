#include "optim/cpu_adamw.hpp"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Context.h>
#include <ATen/Parallel.h>
#include <ATen/Version.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/_fused_adamw.h>
#include <ATen/ops/from_blob.h>
#include <ATen/ops/full.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/zeros.h>
#include <c10/core/thread_pool.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <optional>

// x86-64 with GCC or Clang: one clone of each kernel per instruction set, picked at load time,
// so the default build (no -march) still runs the loops 8 or 16 floats wide where the CPU can.
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__)) && !defined(__CUDACC__) && \
    !defined(__NVCC__)
#define ZERO_SIMD_CLONES \
  __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define ZERO_SIMD_CLONES
#endif

namespace zero::optim {
namespace {

// float -> bf16 bits, round to nearest even as c10::BFloat16 (and Tensor::to) does; branch-free
// so the loop stays vectorized. NaN keeps a quiet NaN.
inline uint16_t to_bf16_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  const uint32_t rounded = (u + (((u >> 16) & 1u) + 0x7FFFu)) >> 16;
  return f != f ? uint16_t{0x7FC0} : static_cast<uint16_t>(rounded);
}

enum class Out { kNone, kFloat, kBFloat16, kHalf };

template <Out kOut>
inline void store(void* out, int64_t i, float v) {
  if constexpr (kOut == Out::kFloat) {
    static_cast<float*>(out)[i] = v;
  } else if constexpr (kOut == Out::kBFloat16) {
    static_cast<uint16_t*>(out)[i] = to_bf16_bits(v);
  } else if constexpr (kOut == Out::kHalf) {
    static_cast<c10::Half*>(out)[i] = c10::Half(v);
  }
}

struct AdamStep {
  float lr, beta1, beta2, eps;
  float one_minus_beta1, one_minus_beta2;  // rounded from double, as torch does
  float decay;      // 1 - lr x weight_decay (decoupled), 1 outside the decay ranges
  float step_size;  // lr / (1 - beta1^t)
  float bc2_sqrt;   // sqrt(1 - beta2^t)
  float grad_scale;
  float inv_grad_scale;  // 1 / grad_scale, used only where that is exact (see unscale)
};

// grad / scale, the way ATen's fused kernels unscale. When the scale is a power of two its
// reciprocal is exact and x * (1 / scale) is the same exact value as x / scale, so it rounds to
// the same float: the multiply then gives identical bits for a quarter of a division's cost on
// the vector units (the step is compute-bound once the host has bandwidth to spare). The engine's
// scale is a power of two whenever clipping does not bite: the world size over the predivide
// factor, times an fp16 loss scale.
template <bool kDivide>
inline float unscale(float g, float scale, float inverse) {
  if constexpr (kDivide) {
    return g / scale;
  } else {
    return g * inverse;
  }
}

bool has_exact_inverse(float x) {
  int e = 0;
  const float m = std::frexp(x, &e);
  const float inv = 1.0f / x;
  return std::isfinite(x) && x != 0.0f && std::abs(m) == 0.5f && std::isfinite(inv) &&
         inv * x == 1.0f;
}

// How the moments are rounded. ATen's fused CPU AdamW (the engine's optimizer without offload)
// is one source compiled once per instruction set, and the compiler contracts what it may: in
// the torch 2.13 wheel's AVX2 and AVX-512 builds the lerp of the first moment is one fused
// multiply-add and so is beta2 v + (1 - beta2) g g (the product (1 - beta2) g, times g, added to
// the rounded beta2 v); its baseline build rounds every product. Computing the second moment with
// two roundings where ATen has one left a one-ulp difference in ~15 % of the second moments and
// ~0.2 % of the parameters per step; in bf16 one such parameter lying within that ulp of a bf16
// rounding boundary rounds to another bf16 weight, and from there the offloaded run trains on
// other weights (1e-5 .. 4e-4 of the parameters' magnitude apart after 4 more steps: the
// OffloadBf16 failure of issue 21). kFused is the AVX builds' rounding of whole vectors,
// kRounded the baseline build's; aten_rounding() finds which one this process's ATen does.
enum class Moments { kFused, kRounded };

// One element's update is torch's AdamW in fp32, rounded where ATen's fused CPU kernel rounds
// (kMoments above), so that an offloaded run and one without offload stay bit-identical.
template <Out kOut, bool kDivide, Moments kMoments>
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
    if constexpr (kMoments == Moments::kFused) {
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
void adamw_with(Moments moments, float* p, const float* g, float* m, float* v, void* out, int64_t n,
                const AdamStep& s) {
  if (moments == Moments::kFused) {
    adamw_kernel<kOut, kDivide, Moments::kFused>(p, g, m, v, out, n, s);
  } else {
    adamw_kernel<kOut, kDivide, Moments::kRounded>(p, g, m, v, out, n, s);
  }
}

// Mismatching elements between ATen's _fused_adamw_ and the kernel with `moments`, over three
// steps of random gradients from the same start, on whole vectors (ATen's remainder loop rounds
// otherwise; CpuAdamW hands remainders to ATen's kernel itself).
int64_t probe_mismatches(Moments moments) {
  constexpr int64_t kN = 4096;
  const AdamWOptions o{0.9, 0.999, 1e-8, 0.1};
  at::Generator gen = at::detail::createCPUGenerator(20261205);
  at::Tensor p = at::randn({kN}, gen), m = at::zeros({kN}), v = at::zeros({kN});
  at::Tensor ours = p.clone(), om = m.clone(), ov = v.clone();
  int64_t mismatches = 0;
  for (int t = 1; t <= 3; ++t) {
    const at::Tensor g = at::randn({kN}, gen);
    at::_fused_adamw_({p}, {g.clone()}, {m}, {v}, {}, {at::full({}, static_cast<double>(t))}, 1e-2,
                      o.beta1, o.beta2, o.weight_decay, o.eps, /*amsgrad=*/false,
                      /*maximize=*/false, std::nullopt, std::nullopt);
    adamw_with<Out::kNone, true>(moments, ours.data_ptr<float>(), g.data_ptr<float>(),
                                 om.data_ptr<float>(), ov.data_ptr<float>(), nullptr, kN,
                                 adam_step(o, 1e-2, o.weight_decay, t, 1.0f));
    mismatches += ours.ne(p).sum().item<int64_t>();
  }
  return mismatches;
}

// The rounding of this process's ATen (its CPU capability is picked at load time, or by
// ATEN_CPU_CAPABILITY): found once by stepping both kernels on the same data. Should a torch build
// round otherwise than both, the closer one is used and the offloaded run is no longer
// bit-identical to one without offload (an ulp here and there): said once.
Moments aten_rounding() {
  static const Moments found = [] {
    const int64_t fused = probe_mismatches(Moments::kFused);
    if (fused == 0) return Moments::kFused;
    const int64_t rounded = probe_mismatches(Moments::kRounded);
    if (rounded == 0) return Moments::kRounded;
    TORCH_WARN(
        "zero: the offloaded AdamW rounds differently from this torch build's fused CPU "
        "AdamW (",
        std::min(fused, rounded), " of ", 3 * 4096,
        " probe updates differ by an ulp): offloaded and non-offloaded runs will agree to "
        "~1e-7, not bit for bit");
    return fused <= rounded ? Moments::kFused : Moments::kRounded;
  }();
  return found;
}

struct SgdStep {
  float lr, weight_decay, momentum, dampening, grad_scale, inv_grad_scale;
  bool first, nesterov;
};

// torch::optim::SGD: coupled decay, momentum started as a copy of the first gradient.
template <Out kOut, bool kMomentum, bool kDivide>
ZERO_SIMD_CLONES void sgd_kernel(float* __restrict p, const float* __restrict g,
                                 float* __restrict buf, void* __restrict out, int64_t n,
                                 SgdStep s) {
  const float keep = 1.0f - s.dampening;
  for (int64_t i = 0; i < n; ++i) {
    float d = unscale<kDivide>(g[i], s.grad_scale, s.inv_grad_scale) + s.weight_decay * p[i];
    if constexpr (kMomentum) {
      const float b = s.first ? d : buf[i] * s.momentum + d * keep;
      buf[i] = b;
      d = s.nesterov ? d + s.momentum * b : b;
    }
    const float np = p[i] - s.lr * d;
    p[i] = np;
    store<kOut>(out, i, np);
  }
}

template <Out kOut>
ZERO_SIMD_CLONES void round_kernel(const float* __restrict p, void* __restrict out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) store<kOut>(out, i, p[i]);
}

Out out_kind(const at::Tensor& out) {
  if (!out.defined()) return Out::kNone;
  switch (out.scalar_type()) {
    case at::kFloat:
      return Out::kFloat;
    case at::kBFloat16:
      return Out::kBFloat16;
    case at::kHalf:
      return Out::kHalf;
    default:
      TORCH_CHECK(false, "zero: the CPU optimizer writes fp32, bf16 or fp16 copies, got ",
                  out.scalar_type());
  }
}

// Calls f(kind-tagged kernel) for `kind`: one instantiation per output dtype.
template <typename F>
void with_out(Out kind, F&& f) {
  switch (kind) {
    case Out::kNone:
      return f(std::integral_constant<Out, Out::kNone>{});
    case Out::kFloat:
      return f(std::integral_constant<Out, Out::kFloat>{});
    case Out::kBFloat16:
      return f(std::integral_constant<Out, Out::kBFloat16>{});
    case Out::kHalf:
      return f(std::integral_constant<Out, Out::kHalf>{});
  }
}

// A step scalar from host memory. Reading a device tensor here would be a host sync per update
// window (per bucket); the engine reads the step's scalars once (OptimizerOffload::host_scalars).
float host_scalar(const at::Tensor& t, float fallback, const char* what) {
  if (!t.defined()) return fallback;
  TORCH_CHECK(t.is_cpu() && t.scalar_type() == at::kFloat && t.numel() == 1,
              "zero: the CPU optimizer reads ", what,
              " as a one-element fp32 host tensor (read device scalars back once per step, "
              "OptimizerOffload::host_scalars), got ",
              t.scalar_type(), " on ", t.device());
  return t.data_ptr<float>()[0];
}

class HostOptimizerBase : public HostShardOptimizer {
 public:
  HostOptimizerBase(int64_t numel, std::vector<ParamGroup> groups, const at::TensorOptions& opts,
                    const HostOptimizerOptions& host)
      : HostShardOptimizer(numel, std::move(groups), opts, host.threads), pin_(host.pin_memory) {
    TORCH_CHECK(opts.device().is_cpu(),
                "zero: the CPU optimizer's shard must be in host memory, got ", opts.device());
  }

  void update_to(at::Tensor& param, const at::Tensor& grad, double lr, const Scalars& s,
                 Range window, const at::Tensor& out) override {
    require_no_grad_mul(s);
    TORCH_CHECK(window.begin >= 0 && window.begin <= window.end && window.end <= numel(),
                "zero: update window [", window.begin, ", ", window.end, ") outside the shard");
    TORCH_CHECK(param.is_cpu() && grad.is_cpu(), "zero: ", name(),
                " updates host tensors; got param on ", param.device(), ", grad on ",
                grad.device());
    if (out.defined()) {
      TORCH_CHECK(out.is_cpu() && out.is_contiguous() && out.numel() == window.end - window.begin,
                  "zero: the compute-dtype copy must be a contiguous host tensor of the window's ",
                  window.end - window.begin, " elements, got ", out.sizes(), " on ", out.device());
    }
    const Out kind = out_kind(out);
    char* out_base = out.defined() ? static_cast<char*>(out.data_ptr()) : nullptr;
    const int64_t out_elem = out.defined() ? static_cast<int64_t>(out.element_size()) : 0;
    const auto out_at = [&](int64_t i) -> void* {
      return out_base ? out_base + (i - window.begin) * out_elem : nullptr;
    };
    const bool skip = host_scalar(s.found_inf, 0.0f, "found_inf") != 0.0f;
    const float grad_scale = host_scalar(s.grad_scale, 1.0f, "grad_scale");
    if (skip) {
      // The master stays; the copy still gets it, so what the engine publishes is unchanged.
      if (kind == Out::kNone) return;
      const float* p = param.data_ptr<float>();
      for_chunks(window, [&](int64_t b, int64_t e) {
        with_out(kind, [&](auto k) {
          if constexpr (decltype(k)::value != Out::kNone) {
            round_kernel<decltype(k)::value>(p + b, out_at(b), e - b);
          }
        });
      });
      return;
    }
    // Each group's runs inside the window, each one parallel pass at the group's lr and decay.
    float* p = param.data_ptr<float>();
    const float* g = grad.data_ptr<float>();
    for (const ParamGroup& group : groups()) {
      const double group_lr = lr * group.lr_scale;
      for (const Range& r : group.ranges) {
        const int64_t b = std::max(r.begin, window.begin), e = std::min(r.end, window.end);
        if (b >= e) continue;
        // The slice's last elements past a multiple of remainder_width() (ATen's vector width)
        // go where ATen's remainder loop rounds them (see apply_remainder).
        const int64_t width = remainder_width();
        const int64_t body_end = width > 0 ? e - (e - b) % width : e;
        for_chunks({b, body_end}, [&](int64_t cb, int64_t ce) {
          apply_chunk(kind, p + cb, g + cb, cb, ce - cb, group_lr, grad_scale, group.weight_decay,
                      out_at(cb));
        });
        if (body_end < e) {
          apply_remainder(kind, p + body_end, g + body_end, body_end, e - body_end, group_lr,
                          grad_scale, group.weight_decay, out_at(body_end));
        }
      }
    }
  }

 protected:
  // One chunk of the update: n elements at `offset` of the shard (p, g point there), at the
  // group's lr and weight decay (unset: the optimizer's), the copy of kind `out_kind` at `out`
  // (or none).
  virtual void apply_chunk(Out out_kind, float* p, const float* g, int64_t offset, int64_t n,
                           double lr, float grad_scale, std::optional<double> weight_decay,
                           void* out) = 0;
  // A parameter group's slice is split into a body of whole vectors of this many elements and a
  // remainder handed to apply_remainder; 0: no split.
  virtual int64_t remainder_width() const { return 0; }
  virtual void apply_remainder(Out out_kind, float* p, const float* g, int64_t offset, int64_t n,
                               double lr, float grad_scale, std::optional<double> weight_decay,
                               void* out) {
    apply_chunk(out_kind, p, g, offset, n, lr, grad_scale, weight_decay, out);
  }

  at::Tensor state_zeros() const { return device::host_zeros(numel(), pin_); }

 private:
  // Splits [b, e) into pieces of at least kGrain elements, run in parallel: with threads_ > 0
  // on exactly that many threads (this thread and a pool of its own), whatever torch's intra-op
  // setting is (torchrun sets OMP_NUM_THREADS=1, which would leave the step one core per rank);
  // with 0 on torch's intra-op threads. Each element's result does not depend on the split.
  template <typename F>
  void for_chunks(Range r, F&& f) {
    constexpr int64_t kGrain =
        1 << 15;  // 128 KiB of fp32: below it threads cost more than they save
    const int64_t n = r.end - r.begin;
    if (n <= 0) return;
    if (threads_ <= 0) {
      at::parallel_for(r.begin, r.end, kGrain, [&](int64_t b, int64_t e) { f(b, e); });
      return;
    }
    const int64_t pieces = std::min<int64_t>(threads_, std::max<int64_t>(1, n / kGrain));
    if (pieces == 1) {
      f(r.begin, r.end);
      return;
    }
    // Pieces start on 64-byte lines of fp32 (16 elements): no two threads write one line.
    const int64_t per = ((n + pieces - 1) / pieces + 15) / 16 * 16;
    if (!pool_) pool_ = std::make_unique<c10::ThreadPool>(threads_ - 1);
    for (int64_t b = r.begin + per; b < r.end; b += per) {
      const int64_t e = std::min(r.end, b + per);
      pool_->run([&f, b, e] { f(b, e); });
    }
    f(r.begin, std::min(r.end, r.begin + per));
    // `f` and the buffers it writes are the caller's: nothing returns before every piece ran.
    pool_->waitWorkComplete();
  }

  bool pin_;
  std::unique_ptr<c10::ThreadPool> pool_;  // threads_ - 1 workers, made at the first big step
};

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
        adamw_with<decltype(k)::value, false>(moments_, p, g, m, v, out, n, s);
      } else {
        adamw_with<decltype(k)::value, true>(moments_, p, g, m, v, out, n, s);
      }
    });
  }

  // ATen's vector loop takes whole vectors of 16 floats (AVX-512) or 8 (AVX2, and the baseline
  // build's 32-byte Vectorized); what is left of a slice goes through a remainder loop that the
  // compiler rounds otherwise again (in the 2.13 wheel's AVX-512 build: its first 8 elements as
  // the body, the rest as fma(v, beta2, (1 - beta2) g g)). Rather than copy one compiler's
  // choices, the remainder (< 16 elements per slice) runs through ATen's kernel itself: both
  // runs then round every element alike, whatever the build.
  int64_t remainder_width() const override {
    static const int64_t width = at::get_cpu_capability() == "AVX512" ? 16 : 8;
    return width;
  }

  void apply_remainder(Out kind, float* p, const float* g, int64_t offset, int64_t n, double lr,
                       float grad_scale, std::optional<double> weight_decay, void* out) override {
    const auto host = [n](float* ptr) { return at::from_blob(ptr, {n}, at::kFloat); };
    // A copy: ATen writes the unscaled gradient back, and the shard's gradient is not ours.
    const at::Tensor grad = at::from_blob(const_cast<float*>(g), {n}, at::kFloat).clone();
    std::optional<at::Tensor> scale;
    if (grad_scale != 1.0f) scale = at::full({1}, grad_scale, at::kFloat);
    at::_fused_adamw_({host(p)}, {grad}, {host(exp_avg_.data_ptr<float>() + offset)},
                      {host(exp_avg_sq_.data_ptr<float>() + offset)}, {},
                      {at::full({}, static_cast<double>(steps_), at::kFloat)}, lr, o_.beta1,
                      o_.beta2, weight_decay.value_or(o_.weight_decay), o_.eps,
                      /*amsgrad=*/false, /*maximize=*/false, scale, std::nullopt);
    with_out(kind, [&](auto k) {
      if constexpr (decltype(k)::value != Out::kNone) round_kernel<decltype(k)::value>(p, out, n);
    });
  }

  AdamWOptions o_;
  Moments moments_ = aten_rounding();
  at::Tensor exp_avg_;
  at::Tensor exp_avg_sq_;
};

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
    SgdStep s;
    s.lr = static_cast<float>(lr);
    s.weight_decay = static_cast<float>(weight_decay.value_or(o_.weight_decay));
    s.momentum = static_cast<float>(o_.momentum);
    s.dampening = static_cast<float>(o_.dampening);
    s.grad_scale = grad_scale;
    s.inv_grad_scale = 1.0f / grad_scale;
    s.first = steps_ == 1;  // begin_step() counted this step already
    s.nesterov = o_.nesterov;
    const bool divide = !has_exact_inverse(grad_scale);
    float* buf = momentum_buffer_.defined() ? momentum_buffer_.data_ptr<float>() + offset : nullptr;
    with_out(kind, [&](auto k) {
      constexpr Out kOut = decltype(k)::value;
      if (buf != nullptr) {
        divide ? sgd_kernel<kOut, true, true>(p, g, buf, out, n, s)
               : sgd_kernel<kOut, true, false>(p, g, buf, out, n, s);
      } else {
        divide ? sgd_kernel<kOut, false, true>(p, g, nullptr, out, n, s)
               : sgd_kernel<kOut, false, false>(p, g, nullptr, out, n, s);
      }
    });
  }

  SgdOptions o_;
  at::Tensor momentum_buffer_;
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
