#include "zero/units/unit_function.hpp"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <ATen/core/ivalue.h>
#include <c10/util/Exception.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/nn/module.h>

#include <string>
#include <utility>

#include "zero/sharding.hpp"
#include "zero/units/unit_registry.hpp"

namespace zero::units {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

struct BoundaryState : torch::CustomClassHolder {
  std::weak_ptr<UnitRuntime> runtime;
  int unit = -1;
  std::string name;  // for the error when the runtime is gone
};

struct UnitBoundary : torch::autograd::Function<UnitBoundary> {
  static variable_list forward(AutogradContext* ctx, at::TensorList outputs,
                               const c10::intrusive_ptr<BoundaryState>& state) {
    variable_list result(outputs.begin(), outputs.end());
    // Outputs that did not require grad keep not requiring it: the boundary is an identity for
    // autograd too, never a reason for gradients to flow where they did not.
    variable_list non_differentiable;
    for (const at::Tensor& t : result) {
      if (!t.requires_grad()) non_differentiable.push_back(t);
    }
    if (!non_differentiable.empty()) ctx->mark_non_differentiable(non_differentiable);
    ctx->saved_data["unit"] = c10::IValue::make_capsule(state);
    ctx->set_materialize_grads(false);
    return result;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto found = ctx->saved_data.find("unit");
    TORCH_INTERNAL_ASSERT(found != ctx->saved_data.end());
    auto state = c10::static_intrusive_pointer_cast<BoundaryState>(found->second.toCapsule());
    const std::shared_ptr<UnitRuntime> rt = state->runtime.lock();
    TORCH_CHECK(rt != nullptr, "zero::run_unit: backward reached unit '", state->name,
                "' after the engine that gathers it was destroyed; run backward before "
                "destroying the engine (or drop the graph).");
    // Issue first, then the prefetches behind it, then wait: the gathers overlap each other.
    if (!rt->gathered(state->unit)) rt->gather(state->unit);
    rt->entered_backward(state->unit);
    rt->prefetch();
    rt->wait(state->unit);
    grads.emplace_back();  // the state argument
    return grads;
  }
};

}  // namespace

std::vector<at::Tensor> unit_boundary(std::vector<at::Tensor> outputs,
                                      const std::shared_ptr<UnitRuntime>& runtime, int unit) {
  // Only defined tensors that some gradient could reach pass through the Function.
  std::vector<size_t> through;
  for (size_t i = 0; i < outputs.size(); ++i) {
    if (outputs[i].defined() && outputs[i].requires_grad()) through.push_back(i);
  }
  if (through.empty()) return outputs;
  std::vector<at::Tensor> in;
  in.reserve(through.size());
  for (size_t i : through) in.push_back(outputs[i]);
  auto state = c10::make_intrusive<BoundaryState>();
  state->runtime = runtime;
  state->unit = unit;
  state->name = runtime->unit_name(unit);
  variable_list out = UnitBoundary::apply(at::TensorList(in), state);
  for (size_t k = 0; k < through.size(); ++k) outputs[through[k]] = std::move(out[k]);
  return outputs;
}

bool is_unit_boundary(const torch::autograd::Node& node) {
  return dynamic_cast<const torch::autograd::CppNode<UnitBoundary>*>(&node) != nullptr;
}

}  // namespace zero::units

namespace zero {

std::vector<at::Tensor> run_unit(torch::nn::Module& module, const Block& fn,
                                 const std::vector<at::Tensor>& inputs) {
  TORCH_CHECK(fn, "zero::run_unit: the block is an empty std::function.");
  const std::optional<units::Binding> b = units::find(module);
  if (!b) return fn(inputs);
  units::UnitRuntime& rt = *b->runtime;
  const int u = b->unit;
  // In backward this is a checkpoint's recomputation: the unit's entry into backward is its
  // boundary's, and it stays gathered until its gradients are launched (§3.4).
  const bool recompute = rt.in_backward();
  if (!rt.gathered(u)) rt.gather(u);
  if (!recompute) {
    rt.entered_forward(u);
    rt.prefetch();
  }
  rt.wait(u);
  std::vector<at::Tensor> outputs;
  try {
    outputs = fn(inputs);
  } catch (...) {
    // No backward will come for this pass; don't hold the unit's memory until the next one.
    if (!recompute && rt.gathered(u)) {
      try {
        rt.release(u);
      } catch (...) {
      }
    }
    throw;
  }
  const bool grad = at::GradMode::is_enabled();
  if (grad) outputs = units::unit_boundary(std::move(outputs), b->runtime, u);
  // Eval (and a checkpoint's no-grad forward) releases at once: no backward will need it.
  if (!recompute && !(grad && rt.keep_after_forward(u))) rt.release(u);
  return outputs;
}

at::Tensor run_unit(torch::nn::Module& module,
                    const std::function<at::Tensor(const at::Tensor&)>& fn, const at::Tensor& x) {
  TORCH_CHECK(fn, "zero::run_unit: the block is an empty std::function.");
  if (!units::find(module)) return fn(x);
  const Block block = [&fn](const std::vector<at::Tensor>& in) {
    return std::vector<at::Tensor>{fn(in.at(0))};
  };
  return run_unit(module, block, {x}).at(0);
}

}  // namespace zero
