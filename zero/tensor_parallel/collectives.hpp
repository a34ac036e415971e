// The collectives of tensor parallelism without autograd, over the private comm::Group: the
// autograd functions (include/zero/tensor_parallel/mappings.hpp), the layers' gather_full and
// cross-entropy's forward use them.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

#include "comm/group.hpp"

namespace zero::tensor_parallel {

// The collectives themselves, without autograd (the layers' and cross-entropy's own backward use
// them). Each returns a new contiguous tensor.
at::Tensor all_reduce(const at::Tensor& x, comm::Group& group, const char* what);
at::Tensor all_gather_along(const at::Tensor& x, int64_t dim, comm::Group& group, const char* what);
at::Tensor reduce_scatter_along(const at::Tensor& x, int64_t dim, comm::Group& group,
                                const char* what);
at::Tensor split_along(const at::Tensor& x, int64_t dim, const comm::Group& group,
                       const char* what);

}  // namespace zero::tensor_parallel
