#include "optim/host_optimizer.hpp"

#include <ATen/Parallel.h>
#include <ATen/Version.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/from_blob.h>
#include <ATen/ops/full.h>
#include <ATen/ops/linalg_vector_norm.h>
#include <ATen/ops/zeros.h>

#include <algorithm>
#include <atomic>
#include <cmath>

#include "device/pinned_host.hpp"

namespace zero::optim::host {
namespace {

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

// Sum of x^2 over n floats: 16 float lanes (a vector's worth) over blocks of 4096 elements, each
// block's lanes added in double. ATen's fp32 vector_norm accumulates a whole tensor in float
// lanes: 1.3e-3 relative error at 2^24 elements, where this stays near 1e-7.
ZERO_SIMD_CLONES double sum_of_squares(const float* __restrict x, int64_t n) {
  constexpr int64_t kLanes = 16, kBlock = 4096;
  double total = 0;
  for (int64_t b = 0; b < n; b += kBlock) {
    const int64_t e = std::min(n, b + kBlock);
    float lane[kLanes] = {};
    int64_t i = b;
    for (; i + kLanes <= e; i += kLanes) {
      for (int64_t l = 0; l < kLanes; ++l) lane[l] += x[i + l] * x[i + l];
    }
    for (; i < e; ++i) lane[0] += x[i] * x[i];
    for (const float v : lane) total += v;
  }
  return total;
}

}  // namespace

bool has_exact_inverse(float x) {
  int e = 0;
  const float m = std::frexp(x, &e);
  const float inv = 1.0f / x;
  return std::isfinite(x) && x != 0.0f && std::abs(m) == 0.5f && std::isfinite(inv) &&
         inv * x == 1.0f;
}

void round_to(Out kind, const float* p, void* out, int64_t n) {
  with_out(kind, [&](auto k) {
    if constexpr (decltype(k)::value != Out::kNone) round_kernel<decltype(k)::value>(p, out, n);
  });
}

at::Tensor view(float* ptr, int64_t n) { return at::from_blob(ptr, {n}, at::kFloat); }

RemainderGrad remainder_grad(const float* g, int64_t n, float grad_scale) {
  RemainderGrad out;
  out.grad = at::from_blob(const_cast<float*>(g), {n}, at::kFloat).clone();
  if (grad_scale != 1.0f) out.scale = at::full({1}, grad_scale, at::kFloat);
  return out;
}

Rounding pick_rounding(const char* what, const std::function<int64_t(Rounding)>& mismatches) {
  const int64_t fused = mismatches(Rounding::kFused);
  if (fused == 0) return Rounding::kFused;
  const int64_t rounded = mismatches(Rounding::kRounded);
  if (rounded == 0) return Rounding::kRounded;
  TORCH_WARN("zero: the offloaded ", what, " rounds differently from this torch build's fused CPU ",
             what, " (CPU capability ", at::get_cpu_capability(), ": ", std::min(fused, rounded),
             " probe updates differ by an ulp): on a CPU, offloaded and non-offloaded runs will "
             "agree to ~1e-7, not bit for bit (on a GPU the device's kernels round otherwise in "
             "any case)");
  return fused <= rounded ? Rounding::kFused : Rounding::kRounded;
}

HostOptimizerBase::HostOptimizerBase(int64_t numel, std::vector<ParamGroup> groups,
                                     const at::TensorOptions& opts,
                                     const HostOptimizerOptions& host)
    : HostShardOptimizer(numel, std::move(groups), opts, host.threads), pin_(host.pin_memory) {
  TORCH_CHECK(opts.device().is_cpu(),
              "zero: the CPU optimizer's shard must be in host memory, got ", opts.device());
}

at::Tensor HostOptimizerBase::state_zeros() const { return device::host_zeros(numel(), pin_); }

void HostOptimizerBase::update_to(at::Tensor& param, const at::Tensor& grad, double lr,
                                  const Scalars& s, Range window, const at::Tensor& out) {
  require_no_grad_mul(s);
  TORCH_CHECK(window.begin >= 0 && window.begin <= window.end && window.end <= numel(),
              "zero: update window [", window.begin, ", ", window.end, ") outside the shard");
  TORCH_CHECK(param.is_cpu() && grad.is_cpu(), "zero: ", name(),
              " updates host tensors; got param on ", param.device(), ", grad on ", grad.device());
  // The kernels index both in shard coordinates.
  TORCH_CHECK(param.numel() == numel() && grad.numel() == numel() && param.is_contiguous() &&
                  grad.is_contiguous() && param.scalar_type() == at::kFloat &&
                  grad.scalar_type() == at::kFloat,
              "zero: ", name(), " takes the whole shard's fp32 contiguous master and gradient (",
              numel(), " elements); got ", param.numel(), " (", param.scalar_type(), ") and ",
              grad.numel(), " (", grad.scalar_type(), ")");
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
    for_chunks(window, [&](int64_t b, int64_t e) { round_to(kind, p + b, out_at(b), e - b); });
    return;
  }
  // Each group's runs inside the window, each one parallel pass at the group's lr and decay over
  // its whole vectors (counted from the slice's start, as ATen counts them in the same slice
  // without offload), then the remainder.
  float* p = param.data_ptr<float>();
  const float* g = grad.data_ptr<float>();
  for (const ParamGroup& group : groups()) {
    const double group_lr = lr * group.lr_scale;
    for (const Range& r : group.ranges) {
      const int64_t b = std::max(r.begin, window.begin), e = std::min(r.end, window.end);
      if (b >= e) continue;
      const int64_t body_end = e - (e - b) % kRemainderAlign;
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

at::Tensor HostOptimizerBase::squared_norm(const at::Tensor& grad,
                                           const std::vector<Range>& pieces) {
  TORCH_CHECK(
      grad.is_cpu() && grad.scalar_type() == at::kFloat && grad.dim() == 1 && grad.is_contiguous(),
      "zero: ", name(), ".squared_norm takes the host fp32 gradient shard, got ",
      grad.scalar_type(), " on ", grad.device());
  // Fixed chunks, each summed in double: the result depends on neither the thread count nor
  // the order the threads finish in.
  constexpr int64_t kChunk = int64_t{1} << 20;
  std::vector<Range> chunks;
  for (const Range& r : pieces) {
    TORCH_CHECK(r.begin >= 0 && r.begin <= r.end && r.end <= grad.numel(), "zero: norm piece [",
                r.begin, ", ", r.end, ") outside the shard of ", grad.numel());
    for (int64_t b = r.begin; b < r.end; b += kChunk)
      chunks.push_back({b, std::min(r.end, b + kChunk)});
  }
  const float* g = grad.data_ptr<float>();
  std::vector<double> parts(chunks.size());
  const auto reduce = [&](size_t k) {
    parts[k] = sum_of_squares(g + chunks[k].begin, chunks[k].end - chunks[k].begin);
  };
  if (threads_ <= 1 || chunks.size() <= 1) {
    for (size_t k = 0; k < chunks.size(); ++k) reduce(k);
  } else {
    if (!pool_) pool_ = std::make_unique<c10::ThreadPool>(threads_ - 1);
    // The pool's threads and this one take chunks in turn (the kernel does not throw).
    std::atomic<size_t> next{0};
    const auto drain = [&] {
      for (size_t k = next++; k < chunks.size(); k = next++) reduce(k);
    };
    for (int t = 0; t < threads_ - 1; ++t) pool_->run(drain);
    drain();
    // `parts` and the gradient are this frame's: nothing returns before every chunk ran.
    pool_->waitWorkComplete();
  }
  double total = 0;
  for (const double p : parts) total += p;
  return at::full({1}, static_cast<float>(total), at::kFloat);
}

// Splits [b, e) into pieces of at least kGrain elements, run in parallel: with threads_ > 0 on
// exactly that many threads (this thread and a pool of its own), whatever torch's intra-op
// setting is (torchrun sets OMP_NUM_THREADS=1, which would leave the step one core per rank);
// with 0 on torch's intra-op threads. Each element's result does not depend on the split.
template <typename F>
void HostOptimizerBase::for_chunks(Range r, F&& f) {
  constexpr int64_t kGrain = 1 << 15;  // 128 KiB of fp32: below it threads cost more than they save
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

}  // namespace zero::optim::host
