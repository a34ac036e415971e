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

// A collective started and not yet waited for, so that the caller computes meanwhile (the
// overlapped backward of Megatron's linear layers: the input gradient's reduction runs during the
// weight gradient's product). result() waits as Work::wait does (bounded on the CPU; on a GPU the
// current stream waits, the host does not) and returns what the blocking function returns. Not
// waited for, the destructor waits, so that nothing the operation reads is freed under it.
class Pending {
 public:
  explicit Pending(at::Tensor ready) : out_(std::move(ready)) {}
  // moved_dim: the result's dimension that `out` holds in front (the group's flat layout); -1: none.
  // `in`: the operation's input, kept until it completed (Work::hold needs a future, which not
  // every gloo operation has).
  Pending(comm::Work work, at::Tensor out, int64_t moved_dim, at::Tensor in = {})
      : work_(std::move(work)),
        out_(std::move(out)),
        in_(std::move(in)),
        dim_(moved_dim),
        moved_(moved_dim >= 0) {}
  Pending(Pending&&) = default;
  Pending& operator=(Pending&&) = delete;
  ~Pending();
  at::Tensor result();

 private:
  comm::Work work_;
  at::Tensor out_, in_;
  int64_t dim_ = 0;     // the result's dimension the group's flat buffer has in front
  bool moved_ = false;  // out_ is in the group's layout (dim_ first)
};
Pending start_all_reduce(const at::Tensor& x, comm::Group& group, const char* what);
Pending start_all_gather_along(const at::Tensor& x, int64_t dim, comm::Group& group,
                               const char* what);
Pending start_reduce_scatter_along(const at::Tensor& x, int64_t dim, comm::Group& group,
                                   const char* what);

}  // namespace zero::tensor_parallel
