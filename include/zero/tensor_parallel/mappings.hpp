// The communication of tensor parallelism as autograd functions, Megatron-LM's mappings: each
// forward collective has its conjugate in backward, so a layer built from them is differentiated
// by ordinary autograd.
//
//   forward                           backward
//   copy_to_region        identity    all-reduce (sum)
//   reduce_from_region    all-reduce  identity
//   scatter_to_region     split       all-gather        (last dimension)
//   gather_from_region    all-gather  split             (last dimension)
//   scatter_to_sequence_region         split          all-gather       (sequence dimension)
//   gather_from_sequence_region        all-gather     reduce-scatter   (or split, see below)
//   reduce_scatter_to_sequence_region  reduce-scatter all-gather
//
// `group` is the tensor-parallel group; every rank of it must call the same functions in the same
// order (forward and backward). The collectives are waited on before the function returns. The
// sequence dimension is a parameter: zero's models are [batch, sequence, hidden] (dimension 1),
// Megatron's [sequence, batch, hidden] (dimension 0). Inputs are never modified in place.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>

#include "zero/group.hpp"

namespace zero::tensor_parallel {

// The tensor-parallel group: a mesh's "tp" dimension (zero/tensor_parallel/groups.hpp).
using GroupPtr = std::shared_ptr<zero::Group>;

at::Tensor copy_to_region(const at::Tensor& x, const GroupPtr& group);
at::Tensor reduce_from_region(const at::Tensor& x, const GroupPtr& group);
at::Tensor scatter_to_region(const at::Tensor& x, const GroupPtr& group);
at::Tensor gather_from_region(const at::Tensor& x, const GroupPtr& group);

at::Tensor scatter_to_sequence_region(const at::Tensor& x, const GroupPtr& group, int64_t dim);
// `grad_is_parallel`: the gradient arriving in backward is a partial sum on each rank (the
// gathered tensor fed a column-parallel layer), so backward reduce-scatters it; false: every
// rank holds the same full gradient, so backward only keeps its own part.
at::Tensor gather_from_sequence_region(const at::Tensor& x, const GroupPtr& group, int64_t dim,
                                       bool grad_is_parallel = true);
at::Tensor reduce_scatter_to_sequence_region(const at::Tensor& x, const GroupPtr& group,
                                             int64_t dim);

}  // namespace zero::tensor_parallel
