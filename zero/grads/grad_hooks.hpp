// The post-accumulate-grad hooks through which autograd hands each parameter's gradient to the
// engine.
//
// A tensor has one hook slot. An engine keeps what was in it (a user's hook: called first, as it
// was registered first) and puts it back when it goes, and clears only slots that still hold its
// own hooks. A second zero::initialize on a model a live engine owns takes the model over, as
// `engine = zero::initialize(model, cfg)` in a loop expects: the new engine re-points the
// parameters at its own flat buffer anyway, so the old one could only train nothing. The old
// engine learns it and its backward() says so (DDP and DeepSpeed instead let both reduce, or
// neither, silently).
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>
#include <vector>

namespace zero {

class GradHooks {
 public:
  GradHooks() = default;
  GradHooks(const GradHooks&) = delete;
  GradHooks& operator=(const GradHooks&) = delete;
  ~GradHooks() { remove(); }

  // Where the hooks deliver: a gradient of parameter `index` (layout order) has arrived; and
  // a newer engine's hooks replaced these. The hooks know nothing else of the engine.
  using GradSink = std::function<void(int index, const at::Tensor& param)>;
  using TakenOverSink = std::function<void()>;

  // Hooks `params` (layout order) so that their gradients reach on_grad(layout index).
  void install(const std::vector<at::Tensor>& params, GradSink on_grad,
               TakenOverSink on_taken_over);
  // Removes this engine's hooks, restoring what they had replaced.
  void remove();

  // From a hook: parameter number `slot` (its install-time index) has a gradient.
  void deliver(int slot, const at::Tensor& param);
  // From a newer engine's install(): that engine owns the hooks now.
  void taken_over();

 private:
  GradSink on_grad_;
  TakenOverSink on_taken_over_;
  std::vector<at::Tensor> params_;  // install order
  std::vector<int> layout_index_;   // per install slot
  std::vector<const void*> mine_;   // per install slot: the hook object this engine put there
};

}  // namespace zero
