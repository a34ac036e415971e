#include "zero/tensor_parallel/mappings.hpp"

#include <ATen/ATen.h>
#include <ATen/WrapDimUtils.h>
#include <torch/autograd.h>

#include "comm/group.hpp"
#include "zero/tensor_parallel/autograd_group.hpp"
#include "zero/tensor_parallel/collectives.hpp"
#include "zero/tensor_parallel/shard.hpp"

namespace zero::tensor_parallel {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

Pending::~Pending() {
  if (!work_.pending()) return;
  try {
    work_.wait();
  } catch (...) {
    // Unwinding already (the result was never asked for): the first error is the one to see.
  }
}

at::Tensor Pending::result() {
  work_.wait();
  work_ = comm::Work();
  in_ = at::Tensor();
  if (moved_) {
    out_ = out_.movedim(0, dim_).contiguous();
    moved_ = false;
  }
  return out_;
}

Pending start_all_reduce(const at::Tensor& x, comm::Group& group, const char* what) {
  if (group.size() == 1) return Pending(x.contiguous());
  // A copy, not the caller's tensor: autograd may still hold `x` (the function's input).
  at::Tensor out = x.clone(at::MemoryFormat::Contiguous);
  comm::Work work = group.all_reduce_sum(out, what);
  return Pending(std::move(work), std::move(out), -1);
}

Pending start_all_gather_along(const at::Tensor& x, int64_t dim, comm::Group& group,
                               const char* what) {
  if (group.size() == 1) return Pending(x.contiguous());
  const int64_t d = at::maybe_wrap_dim(dim, x.dim());
  // The group gathers flat buffers rank after rank: with `d` moved to the front, rank r's part
  // is the r-th block of rows, which is a concatenation along `d`.
  at::Tensor in = x.movedim(d, 0).contiguous();
  std::vector<int64_t> sizes = in.sizes().vec();
  sizes[0] *= group.size();
  at::Tensor out = at::empty(sizes, in.options());
  comm::Work work = group.all_gather(out, in, what);
  return Pending(std::move(work), std::move(out), d, std::move(in));
}

Pending start_reduce_scatter_along(const at::Tensor& x, int64_t dim, comm::Group& group,
                                   const char* what) {
  const int64_t d = at::maybe_wrap_dim(dim, x.dim());
  const int64_t part =
      divide(x.size(d), group.size(),
             std::string(what) + ": dimension " + std::to_string(d) + " of the tensor");
  if (group.size() == 1) return Pending(x.contiguous());
  at::Tensor in = x.movedim(d, 0).contiguous();
  std::vector<int64_t> sizes = in.sizes().vec();
  sizes[0] = part;
  at::Tensor out = at::empty(sizes, in.options());
  comm::Work work = group.reduce_scatter_sum(out, in, what);
  return Pending(std::move(work), std::move(out), d, std::move(in));
}

at::Tensor all_reduce(const at::Tensor& x, comm::Group& group, const char* what) {
  return start_all_reduce(x, group, what).result();
}

at::Tensor all_gather_along(const at::Tensor& x, int64_t dim, comm::Group& group,
                            const char* what) {
  return start_all_gather_along(x, dim, group, what).result();
}

at::Tensor reduce_scatter_along(const at::Tensor& x, int64_t dim, comm::Group& group,
                                const char* what) {
  return start_reduce_scatter_along(x, dim, group, what).result();
}

at::Tensor split_along(const at::Tensor& x, int64_t dim, const comm::Group& group,
                       const char* what) {
  const int64_t d = at::maybe_wrap_dim(dim, x.dim());
  return shard_of(x, d, group.rank(), group.size(),
                  std::string(what) + ": dimension " + std::to_string(d) + " of the tensor")
      .contiguous();
}

namespace {

struct CopyToRegion : torch::autograd::Function<CopyToRegion> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const GroupPtr& group) {
    save_group(ctx, group);
    return x;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    return {all_reduce(grads[0], group_of(ctx), "all_reduce (tensor-parallel, copy_to_region)"),
            at::Tensor()};
  }
};

struct ReduceFromRegion : torch::autograd::Function<ReduceFromRegion> {
  static at::Tensor forward(AutogradContext*, const at::Tensor& x, const GroupPtr& group) {
    return all_reduce(x, comm::of(*group), "all_reduce (reduce_from_region)");
  }
  static variable_list backward(AutogradContext*, variable_list grads) {
    return {grads[0], at::Tensor()};
  }
};

