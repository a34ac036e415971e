// AdamW as torch.optim.AdamW computes it on the CPU (its single-tensor form; the foreach form
// rounds the same): one ATen op at a time, each rounding to fp32. DeepSpeed's `torch_adam: true`
// runs exactly that, so this is what zero runs for it: with the same gradients it lands on
// torch's parameters bit for bit, where the fused kernel (adamw.cpp) differs by an ulp here and
// there, which bf16 weights turn into a different rounding after tens of steps. It costs ~9
// passes over the shard and two window-sized temporaries, where the fused kernel makes one pass.
#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <cmath>

#include "optim/adamw.hpp"

namespace zero::optim {
namespace {

class OpByOpAdamW final : public ShardOptimizer {
 public:
  OpByOpAdamW(const AdamWOptions& o, int64_t numel, std::vector<ParamGroup> groups,
              const at::TensorOptions& opts)
      : ShardOptimizer(numel, std::move(groups), opts),
        o_(o),
        exp_avg_(zeros()),
        exp_avg_sq_(zeros()) {}

  void on_begin_step() override { skip_known_ = false; }

  void update(at::Tensor& param, const at::Tensor& grad, double lr, const Scalars& s,
              Range window) override {
    at::NoGradGuard no_grad;
    // The ops cannot be masked on the device as the fused kernel masks itself: the verdict is
    // read once per step (a host sync, as DeepSpeed's own overflow check is).
    if (!skip_known_) {
      skip_ = s.found_inf.defined() && s.found_inf.item<float>() != 0;
      skip_known_ = true;
    }
    if (skip_) return;
    // torch's step count is a float; the bias corrections are Python floats (doubles).
    const double step = static_cast<double>(steps_);
    const double bias_correction1 = 1 - std::pow(o_.beta1, step);
    const double bias_correction2_sqrt = std::pow(1 - std::pow(o_.beta2, step), 0.5);
    for (const ParamGroup& g : groups()) {
      std::vector<at::Tensor> p = slices(param, g, window);
      if (p.empty()) continue;
      std::vector<at::Tensor> gr = grad_slices(grad, g, window);
      std::vector<at::Tensor> m = slices(exp_avg_, g, window);
      std::vector<at::Tensor> v = slices(exp_avg_sq_, g, window);
      const double group_lr = lr * g.lr_scale;
      const double decay = g.weight_decay.value_or(o_.weight_decay);
      for (size_t i = 0; i < p.size(); ++i) {
        // The engine's averaging (and loss scale) first, then DeepSpeed's clip multiplier, as
        // DeepSpeed's unscale_and_clip_grads hands torch the gradient.
        at::Tensor d = s.grad_scale.defined() ? gr[i] / s.grad_scale : gr[i];
        if (s.grad_mul.defined()) d = d.mul_(s.grad_mul);
        if (decay != 0) p[i].mul_(1 - group_lr * decay);
        m[i].lerp_(d, 1 - o_.beta1);
        v[i].mul_(o_.beta2).addcmul_(d, d, 1 - o_.beta2);
        const at::Tensor denom = (v[i].sqrt() / bias_correction2_sqrt).add_(o_.eps);
        p[i].addcdiv_(m[i], denom, -(group_lr / bias_correction1));
      }
    }
  }

  std::vector<std::pair<std::string, at::Tensor>> state() const override {
    return {{"exp_avg", exp_avg_}, {"exp_avg_sq", exp_avg_sq_}};
  }
  // The same name and state as the fused AdamW: checkpoints move between the two.
  std::string name() const override { return "adamw"; }

 private:
  AdamWOptions o_;
  at::Tensor exp_avg_;
  at::Tensor exp_avg_sq_;
  bool skip_known_ = false, skip_ = false;
};

}  // namespace

std::unique_ptr<ShardOptimizer> detail::make_op_by_op_adamw(const AdamWOptions& options,
                                                            int64_t numel,
                                                            std::vector<ParamGroup> groups,
                                                            const at::TensorOptions& opts) {
  return std::make_unique<OpByOpAdamW>(options, numel, std::move(groups), opts);
}

}  // namespace zero::optim
