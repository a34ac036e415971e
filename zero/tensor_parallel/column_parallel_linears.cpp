#include "zero/tensor_parallel/column_parallel_linears.hpp"

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

// Inputs: x, the n weights, then the n biases when every product has one (a custom function
// takes no undefined tensor; products without bias add none). Under autocast the inputs are
// cast once and the cast tensors saved (autograd_autocast.hpp).
struct ColumnParallelLinears : torch::autograd::Function<ColumnParallelLinears> {
  static variable_list forward(AutogradContext* ctx, const at::Tensor& x_in,
                               at::TensorList weights_in, at::TensorList biases_in,
                               const std::shared_ptr<zero::Group>& group, bool overlap) {
    const AutocastInputs autocast(x_in);
    const NoAutocast no_autocast;
    const at::Tensor x = autocast.cast(x_in);
    const std::vector<at::Tensor> weights = autocast.cast(weights_in);
    const std::vector<at::Tensor> biases = autocast.cast(biases_in);
    save_group(ctx, group);
    ctx->saved_data["overlap"] = overlap;
    ctx->saved_data["biases"] = !biases.empty();
    variable_list saved{x};
    saved.insert(saved.end(), weights.begin(), weights.end());
    ctx->save_for_backward(saved);
    variable_list out;
    out.reserve(weights.size());
    for (size_t i = 0; i < weights.size(); ++i)
      out.push_back(biases.empty() ? at::linear(x, weights[i]) : at::linear(x, weights[i], biases[i]));
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const NoAutocast no_autocast;  // a backward called inside an autocast region (custom_bwd)
    const auto saved = ctx->get_saved_variables();
    const at::Tensor& x = saved[0];
    const size_t n = saved.size() - 1;
    const bool overlap = ctx->saved_data["overlap"].toBool();
    const bool has_biases = ctx->saved_data["biases"].toBool();
    comm::Group& group = group_of(ctx);
    variable_list result(1 + n + (has_biases ? n : 0) + 2);  // ..., the group and overlap (none)
    const int64_t in = x.size(-1);
    // at::linear's own backward, product by product: the gradient as the 2-d [tokens, out] view
    // its addmm (or matmul) saw, dX = dY A, dA = dY^T X, db = the sum over tokens.
    std::vector<at::Tensor> g2(n);
    for (size_t i = 0; i < n; ++i) g2[i] = grads[i].reshape({-1, saved[i + 1].size(0)});
    std::optional<Pending> reduced;
    if (ctx->needs_input_grad(0)) {
      // The sum over the products last first: the order autograd sums a tensor read by several
      // products (the plain model's q, k, v give v + k + q).
      at::Tensor sum;
      for (size_t i = n; i-- > 0;) {
        const at::Tensor part = g2[i].mm(saved[i + 1]);
        sum = sum.defined() ? sum + part : part;
      }
      reduced.emplace(start_all_reduce(sum.reshape(x.sizes()), group,
                                       "all_reduce (tensor-parallel, column-parallel input gradient)"));
      if (!overlap) result[0] = reduced->result();
    }
    const at::Tensor x2 = x.reshape({-1, in});
    for (size_t i = 0; i < n; ++i) {
      if (ctx->needs_input_grad(1 + i)) result[1 + i] = g2[i].t().mm(x2);
      if (has_biases && ctx->needs_input_grad(1 + n + i)) result[1 + n + i] = g2[i].sum(0);
    }
    if (reduced && overlap) result[0] = reduced->result();
    return result;
  }
};

}  // namespace

std::vector<at::Tensor> column_parallel_linears(const std::vector<at::Tensor>& weights,
                                                const std::vector<at::Tensor>& biases,
                                                const at::Tensor& x,
                                                const std::shared_ptr<zero::Group>& group,
                                                bool overlap) {
  TORCH_CHECK(!weights.empty(), "zero: column_parallel_linears needs at least one weight");
  TORCH_CHECK(biases.empty() || biases.size() == weights.size(),
              "zero: column_parallel_linears: one bias (or an undefined one) per weight");
  bool all = !biases.empty(), none = true;
  for (const at::Tensor& b : biases) {
    all = all && b.defined();
    none = none && !b.defined();
  }
  if (all || none) {
    return ColumnParallelLinears::apply(x, at::TensorList(weights),
                                        at::TensorList(all ? biases : std::vector<at::Tensor>{}),
                                        group, overlap);
  }
  // Some products with a bias, some without: the biases added outside (autograd's add keeps
  // nothing for backward).
  variable_list y = ColumnParallelLinears::apply(x, at::TensorList(weights),
                                                 at::TensorList(std::vector<at::Tensor>{}), group,
                                                 overlap);
  const AutocastInputs autocast(x);
  for (size_t i = 0; i < biases.size(); ++i)
    if (biases[i].defined()) y[i] = y[i] + autocast.cast_outside(biases[i]);
  return y;
}

}  // namespace zero::tensor_parallel
