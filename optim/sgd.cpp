#include "optim/sgd.hpp"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <cmath>

namespace zero::optim {
namespace {

// ATen's fused SGD, one pass per parameter group: torch::optim::SGD's update (coupled weight
// decay, momentum started as a copy of the first gradient, dampening, Nesterov) without the d_p
// temporaries, so no scratch buffer either.
class Sgd final : public ShardOptimizer {
 public:
  Sgd(const SgdOptions& o, int64_t numel, std::vector<ParamGroup> groups,
      const at::TensorOptions& opts)
      : ShardOptimizer(numel, std::move(groups), opts), o_(o) {
    if (o_.momentum != 0) momentum_buffer_ = zeros();
  }

  void update(at::Tensor& param, const at::Tensor& grad, double lr, const Scalars& s,
              Range window) override {
    at::NoGradGuard no_grad;
    require_no_grad_mul(s);
    const bool first = steps_ == 1;  // begin_step() counted this one already
    for (const ParamGroup& g : groups()) {
      std::vector<at::Tensor> p = slices(param, g, window);
      if (p.empty()) continue;
      std::vector<at::Tensor> buf;
      if (momentum_buffer_.defined()) buf = slices(momentum_buffer_, g, window);
      at::_fused_sgd_(p, grad_slices(grad, g, window), buf,
                      g.weight_decay.value_or(o_.weight_decay), o_.momentum, lr * g.lr_scale,
                      o_.dampening, o_.nesterov, /*maximize=*/false, first, opt(s.grad_scale),
                      opt(s.found_inf));
    }
  }

  std::vector<std::pair<std::string, at::Tensor>> state() const override {
    if (!momentum_buffer_.defined()) return {};
    return {{"momentum_buffer", momentum_buffer_}};
  }
  std::string name() const override { return "sgd"; }

 private:
  static std::optional<at::Tensor> opt(const at::Tensor& t) {
    return t.defined() ? std::optional<at::Tensor>(t) : std::nullopt;
  }

  SgdOptions o_;
  at::Tensor momentum_buffer_;
};

}  // namespace

std::unique_ptr<ShardOptimizer> make_grouped_sgd(const SgdOptions& options, int64_t numel,
                                                 std::vector<ParamGroup> groups,
                                                 const at::TensorOptions& opts) {
  // The same bounds torch::optim::SGD enforces, with the fix spelled out.
  TORCH_CHECK(options.momentum >= 0, "zero: SGD momentum must be >= 0, got ", options.momentum);
  TORCH_CHECK(std::isfinite(options.dampening), "zero: SGD dampening must be finite, got ",
              options.dampening);
  TORCH_CHECK(options.weight_decay >= 0, "zero: SGD weight_decay must be >= 0, got ",
              options.weight_decay);
  TORCH_CHECK(!options.nesterov || (options.momentum > 0 && options.dampening == 0),
              "zero: SGD nesterov needs momentum > 0 and dampening == 0, got momentum ",
              options.momentum, " and dampening ", options.dampening,
              "; set them or turn nesterov off");
  return std::make_unique<Sgd>(options, numel, std::move(groups), opts);
}

std::unique_ptr<ShardOptimizer> make_sgd(const SgdOptions& options, int64_t numel,
                                         std::vector<Range> decay_ranges,
                                         const at::TensorOptions& opts) {
  return make_grouped_sgd(options, numel, decay_groups(numel, std::move(decay_ranges)), opts);
}

}  // namespace zero::optim
