// The optimizer interface over one rank's flat fp32 shard.
//
// The engine keeps the rank's master weights as one contiguous 1-D fp32 tensor and hands the
// reduced gradient as another of the same size. An optimizer owns its state tensors (each the
// shard's size) and updates the shard in one fused pass per parameter group (ATen's
// _fused_adamw_ / _fused_sgd_, on CPU and CUDA alike), so a step reads and writes each element
// once and its cost does not grow with the number of model parameters.
//
// The engine's per-step scalars stay on the device: the gradient is divided by `grad_scale`
// inside the kernel (unscale, averaging and the clip coefficient folded into one number) and
// the kernel does nothing where `found_inf` is 1, so no step needs the host to look at a value.
//
// Header-only on purpose: the base class is a few checks and a range list, and keeping it here
// leaves each optimizer a single translation unit.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/ops/zeros.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace zero::optim {

// Element range [begin, end) inside the shard.
struct Range {
  int64_t begin;
  int64_t end;
};

// Shard elements that share options, torch.optim's param group over a flat shard: one fused
// call each per step.
struct ParamGroup {
  std::vector<Range> ranges;  // sorted, disjoint; adjacent ones are merged, empty ones dropped
  double lr_scale = 1.0;      // the group's lr: the step's lr times this
  std::optional<double> weight_decay;  // unset: the optimizer's own weight_decay
};

namespace detail {
inline std::vector<Range> merged(const std::vector<Range>& sorted) {
  std::vector<Range> out;
  for (const Range& r : sorted) {
    if (r.begin == r.end) continue;
    if (!out.empty() && out.back().end == r.begin) {
      out.back().end = r.end;
    } else {
      out.push_back(r);
    }
  }
  return out;
}

// Validated: inside [0, numel), sorted and disjoint; empty ones dropped, adjacent ones merged
// (fewer, larger ops per step).
inline std::vector<Range> checked(int64_t numel, const std::vector<Range>& ranges) {
  int64_t prev_end = 0;
  for (const Range& r : ranges) {
    TORCH_CHECK(r.begin >= 0 && r.begin <= r.end && r.end <= numel, "zero: decay range [", r.begin,
                ", ", r.end, ") is not inside the shard [0, ", numel, ")");
    TORCH_CHECK(r.begin >= prev_end, "zero: decay ranges must be sorted and disjoint; [", r.begin,
                ", ", r.end, ") starts before the previous one ends at ", prev_end);
    prev_end = r.end;
  }
  return merged(ranges);
}
}  // namespace detail

// `decay`: sorted, disjoint ranges inside [0, numel) whose elements get the optimizer's weight
// decay; the rest get none. Two groups, both at the step's lr.
inline std::vector<ParamGroup> decay_groups(int64_t numel, std::vector<Range> decay) {
  std::vector<Range> keep;
  int64_t at = 0;
  for (const Range& r : detail::checked(numel, decay)) {
    if (r.begin > at) keep.push_back({at, r.begin});
    at = r.end;
  }
  if (at < numel) keep.push_back({at, numel});
  return {ParamGroup{std::move(decay), 1.0, std::nullopt}, ParamGroup{std::move(keep), 1.0, 0.0}};
}

class ShardOptimizer {
 public:
  virtual ~ShardOptimizer() = default;
  ShardOptimizer(const ShardOptimizer&) = delete;
  ShardOptimizer& operator=(const ShardOptimizer&) = delete;

  // Device scalars of one step: one-element fp32 tensors on the optimizer's device, or undefined
  // (grad_scale 1, found_inf 0).
  struct Scalars {
    at::Tensor grad_scale;  // the kernel uses grad / grad_scale
    at::Tensor found_inf;   // 1: leave params and state untouched (fp16 overflow, NaN norm)
    // Then times this: DeepSpeed's clip, grad * (1 / coefficient), as its own rounding step.
    // Only the op-by-op AdamW takes it; the fused kernels fold the clip into grad_scale.
    at::Tensor grad_mul;
  };