struct ScatterToRegion : torch::autograd::Function<ScatterToRegion> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const GroupPtr& group) {
    save_group(ctx, group);
    return split_along(x, -1, comm::of(*group), "scatter_to_region (last dimension)");
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    return {all_gather_along(grads[0], -1, group_of(ctx),
                             "all_gather (tensor-parallel, scatter_to_region backward)"),
            at::Tensor()};
  }
};

struct GatherFromRegion : torch::autograd::Function<GatherFromRegion> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const GroupPtr& group) {
    save_group(ctx, group);
    return all_gather_along(x, -1, comm::of(*group),
                            "all_gather (gather_from_region)");
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    return {split_along(grads[0], -1, group_of(ctx), "gather_from_region backward"), at::Tensor()};
  }
};

struct ScatterToSequenceRegion : torch::autograd::Function<ScatterToSequenceRegion> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const GroupPtr& group,
                            int64_t dim) {
    save_group(ctx, group);
    ctx->saved_data["dim"] = dim;
    return split_along(x, dim, comm::of(*group), "scatter_to_sequence_region (sequence dimension)");
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    return {all_gather_along(grads[0], ctx->saved_data["dim"].toInt(), group_of(ctx),
                             "sequence-parallel all-gather (scatter_to_sequence_region backward)"),
            at::Tensor(), at::Tensor()};
  }
};

struct GatherFromSequenceRegion : torch::autograd::Function<GatherFromSequenceRegion> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const GroupPtr& group,
                            int64_t dim, bool grad_is_parallel) {
    save_group(ctx, group);
    ctx->saved_data["dim"] = dim;
    ctx->saved_data["grad_is_parallel"] = grad_is_parallel;
    return all_gather_along(x, dim, comm::of(*group),
                            "sequence-parallel all-gather (gather_from_sequence_region)");
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const int64_t dim = ctx->saved_data["dim"].toInt();
    at::Tensor g =
        ctx->saved_data["grad_is_parallel"].toBool()
            ? reduce_scatter_along(
                  grads[0], dim, group_of(ctx),
                  "sequence-parallel reduce-scatter (gather_from_sequence_region backward)")
            : split_along(grads[0], dim, group_of(ctx), "gather_from_sequence_region backward");
    return {g, at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

struct ReduceScatterToSequenceRegion : torch::autograd::Function<ReduceScatterToSequenceRegion> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const GroupPtr& group,
                            int64_t dim) {
    save_group(ctx, group);
    ctx->saved_data["dim"] = dim;
    return reduce_scatter_along(
        x, dim, comm::of(*group),
        "sequence-parallel reduce-scatter (reduce_scatter_to_sequence_region)");
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    return {all_gather_along(
                grads[0], ctx->saved_data["dim"].toInt(), group_of(ctx),
                "sequence-parallel all-gather (reduce_scatter_to_sequence_region backward)"),
            at::Tensor(), at::Tensor()};
  }
};

}  // namespace

at::Tensor copy_to_region(const at::Tensor& x, const GroupPtr& group) {
  return CopyToRegion::apply(x, group);
}
at::Tensor reduce_from_region(const at::Tensor& x, const GroupPtr& group) {
  return ReduceFromRegion::apply(x, group);
}
at::Tensor scatter_to_region(const at::Tensor& x, const GroupPtr& group) {
  return ScatterToRegion::apply(x, group);
}
at::Tensor gather_from_region(const at::Tensor& x, const GroupPtr& group) {
  return GatherFromRegion::apply(x, group);
}
at::Tensor scatter_to_sequence_region(const at::Tensor& x, const GroupPtr& group, int64_t dim) {
  return ScatterToSequenceRegion::apply(x, group, dim);
}
at::Tensor gather_from_sequence_region(const at::Tensor& x, const GroupPtr& group, int64_t dim,
                                       bool grad_is_parallel) {
  return GatherFromSequenceRegion::apply(x, group, dim, grad_is_parallel);
}
at::Tensor reduce_scatter_to_sequence_region(const at::Tensor& x, const GroupPtr& group,
                                             int64_t dim) {
  return ReduceScatterToSequenceRegion::apply(x, group, dim);
}

}  // namespace zero::tensor_parallel
