#include <ATen/ATen.h>
#include <ATen/autocast_mode.h>
#include <ATen/core/grad_mode.h>
#include <ATen/core/ivalue.h>
#include <c10/util/Exception.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <mutex>
#include <optional>
#include <utility>

#include "offload/recompute_node.hpp"
#include "zero/activation_checkpointing.hpp"

namespace zero {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// States of the default generators a block may draw from: the CPU one, and the CUDA ones of the
// devices its inputs live on (as PyTorch's checkpoint does). Through at::Context, so no CUDA code.
struct RngStates {
  at::Tensor cpu;
  std::vector<std::pair<c10::Device, at::Tensor>> devices;
};

at::Generator default_generator(c10::Device device) {
  return at::globalContext().defaultGenerator(device);
}

// The generator's own mutex, which its samplers take too: never held across a block's run.
at::Tensor get_state(at::Generator gen) {
  std::lock_guard<std::mutex> lock(gen.mutex());
  return gen.get_state();
}

void set_state(at::Generator gen, const at::Tensor& state) {
  std::lock_guard<std::mutex> lock(gen.mutex());
  gen.set_state(state);
}

RngStates capture_rng(const std::vector<at::Tensor>& inputs) {
  RngStates s;
  s.cpu = get_state(default_generator(c10::Device(c10::kCPU)));
  for (const at::Tensor& t : inputs) {
    // Every accelerator tensor (CUDA, a registered backend) replays its device generator.
    if (!t.defined() || t.is_cpu()) continue;
    const c10::Device d = t.device();
    auto seen = [&](const auto& e) { return e.first == d; };
    if (std::none_of(s.devices.begin(), s.devices.end(), seen)) {
      s.devices.emplace_back(d, get_state(default_generator(d)));
    }
  }
  return s;
}

// Replays forward's random numbers for the recomputation, then puts the generators back where
// they were: the outer program's random stream is the same with checkpointing as without.
class RngFork {
 public:
  explicit RngFork(const RngStates& replay) {
    outer_.cpu = get_state(default_generator(c10::Device(c10::kCPU)));
    for (const auto& [device, state] : replay.devices) {
      outer_.devices.emplace_back(device, get_state(default_generator(device)));
    }
    apply(replay);
  }
  ~RngFork() {
    try {
      apply(outer_);
    } catch (const std::exception& e) {
      TORCH_WARN("zero::checkpoint: could not restore the RNG state after recomputation: ",
                 e.what());
    }
  }
  RngFork(const RngFork&) = delete;
  RngFork& operator=(const RngFork&) = delete;

 private:
  static void apply(const RngStates& s) {
    set_state(default_generator(c10::Device(c10::kCPU)), s.cpu);
    for (const auto& [device, state] : s.devices) set_state(default_generator(device), state);
  }
  RngStates outer_;
};

// Autocast is thread-local and backward runs with the state of the loss.backward() call, usually
// outside the autocast region: without a replay the recomputation would run in another precision
// than forward and produce gradients of a different function.
struct AutocastState {
  static constexpr c10::DeviceType kTypes[] = {c10::kCPU, c10::kCUDA};
  bool enabled[2] = {false, false};
  at::ScalarType dtype[2] = {at::kBFloat16, at::kHalf};
  bool cache = true;

  static AutocastState current() {
    AutocastState s;
    for (int i = 0; i < 2; ++i) {
      s.enabled[i] = at::autocast::is_autocast_enabled(kTypes[i]);
      s.dtype[i] = at::autocast::get_autocast_dtype(kTypes[i]);
    }
    s.cache = at::autocast::is_autocast_cache_enabled();
    return s;
  }
  void apply() const {
    for (int i = 0; i < 2; ++i) {
      at::autocast::set_autocast_enabled(kTypes[i], enabled[i]);
      at::autocast::set_autocast_dtype(kTypes[i], dtype[i]);
    }
    at::autocast::set_autocast_cache_enabled(cache);
  }
};

class AutocastReplay {
 public:
  explicit AutocastReplay(AutocastState replay) : outer_(AutocastState::current()) {
    // No weight-cast cache: it is cleared only when an outermost autocast region exits, which
    // never happens here, so cached casts of the weights would outlive the step.
    replay.cache = false;
    replay.apply();
  }
  ~AutocastReplay() { outer_.apply(); }
  AutocastReplay(const AutocastReplay&) = delete;
  AutocastReplay& operator=(const AutocastReplay&) = delete;

 private:
  AutocastState outer_;
};

// What backward needs beyond the saved inputs. Held by the graph node through a capsule in
// ctx->saved_data, so it lives exactly as long as the node.
struct CheckpointState : torch::CustomClassHolder {
  Block fn;
  size_t num_inputs = 0;     // the caller's inputs; a placeholder may follow (see checkpoint())
  size_t num_variables = 0;  // the Function's tensor inputs, placeholder included
  std::vector<bool> requires_grad;
  bool preserve_rng = true;
  RngStates rng;
  AutocastState autocast;
  std::optional<ActivationOffloader> offloader;
  int64_t block = -1;

