#include "optim/adamw.hpp"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <cmath>

namespace zero::optim {
namespace {

class AdamW final : public ShardOptimizer {
 public:
  AdamW(const AdamWOptions& o, int64_t numel, std::vector<Range> decay_ranges,
        const at::TensorOptions& opts)
      : ShardOptimizer(numel, std::move(decay_ranges), opts),
        o_(o),
        exp_avg_(zeros()),
        exp_avg_sq_(zeros()),
        denom_(at::empty({numel}, opts)) {}

  // The op sequence and the scalar arithmetic follow torch/csrc/api/src/optim/adamw.cpp line by
  // line, so each element sees the same roundings as under torch::optim::AdamW. In particular
  // the first moment is mul_().add_(), as in C++ torch; Python's lerp_() rounds differently.
  void step(at::Tensor& param, const at::Tensor& grad, double lr) override {
    check_step_args(param, grad, lr);
    at::NoGradGuard no_grad;
    if (o_.weight_decay != 0) {
      const double keep = 1 - lr * o_.weight_decay;
      for_each_decay_slice(param, [&](const at::Tensor& p) { p.mul_(keep); });
    }
    ++steps_;
    const double bias_correction1 = 1 - std::pow(o_.beta1, steps_);
    const double bias_correction2 = 1 - std::pow(o_.beta2, steps_);
    exp_avg_.mul_(o_.beta1).add_(grad, 1 - o_.beta1);
    exp_avg_sq_.mul_(o_.beta2).addcmul_(grad, grad, 1 - o_.beta2);
    at::sqrt_out(denom_, exp_avg_sq_);
    denom_.div_(std::sqrt(bias_correction2)).add_(o_.eps);
    param.addcdiv_(exp_avg_, denom_, -(lr / bias_correction1));
  }

  std::vector<std::pair<std::string, at::Tensor>> state() const override {
    return {{"exp_avg", exp_avg_}, {"exp_avg_sq", exp_avg_sq_}};
  }
  int64_t scratch_bytes() const override { return static_cast<int64_t>(denom_.nbytes()); }
  std::string name() const override { return "adamw"; }

 private:
  AdamWOptions o_;
  at::Tensor exp_avg_;
  at::Tensor exp_avg_sq_;
  at::Tensor denom_;  // sqrt(v)/sqrt(bc2)+eps, rebuilt each step; kept to avoid an allocation
};

}  // namespace

std::unique_ptr<ShardOptimizer> make_adamw(const AdamWOptions& options, int64_t numel,
                                           std::vector<Range> decay_ranges,
                                           const at::TensorOptions& opts) {
  // The same bounds torch::optim::AdamW enforces, with the config key to fix.
  TORCH_CHECK(options.beta1 >= 0 && options.beta1 < 1, "zero: AdamW beta1 must be in [0, 1), got ",
              options.beta1, " (optimizer.betas[0] in the config)");
  TORCH_CHECK(options.beta2 >= 0 && options.beta2 < 1, "zero: AdamW beta2 must be in [0, 1), got ",
              options.beta2, " (optimizer.betas[1] in the config)");
  TORCH_CHECK(options.eps >= 0, "zero: AdamW eps must be >= 0, got ", options.eps);
  TORCH_CHECK(options.weight_decay >= 0, "zero: AdamW weight_decay must be >= 0, got ",
              options.weight_decay);
  return std::make_unique<AdamW>(options, numel, std::move(decay_ranges), opts);
}

}  // namespace zero::optim
