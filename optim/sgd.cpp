#include "optim/sgd.hpp"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <cmath>

namespace zero::optim {
namespace {

class Sgd final : public ShardOptimizer {
 public:
  Sgd(const SgdOptions& o, int64_t numel, std::vector<Range> decay_ranges,
      const at::TensorOptions& opts)
      : ShardOptimizer(numel, std::move(decay_ranges), opts), o_(o) {
    if (o_.momentum != 0) momentum_buffer_ = zeros();
    if (decays() || o_.nesterov) scratch_ = at::empty({numel}, opts);
  }

  // Follows torch/csrc/api/src/optim/sgd.cpp op for op; where torch makes a new tensor
  // (d_p = grad + wd * p, d_p + momentum * buf) the result goes into scratch_ instead.
  void step(at::Tensor& param, const at::Tensor& grad, double lr) override {
    check_step_args(param, grad, lr);
    at::NoGradGuard no_grad;
    const at::Tensor* d_p = &grad;
    if (decays()) {
      if (decays_everything()) {
        at::add_out(scratch_, grad, param, o_.weight_decay);
      } else {
        scratch_.copy_(grad);
        for (const Range& r : decay_ranges()) {
          scratch_.slice(0, r.begin, r.end).add_(param.slice(0, r.begin, r.end), o_.weight_decay);
        }
      }
      d_p = &scratch_;
    }
    if (o_.momentum != 0) {
      // torch starts the buffer as a copy of the first (decayed) gradient, without dampening.
      if (steps_ == 0) {
        momentum_buffer_.copy_(*d_p);
      } else {
        momentum_buffer_.mul_(o_.momentum).add_(*d_p, 1 - o_.dampening);
      }
      if (o_.nesterov) {
        if (d_p == &scratch_) {
          scratch_.add_(momentum_buffer_, o_.momentum);
        } else {
          at::add_out(scratch_, grad, momentum_buffer_, o_.momentum);
        }
        d_p = &scratch_;
      } else {
        d_p = &momentum_buffer_;
      }
    }
    param.add_(*d_p, -lr);
    ++steps_;
  }

  std::vector<std::pair<std::string, at::Tensor>> state() const override {
    if (!momentum_buffer_.defined()) return {};
    return {{"momentum_buffer", momentum_buffer_}};
  }
  int64_t scratch_bytes() const override {
    return scratch_.defined() ? static_cast<int64_t>(scratch_.nbytes()) : 0;
  }
  std::string name() const override { return "sgd"; }

 private:
  bool decays() const { return o_.weight_decay != 0 && decays_anything(); }

  SgdOptions o_;
  at::Tensor momentum_buffer_;
  at::Tensor scratch_;  // d_p when it differs from grad; contents do not outlive a step
};

}  // namespace

std::unique_ptr<ShardOptimizer> make_sgd(const SgdOptions& options, int64_t numel,
                                         std::vector<Range> decay_ranges,
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
  return std::make_unique<Sgd>(options, numel, std::move(decay_ranges), opts);
}

}  // namespace zero::optim
