#include "zero/tensor_parallel/sequence_parallel_linear.hpp"

#include <ATen/ATen.h>
#include <torch/autograd.h>

#include <optional>

#include "comm/group.hpp"
#include "zero/tensor_parallel/autograd_autocast.hpp"
#include "zero/tensor_parallel/autograd_group.hpp"
#include "zero/tensor_parallel/collectives.hpp"

namespace zero::tensor_parallel {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// Y_i = all_gather(X_r) A_i^T for each weight A_i: one gather shared by every product (Megatron's
// fused linear_qkv / linear_fc1 gather once), nothing but the shard and the weights kept.
struct SequenceParallelLinears : torch::autograd::Function<SequenceParallelLinears> {
  static variable_list forward(AutogradContext* ctx, const at::Tensor& x_in,
                               at::TensorList weights_in, const std::shared_ptr<zero::Group>& group,
                               int64_t dim, bool overlap) {
    TORCH_CHECK(!weights_in.empty(), "zero: sequence_parallel_linears needs at least one weight");
    // Under autocast the shard is cast before it is gathered (the gather moves the narrower
    // dtype), and the cast tensors are saved (autograd_autocast.hpp).
    const AutocastInputs autocast(x_in);
    const NoAutocast no_autocast;
    const at::Tensor x = autocast.cast(x_in);
    const std::vector<at::Tensor> weights = autocast.cast(weights_in);
    save_group(ctx, group);
    ctx->saved_data["dim"] = dim;
    ctx->saved_data["overlap"] = overlap;
    variable_list saved{x};
    saved.insert(saved.end(), weights.begin(), weights.end());
    ctx->save_for_backward(saved);
    const at::Tensor total = all_gather_along(
        x, dim, comm::of(*group), "sequence-parallel all-gather (column-parallel input)");
    variable_list out;
    out.reserve(weights.size());
    for (const at::Tensor& w : weights) out.push_back(at::linear(total, w));
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const NoAutocast no_autocast;  // a backward called inside an autocast region (custom_bwd)
    const auto saved = ctx->get_saved_variables();
    const at::Tensor& x = saved[0];
    const size_t n = saved.size() - 1;
    const int64_t dim = ctx->saved_data["dim"].toInt();
    comm::Group& group = group_of(ctx);
    const bool overlap = ctx->saved_data["overlap"].toBool();
    variable_list result(n + 4);  // x, each weight, the group, dim and overlap (none)
    bool weights_need_grad = false;
    for (size_t i = 0; i < n; ++i) weights_need_grad |= ctx->needs_input_grad(i + 1);
    // Megatron's order: the input's all-gather (for the weights' gradients) started first and
    // run while dX's products are computed; dX's reduce-scatter run while dA's are.
    std::optional<Pending> gathered, scattered;
    if (weights_need_grad)
      gathered.emplace(start_all_gather_along(
          x, dim, group, "sequence-parallel all-gather (column-parallel input, again in backward)"));
    if (!overlap && gathered) gathered->result();
    if (ctx->needs_input_grad(0)) {
      // The input's gradient sums every product's, last first: the order autograd sums a
      // tensor read by several products (the plain model's q, k, v give v + k + q).
      at::Tensor sum;
      for (size_t i = n; i-- > 0;) {
        const at::Tensor part = at::matmul(grads[i], saved[i + 1]);
        sum = sum.defined() ? sum + part : part;
      }
      scattered.emplace(start_reduce_scatter_along(
          sum.contiguous(), dim, group,
          "sequence-parallel reduce-scatter (column-parallel input gradient)"));
      if (!overlap) result[0] = scattered->result();
    }
    if (weights_need_grad) {
      const at::Tensor total = gathered->result();
      const int64_t in = total.size(-1);
      const at::Tensor flat = total.reshape({-1, in});
      for (size_t i = 0; i < n; ++i) {
        if (!ctx->needs_input_grad(i + 1)) continue;
        const int64_t out = saved[i + 1].size(0);
        result[i + 1] = grads[i].contiguous().reshape({-1, out}).t().mm(flat);
      }
    }
    if (scattered && overlap) result[0] = scattered->result();
    return result;
  }
};

}  // namespace

std::vector<at::Tensor> sequence_parallel_linears(const std::vector<at::Tensor>& weights,
                                                  const std::vector<at::Tensor>& biases,
                                                  const at::Tensor& x,
                                                  const std::shared_ptr<zero::Group>& group,
                                                  int64_t sequence_dim, bool overlap) {
  TORCH_CHECK(biases.empty() || biases.size() == weights.size(),
              "zero: sequence_parallel_linears: one bias (or an undefined one) per weight");
  // The biases outside the function: autograd's add keeps nothing for backward, and a custom
  // function cannot take an undefined tensor (a layer without bias) as an input.
  variable_list y =
      SequenceParallelLinears::apply(x, at::TensorList(weights), group, sequence_dim, overlap);
  const AutocastInputs autocast(x);
  for (size_t i = 0; i < biases.size(); ++i)
    if (biases[i].defined()) y[i] = y[i] + autocast.cast_outside(biases[i]);
  return y;
}

at::Tensor sequence_parallel_linear(const at::Tensor& x, const at::Tensor& weight,
                                    const at::Tensor& bias,
                                    const std::shared_ptr<zero::Group>& group,
                                    int64_t sequence_dim) {
  return sequence_parallel_linears({weight}, {bias}, x, group, sequence_dim)[0];
}

}  // namespace zero::tensor_parallel
