#include "zero/tensor_parallel/sequence_parallel_linear.hpp"

#include <ATen/ATen.h>
#include <torch/autograd.h>

#include "comm/group.hpp"
#include "zero/tensor_parallel/collectives.hpp"

namespace zero::tensor_parallel {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// The group rides in the context as a capsule (mappings.cpp says why).
struct GroupHolder : torch::CustomClassHolder {
  explicit GroupHolder(std::shared_ptr<zero::Group> g) : group(std::move(g)) {}
  std::shared_ptr<zero::Group> group;
};

struct SequenceParallelLinear : torch::autograd::Function<SequenceParallelLinear> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& weight,
                            const std::shared_ptr<zero::Group>& group, int64_t dim) {
    TORCH_CHECK(group, "zero: sequence_parallel_linear was given no process group");
    ctx->saved_data["group"] = c10::IValue::make_capsule(c10::make_intrusive<GroupHolder>(group));
    ctx->saved_data["dim"] = dim;
    ctx->save_for_backward({x, weight});
    const at::Tensor total = all_gather_along(
        x, dim, comm::of(*group), "sequence-parallel all-gather (column-parallel input)");
    return at::linear(total, weight);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor& x = saved[0];
    const at::Tensor& weight = saved[1];
    const int64_t dim = ctx->saved_data["dim"].toInt();
    auto holder =
        c10::static_intrusive_pointer_cast<GroupHolder>(ctx->saved_data["group"].toCapsule());
    comm::Group& group = comm::of(*holder->group);
    const at::Tensor go = grads[0].contiguous();
    const int64_t out = weight.size(0), in = weight.size(1);
    at::Tensor dx, dw;
    if (ctx->needs_input_grad(0)) {
      dx =
          reduce_scatter_along(at::matmul(go, weight), dim, group,
                               "sequence-parallel reduce-scatter (column-parallel input gradient)");
    }
    if (ctx->needs_input_grad(1)) {
      const at::Tensor total = all_gather_along(
          x, dim, group, "sequence-parallel all-gather (column-parallel input, again in backward)");
      dw = go.reshape({-1, out}).t().mm(total.reshape({-1, in}));
    }
    return {dx, dw, at::Tensor(), at::Tensor()};
  }
};

}  // namespace

at::Tensor sequence_parallel_linear(const at::Tensor& x, const at::Tensor& weight,
                                    const at::Tensor& bias,
                                    const std::shared_ptr<zero::Group>& group,
                                    int64_t sequence_dim) {
  // The bias outside the function: autograd's add keeps nothing for backward, and a custom
  // function cannot take an undefined tensor (a layer without bias) as an input.
  at::Tensor y = SequenceParallelLinear::apply(x, weight, group, sequence_dim);
  return bias.defined() ? y + bias : y;
}

}  // namespace zero::tensor_parallel