  // One step; param and grad are 1-D contiguous fp32 tensors of numel() on the optimizer's
  // device; lr for this step. The gradient is consumed: a kernel may overwrite it (CPU fused
  // SGD folds weight decay into it in place), which saves a shard-sized scratch buffer.
  // steps() counts the call even when found_inf skips it on the device: the engine, which
  // learns of the skip later, calls undo_step().
  void step(at::Tensor& param, const at::Tensor& grad, double lr, const Scalars& scalars) {
    begin_step(param, grad, lr);
    update(param, grad, lr, scalars, {0, numel_});
  }
  void step(at::Tensor& param, const at::Tensor& grad, double lr) {
    step(param, grad, lr, Scalars{});
  }
  // The same step in pieces, so the engine can all-gather a bucket while the next one is
  // updated: begin_step() once, then update() over windows that together cover the shard once.
  // update()'s grad is the whole shard, or only the window's elements (grad[0] is element
  // window.begin): a gradient kept in a narrower dtype is then converted to fp32 one window at
  // a time instead of as a whole-shard copy.
  void begin_step(const at::Tensor& param, const at::Tensor& grad, double lr) {
    check_operand("grad", grad);
    begin_step(param, lr);
  }
  // The same without a whole-shard gradient to check (each update() checks its own).
  void begin_step(const at::Tensor& param, double lr) {
    TORCH_CHECK(std::isfinite(lr) && lr >= 0, "zero: ", name(),
                ".step: lr must be finite and >= 0, got ", lr, "; check the lr schedule");
    check_operand("param", param);
    ++steps_;
    on_begin_step();
  }
  virtual void update(at::Tensor& param, const at::Tensor& grad, double lr, const Scalars& scalars,
                      Range window) = 0;
  // A step that found_inf skipped on the device does not count (bias correction, SGD's first
  // step).
  void undo_step() {
    TORCH_CHECK(steps_ > 0, "zero: ", name(), ".undo_step() before any step; this is a bug");
    --steps_;
  }

  // Named state tensors (each numel() fp32), for memory accounting and checkpoints. They alias
  // the optimizer's own storage, so a checkpoint loads by copying into them.
  virtual std::vector<std::pair<std::string, at::Tensor>> state() const = 0;

  // Working memory kept between steps (shard-sized buffers only; the fused kernels need none).
  // Not part of state(): it carries nothing from one step to the next, is never checkpointed.
  virtual int64_t scratch_bytes() const { return 0; }

  virtual std::string name() const = 0;

  // Steps taken so far (bias correction, first-step initialisation). A resumed run restores it
  // together with the state tensors.
  int64_t steps() const { return steps_; }
  void set_steps(int64_t steps) {
    TORCH_CHECK(steps >= 0, "zero: ", name(), ".set_steps(", steps,
                "): the step count must be >= 0; take it from the checkpoint being resumed");
    steps_ = steps;
  }

  int64_t numel() const { return numel_; }
  int64_t state_bytes() const {
    int64_t total = 0;
    for (const auto& entry : state()) total += static_cast<int64_t>(entry.second.nbytes());
    return total;
  }

  // The groups, as validated: together they cover the shard exactly once.
  const std::vector<ParamGroup>& groups() const { return groups_; }
  // The ranges that get the optimizer's own weight decay (groups without a weight_decay of
  // their own), merged.
  std::vector<Range> decay_ranges() const {
    std::vector<Range> out;
    for (const ParamGroup& g : groups_) {
      if (g.weight_decay) continue;
      out.insert(out.end(), g.ranges.begin(), g.ranges.end());
    }
    std::sort(out.begin(), out.end(), [](Range a, Range b) { return a.begin < b.begin; });
    return detail::merged(out);
  }

 protected:
  // `groups`: their ranges must cover [0, numel) exactly once.
  ShardOptimizer(int64_t numel, std::vector<ParamGroup> groups, const at::TensorOptions& opts)
      : numel_(numel), opts_(opts) {
    TORCH_CHECK(numel >= 0, "zero: the optimizer's shard numel must be >= 0, got ", numel);
    TORCH_CHECK(opts.dtype() == caffe2::TypeMeta::Make<float>(),
                "zero: optimizer state must be fp32 like the master weights, got ", opts.dtype(),
                "; pass the master shard's options (dtype at::kFloat)");
    std::vector<Range> all;
    for (ParamGroup& g : groups) {
      TORCH_CHECK(std::isfinite(g.lr_scale) && g.lr_scale >= 0,
                  "zero: a parameter group's lr_scale must be finite and >= 0, got ", g.lr_scale);
      TORCH_CHECK(!g.weight_decay || *g.weight_decay >= 0,
                  "zero: a parameter group's weight_decay must be >= 0, got ", *g.weight_decay);
      g.ranges = detail::checked(numel, g.ranges);
      all.insert(all.end(), g.ranges.begin(), g.ranges.end());
      if (!g.ranges.empty()) groups_.push_back(std::move(g));
    }
    std::sort(all.begin(), all.end(), [](Range a, Range b) { return a.begin < b.begin; });
    int64_t at = 0;
    for (const Range& r : all) {
      TORCH_CHECK(r.begin == at, "zero: the optimizer's parameter groups must cover the shard [0, ",
                  numel, ") exactly once; ", r.begin < at ? "two groups share" : "no group holds",
                  " element ", std::min(r.begin, at), "; this is a bug");
      at = r.end;
    }
    TORCH_CHECK(at == numel, "zero: the optimizer's parameter groups end at ", at,
                " but the shard has ", numel, " elements; this is a bug");
  }

