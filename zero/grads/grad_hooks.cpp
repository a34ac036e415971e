#include "zero/grads/grad_hooks.hpp"

#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

namespace zero {
namespace {

using torch::autograd::PostAccumulateGradHook;

class EngineHook final : public PostAccumulateGradHook {
 public:
  EngineHook(GradHooks* owner, int slot, std::unique_ptr<PostAccumulateGradHook> previous)
      : owner_(owner), slot_(slot), previous_(std::move(previous)) {}

  void operator()(const torch::autograd::Variable& param) override {
    if (previous_) (*previous_)(param);
    owner_->deliver(slot_, param);
  }

  GradHooks* owner() const { return owner_; }
  std::unique_ptr<PostAccumulateGradHook> take_previous() { return std::move(previous_); }

 private:
  GradHooks* owner_;
  int slot_;
  std::unique_ptr<PostAccumulateGradHook> previous_;
};

}  // namespace

void GradHooks::install(const std::vector<at::Tensor>& params, GradSink on_grad,
                        TakenOverSink on_taken_over) {
  on_grad_ = std::move(on_grad);
  on_taken_over_ = std::move(on_taken_over);
  params_ = params;
  layout_index_.resize(params.size());
  mine_.resize(params.size());
  for (size_t i = 0; i < params.size(); ++i) {
    auto& slot = torch::autograd::impl::post_acc_grad_hooks(params[i]);
    std::unique_ptr<PostAccumulateGradHook> previous = std::move(slot);
    if (auto* other = dynamic_cast<EngineHook*>(previous.get())) {
      other->owner()->taken_over();
      previous = other->take_previous();
    }
    auto hook = std::make_unique<EngineHook>(this, static_cast<int>(i), std::move(previous));
    mine_[i] = hook.get();
    layout_index_[i] = static_cast<int>(i);
    torch::autograd::impl::set_post_acc_grad_hooks(params[i], std::move(hook));
  }
}

void GradHooks::remove() {
  for (size_t i = 0; i < params_.size(); ++i) {
    auto& slot = torch::autograd::impl::post_acc_grad_hooks(params_[i]);
    if (slot.get() != mine_[i]) continue;  // someone else's now: leave it alone
    auto* hook = static_cast<EngineHook*>(slot.get());
    torch::autograd::impl::set_post_acc_grad_hooks(params_[i], hook->take_previous());
  }
  params_.clear();
  mine_.clear();
}

void GradHooks::deliver(int slot, const at::Tensor& param) { on_grad_(layout_index_[slot], param); }

void GradHooks::taken_over() {
  // The hooks themselves now belong to the newer engine, which destroys them.
  params_.clear();
  mine_.clear();
  if (on_taken_over_) on_taken_over_();
}

}  // namespace zero
