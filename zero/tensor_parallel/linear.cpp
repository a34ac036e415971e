#include "zero/tensor_parallel/linear.hpp"
#include "zero/tensor_parallel/overlap.hpp"

#include <ATen/ATen.h>
#include <torch/nn/module.h>

#include <sstream>
#include <stdexcept>

#include "comm/group.hpp"
#include "zero/tensor_parallel/collectives.hpp"
#include "zero/tensor_parallel/column_parallel_linears.hpp"
#include "zero/tensor_parallel/sequence_parallel_linear.hpp"
#include "zero/tensor_parallel/shard.hpp"

namespace zero::tensor_parallel {

namespace {

void check_shape(const at::Tensor& t, at::IntArrayRef expected, const std::string& what) {
  if (!t.defined() || t.sizes() != expected) {
    std::ostringstream msg;
    msg << "zero: " << what << " must have the full shape " << expected << ", got "
        << (t.defined() ? t.sizes() : at::IntArrayRef{}) << (t.defined() ? "" : " (none)");
    throw std::invalid_argument(msg.str());
  }
}

void check_bias(const at::Tensor& bias, bool has_bias, int64_t size, const std::string& layer) {
  if (has_bias) {
    check_shape(bias, {size}, layer + " load_full bias");
  } else if (bias.defined()) {
    throw std::invalid_argument("zero: " + layer +
                                " load_full got a bias but the layer was built without one "
                                "(options.bias(false))");
  }
}

void copy_into(at::Tensor& param, const at::Tensor& value) {
  at::NoGradGuard no_grad;
  param.copy_(value);
}

}  // namespace

ColumnParallelLinearImpl::ColumnParallelLinearImpl(GroupPtr group,
                                                   ColumnParallelLinearOptions options)
    : options_(options), group_(std::move(group)) {
  TORCH_CHECK(group_, "zero: ColumnParallelLinear needs the tensor-parallel process group");
  const int64_t part =
      divide(options_.out_features(), group_->size(), "ColumnParallelLinear out_features");
  weight = register_parameter("weight", at::empty({part, options_.in_features()}, at::kFloat));
  if (options_.bias()) bias = register_parameter("bias", at::empty({part}, at::kFloat));
  FullLinear full = init_full_linear(options_.in_features(), options_.out_features(),
                                     options_.bias(), options_.seed());
  load_full(full.weight, full.bias);
}

at::Tensor ColumnParallelLinearImpl::forward(const at::Tensor& x) {
  // Under sequence parallelism the input is gathered inside the product, so that backward keeps
  // only this rank's part of the sequence (sequence_parallel_linear.hpp).
  at::Tensor y = options_.sequence_parallel()
                     ? sequence_parallel_linears({weight}, {bias}, x, group_,
                                                 options_.sequence_dim(), options_.overlap_comm())[0]
                     : column_parallel_linears({weight}, {bias}, x, group_,
                                               options_.overlap_comm())[0];
  return options_.gather_output() ? gather_from_region(y, group_) : y;
}

std::vector<at::Tensor> column_parallel_products(const at::Tensor& x,
                                                 const std::vector<ColumnParallelLinear>& layers) {
  TORCH_CHECK(!layers.empty(), "zero: column_parallel_products needs at least one layer");
  const auto& first = layers.front();
  for (const auto& l : layers) {
    TORCH_CHECK(l->group() == first->group() &&
                    l->options().sequence_parallel() == first->options().sequence_parallel() &&
                    l->options().sequence_dim() == first->options().sequence_dim() &&
                    l->options().overlap_comm() == first->options().overlap_comm() &&
                    !l->options().gather_output(),
                "zero: column_parallel_products: the layers must share the group and the "
                "sequence-parallel options, and gather no output");
  }
  std::vector<at::Tensor> weights, biases;
  for (const auto& l : layers) {
    weights.push_back(l->weight);
    biases.push_back(l->bias);
  }
  if (first->options().sequence_parallel())
    return sequence_parallel_linears(weights, biases, x, first->group(),
                                     first->options().sequence_dim(),
                                     first->options().overlap_comm());
  return column_parallel_linears(weights, biases, x, first->group(),
                                 first->options().overlap_comm());
}

void ColumnParallelLinearImpl::load_full(const at::Tensor& w, const at::Tensor& b) {
  check_shape(w, {options_.out_features(), options_.in_features()},
              "ColumnParallelLinear load_full weight");
  check_bias(b, options_.bias(), options_.out_features(), "ColumnParallelLinear");
  const int rank = group_->rank();
  const int size = group_->size();
  copy_into(weight, shard_of(w, 0, rank, size, "ColumnParallelLinear out_features"));
  if (options_.bias()) copy_into(bias, shard_of(b, 0, rank, size, "ColumnParallelLinear bias"));
}

FullLinear ColumnParallelLinearImpl::gather_full() const {
  auto& g = comm::of(*group_);
  FullLinear full;
  const at::Tensor w = weight.detach();
  full.weight = all_gather_along(w, 0, g, "ColumnParallelLinear gather_full weight");
  if (options_.bias()) {
    full.bias = all_gather_along(bias.detach(), 0, g, "ColumnParallelLinear gather_full bias");
  }
  return full;
}

Placement ColumnParallelLinearImpl::placement(const std::string&) const {
  // Weight rows and bias entries are both split by output feature.
  return {.sharded = true, .partition_dim = 0};
}

RowParallelLinearImpl::RowParallelLinearImpl(GroupPtr group, RowParallelLinearOptions options)
    : options_(options), group_(std::move(group)) {
  TORCH_CHECK(group_, "zero: RowParallelLinear needs the tensor-parallel process group");
  if (options_.sequence_parallel() && !options_.input_is_parallel()) {
    throw std::invalid_argument(
        "zero: RowParallelLinear with sequence_parallel needs input_is_parallel (its input is "
        "the feature-split output of a ColumnParallelLinear without gather_output)");
  }
  const int64_t part =
      divide(options_.in_features(), group_->size(), "RowParallelLinear in_features");
  weight = register_parameter("weight", at::empty({options_.out_features(), part}, at::kFloat));
  if (options_.bias()) {
    bias = register_parameter("bias", at::empty({options_.out_features()}, at::kFloat));
  }
  FullLinear full = init_full_linear(options_.in_features(), options_.out_features(),
                                     options_.bias(), options_.seed());
  load_full(full.weight, full.bias);
}

at::Tensor RowParallelLinearImpl::forward(const at::Tensor& x) {
  const at::Tensor in = options_.input_is_parallel() ? x : scatter_to_region(x, group_);
  at::Tensor partial = at::linear(in, weight);
  at::Tensor y = options_.sequence_parallel()
                     ? reduce_scatter_to_sequence_region(partial, group_, options_.sequence_dim())
                     : reduce_from_region(partial, group_);
  // After the reduction: a bias added to every partial sum would be counted T times.
  return options_.bias() ? y + bias : y;
}

void RowParallelLinearImpl::load_full(const at::Tensor& w, const at::Tensor& b) {
  check_shape(w, {options_.out_features(), options_.in_features()},
              "RowParallelLinear load_full weight");
  check_bias(b, options_.bias(), options_.out_features(), "RowParallelLinear");
  copy_into(weight,
            shard_of(w, 1, group_->rank(), group_->size(), "RowParallelLinear in_features"));
  if (options_.bias()) copy_into(bias, b);
}

FullLinear RowParallelLinearImpl::gather_full() const {
  FullLinear full;
  full.weight = all_gather_along(weight.detach(), 1, comm::of(*group_),
                                 "RowParallelLinear gather_full weight");
  if (options_.bias()) full.bias = bias.detach().clone();
  return full;
}

Placement RowParallelLinearImpl::placement(const std::string& param_name) const {
  if (param_name == "weight") return {.sharded = true, .partition_dim = 1};
  // The bias is added to this rank's part of the sequence only under sequence parallelism.
  return {.grad_needs_all_reduce = options_.sequence_parallel()};
}

int set_overlap_comm(torch::nn::Module& model, bool on) {
  int n = 0;
  for (const auto& m : model.modules()) {  // the model itself included
    if (auto* c = dynamic_cast<ColumnParallelLinearImpl*>(m.get())) {
      c->set_overlap_comm(on);
      ++n;
    }
  }
  return n;
}

}  // namespace zero::tensor_parallel