  virtual void on_begin_step() {}

  // For the kernels that fold everything into grad_scale.
  void require_no_grad_mul(const Scalars& s) const {
    TORCH_CHECK(!s.grad_mul.defined(), "zero: ", name(),
                ".update got a separate gradient multiplier, which only the op-by-op AdamW "
                "(torch_adam) applies; this is a bug");
  }

  // The slices of `t` inside `window` that belong to group `g`: the tensor list of one fused
  // call. The whole of `t` when one group covers the shard and the window is the shard, so the
  // common case is one tensor.
  std::vector<at::Tensor> slices(const at::Tensor& t, const ParamGroup& g, Range window) const {
    return slices_from(t, 0, g, window);
  }
  // The same for update()'s gradient: the whole shard, or the window's elements only.
  std::vector<at::Tensor> grad_slices(const at::Tensor& grad, const ParamGroup& g,
                                      Range window) const {
    const int64_t w = window.end - window.begin;
    TORCH_CHECK(
        grad.defined() && grad.dim() == 1 && grad.is_contiguous() &&
            grad.scalar_type() == at::kFloat && (grad.numel() == numel_ || grad.numel() == w),
        "zero: ", name(),
        ".update: grad must be a contiguous 1-D fp32 tensor of the "
        "shard's ",
        numel_, " elements or of the window's ", w, "; convert the gradient window to fp32 first");
    return slices_from(grad, grad.numel() == numel_ ? 0 : window.begin, g, window);
  }

  // A zero-filled fp32 tensor of numel() on the optimizer's device.
  at::Tensor zeros() const { return at::zeros({numel_}, opts_); }

  int64_t steps_ = 0;

 private:
  void check_operand(const char* what, const at::Tensor& t) const {
    TORCH_CHECK(t.defined(), "zero: ", name(), ".step: ", what, " is undefined");
    TORCH_CHECK(t.dim() == 1 && t.numel() == numel_ && t.is_contiguous(), "zero: ", name(),
                ".step: ", what, " must be a contiguous 1-D tensor of the shard's ", numel_,
                " elements, got sizes ", t.sizes(), (t.is_contiguous() ? "" : " (non-contiguous)"));
    TORCH_CHECK(t.scalar_type() == at::kFloat, "zero: ", name(), ".step: ", what,
                " must be fp32, got ", t.scalar_type(),
                "; cast the reduced gradient to fp32 first");
    // "cuda" in the options means the current device; only an explicit index must match.
    const c10::Device want = opts_.device();
    TORCH_CHECK(t.device().type() == want.type() &&
                    (!want.has_index() || t.device().index() == want.index()),
                "zero: ", name(), ".step: ", what, " is on ", t.device(),
                " but the optimizer state is on ", want);
  }

  // `t`'s element 0 is shard element `base`.
  std::vector<at::Tensor> slices_from(const at::Tensor& t, int64_t base, const ParamGroup& g,
                                      Range window) const {
    std::vector<at::Tensor> out;
    for (const Range& r : g.ranges) {
      const int64_t b = std::max(r.begin, window.begin), e = std::min(r.end, window.end);
      if (b >= e) continue;
      out.push_back(b == base && e - base == t.numel() ? t : t.slice(0, b - base, e - base));
    }
    return out;
  }

  int64_t numel_;
  std::vector<ParamGroup> groups_;
  at::TensorOptions opts_;
};

}  // namespace zero::optim
