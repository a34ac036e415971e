#include "optim/adamw.hpp"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <cmath>

namespace zero::optim {
namespace {

// One pass of ATen's fused AdamW kernel per parameter group: it reads param, grad and both
// moments once and writes param and the moments once (28 bytes per element), where the op-by-op
// form (torch::optim::AdamW) makes ~9 passes. The arithmetic is torch's AdamW in fp32 registers;
// it rounds differently from the op-by-op form (a few ulp of the parameter after tens of steps,
// tests/test_optim.cpp).
class AdamW final : public ShardOptimizer {
 public:
  AdamW(const AdamWOptions& o, int64_t numel, std::vector<ParamGroup> groups,
        const at::TensorOptions& opts)
      : ShardOptimizer(numel, std::move(groups), opts),
        o_(o),
        exp_avg_(zeros()),
        exp_avg_sq_(zeros()),
        step_(at::zeros({}, opts)) {}

  // The kernel reads the step from a tensor; filled from the host count (no read back).
  void on_begin_step() override { step_.fill_(static_cast<double>(steps_)); }

  void update(at::Tensor& param, const at::Tensor& grad, double lr, const Scalars& s,
              Range window) override {
    at::NoGradGuard no_grad;
    require_no_grad_mul(s);
    for (const ParamGroup& g : groups()) {
      std::vector<at::Tensor> p = slices(param, g, window);
      if (p.empty()) continue;
      std::vector<at::Tensor> steps(p.size(), step_);
      at::_fused_adamw_(p, grad_slices(grad, g, window), slices(exp_avg_, g, window),
                        slices(exp_avg_sq_, g, window), {}, steps, lr * g.lr_scale, o_.beta1,
                        o_.beta2, g.weight_decay.value_or(o_.weight_decay), o_.eps,
                        /*amsgrad=*/false,
                        /*maximize=*/false, opt(s.grad_scale), opt(s.found_inf));
    }
  }

  std::vector<std::pair<std::string, at::Tensor>> state() const override {
    return {{"exp_avg", exp_avg_}, {"exp_avg_sq", exp_avg_sq_}};
  }
  std::string name() const override { return "adamw"; }

 private:
  static std::optional<at::Tensor> opt(const at::Tensor& t) {
    return t.defined() ? std::optional<at::Tensor>(t) : std::nullopt;
  }

  AdamWOptions o_;
  at::Tensor exp_avg_;
  at::Tensor exp_avg_sq_;
  at::Tensor step_;  // fp32 scalar on the device, as the fused kernel wants its step count
};

}  // namespace

std::unique_ptr<ShardOptimizer> make_grouped_adamw(const AdamWOptions& options, int64_t numel,
                                                   std::vector<ParamGroup> groups,
                                                   const at::TensorOptions& opts) {
  // The same bounds torch::optim::AdamW enforces, with the config key to fix.
  TORCH_CHECK(options.beta1 >= 0 && options.beta1 < 1, "zero: AdamW beta1 must be in [0, 1), got ",
              options.beta1, " (optimizer.betas[0] in the config)");
  TORCH_CHECK(options.beta2 >= 0 && options.beta2 < 1, "zero: AdamW beta2 must be in [0, 1), got ",
              options.beta2, " (optimizer.betas[1] in the config)");
  TORCH_CHECK(options.eps >= 0, "zero: AdamW eps must be >= 0, got ", options.eps);
  TORCH_CHECK(options.weight_decay >= 0, "zero: AdamW weight_decay must be >= 0, got ",
              options.weight_decay);
  if (options.op_by_op) return detail::make_op_by_op_adamw(options, numel, std::move(groups), opts);
  return std::make_unique<AdamW>(options, numel, std::move(groups), opts);
}

std::unique_ptr<ShardOptimizer> make_adamw(const AdamWOptions& options, int64_t numel,
                                           std::vector<Range> decay_ranges,
                                           const at::TensorOptions& opts) {
  return make_grouped_adamw(options, numel, decay_groups(numel, std::move(decay_ranges)), opts);
}

}  // namespace zero::optim