  // A graph destroyed without backward would otherwise leave its host copy behind until reset().
  ~CheckpointState() override {
    if (offloader && block >= 0) offloader->release(block);
  }
};

struct CheckpointFunction : torch::autograd::Function<CheckpointFunction> {
  static variable_list forward(AutogradContext* ctx, at::TensorList variables,
                               const c10::intrusive_ptr<CheckpointState>& state) {
    CheckpointState& st = *state;
    const std::vector<at::Tensor> inputs(variables.begin(), variables.begin() + st.num_inputs);
    if (st.preserve_rng) st.rng = capture_rng(inputs);
    st.autocast = AutocastState::current();
    // Before the block runs, so that the copy to host overlaps the block's own kernels.
    if (st.offloader) st.block = st.offloader->offload(inputs);
    variable_list outputs;
    {
      // Already off inside a custom Function's forward; explicit because it is the whole point.
      at::NoGradGuard no_grad;
      outputs = st.fn(inputs);
    }
    variable_list non_differentiable;
    for (size_t i = 0; i < outputs.size(); ++i) {
      TORCH_CHECK(outputs[i].defined(), "zero::checkpoint: the block's output ", i,
                  " is undefined; a checkpointed block must return defined tensors.");
      if (!at::isFloatingType(outputs[i].scalar_type()) &&
          !at::isComplexType(outputs[i].scalar_type())) {
        non_differentiable.push_back(outputs[i]);
      }
    }
    if (!non_differentiable.empty()) ctx->mark_non_differentiable(non_differentiable);

    if (!st.offloader) ctx->save_for_backward(inputs);
    ctx->saved_data["state"] = c10::IValue::make_capsule(state);
    // Outputs the loss does not depend on get undefined grads instead of materialized zeros.
    ctx->set_materialize_grads(false);
    return outputs;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    auto found = ctx->saved_data.find("state");
    TORCH_CHECK(found != ctx->saved_data.end(),
                "zero::checkpoint: backward found no saved state; the graph's resources were "
                "released before this backward.");
    auto state = c10::static_intrusive_pointer_cast<CheckpointState>(found->second.toCapsule());
    CheckpointState& st = *state;

    const variable_list saved =
        st.offloader ? st.offloader->fetch(st.block) : ctx->get_saved_variables();
    TORCH_INTERNAL_ASSERT(saved.size() == st.num_inputs);
    // Fresh leaves: the recomputed graph ends at them, so their .grad is what flows back out.
    std::vector<at::Tensor> inputs(saved.size());
    for (size_t i = 0; i < saved.size(); ++i) {
      if (!saved[i].defined()) continue;
      inputs[i] = saved[i].detach();
      inputs[i].requires_grad_(st.requires_grad[i]);
    }

    variable_list outputs;
    {
      std::optional<RngFork> fork;
      if (st.preserve_rng) fork.emplace(st.rng);
      AutocastReplay autocast(st.autocast);
      at::AutoGradMode grad_mode(true);
      outputs = st.fn(inputs);
    }
    TORCH_CHECK(outputs.size() == grad_outputs.size(), "zero::checkpoint: the block returned ",
                outputs.size(), " outputs when recomputed in backward but ", grad_outputs.size(),
                " in forward; a checkpointed block must compute the same thing both times.");

    variable_list roots;
    variable_list grads;
    for (size_t i = 0; i < outputs.size(); ++i) {
      if (grad_outputs[i].defined() && outputs[i].requires_grad()) {
        roots.push_back(outputs[i]);
        grads.push_back(grad_outputs[i]);
      }
    }
    // A nested backward (allowed inside a backward, as in PyTorch's reentrant checkpoint). It
    // accumulates into the block's parameters like any backward, so their post-accumulate-grad
    // hooks fire here, during the outer backward, in the usual reverse order.
    if (!roots.empty()) torch::autograd::backward(roots, grads);

    // One gradient per tensor input, then an undefined one for the state argument.
    variable_list result(st.num_variables + 1);
    for (size_t i = 0; i < st.num_inputs; ++i) {
      if (st.requires_grad[i] && inputs[i].defined()) result[i] = inputs[i].grad();
    }
    return result;
  }
};

}  // namespace

bool runs_nested_backward(const torch::autograd::Node& node) {
  return dynamic_cast<const torch::autograd::CppNode<CheckpointFunction>*>(&node) != nullptr;
}

std::vector<at::Tensor> checkpoint(const Block& fn, const std::vector<at::Tensor>& inputs,
                                   const CheckpointOptions& options) {
  TORCH_CHECK(fn, "zero::checkpoint: the block is an empty std::function.");
  // Nothing will call backward (eval, NoGradGuard): recomputation would be pure overhead.
  if (!at::GradMode::is_enabled()) return fn(inputs);

  auto state = c10::make_intrusive<CheckpointState>();
  state->fn = fn;
  state->num_inputs = inputs.size();
  state->preserve_rng = options.preserve_rng_state;
  if (options.offload != nullptr) state->offloader = *options.offload;
  bool any_requires_grad = false;
  for (const at::Tensor& t : inputs) {
    state->requires_grad.push_back(t.defined() && t.requires_grad());
    any_requires_grad = any_requires_grad || state->requires_grad.back();
  }

  std::vector<at::Tensor> variables = inputs;
  // Autograd records no node for a Function none of whose inputs requires grad, and then the
  // block's parameters would silently get no gradient: typically the first block, fed with data.
  // A zero-size leaf that requires grad makes the node exist; its gradient stays undefined.
  if (!any_requires_grad) variables.push_back(at::empty({0}).requires_grad_());
  state->num_variables = variables.size();
  return CheckpointFunction::apply(at::TensorList(variables), state);
}

at::Tensor checkpoint(const std::function<at::Tensor(const at::Tensor&)>& fn, const at::Tensor& x,
                      const CheckpointOptions& options) {
  TORCH_CHECK(fn, "zero::checkpoint: the block is an empty std::function.");
  if (!at::GradMode::is_enabled()) return fn(x);
  Block block = [fn](const std::vector<at::Tensor>& in) {
    return std::vector<at::Tensor>{fn(in.at(0))};
  };
  return checkpoint(block, {x}, options).at(0);
}

}  // namespace zero
