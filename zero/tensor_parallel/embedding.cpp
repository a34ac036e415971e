#include "zero/tensor_parallel/embedding.hpp"

#include <ATen/ATen.h>
#include <torch/nn/module.h>

#include <sstream>
#include <stdexcept>

#include "comm/agree.hpp"
#include "comm/group.hpp"
#include "zero/tensor_parallel/collectives.hpp"
#include "zero/tensor_parallel/init.hpp"
#include "zero/tensor_parallel/shard.hpp"

namespace zero::tensor_parallel {

VocabParallelEmbeddingImpl::VocabParallelEmbeddingImpl(GroupPtr group,
                                                       VocabParallelEmbeddingOptions options)
    : options_(options), group_(std::move(group)) {
  TORCH_CHECK(group_, "zero: VocabParallelEmbedding needs the tensor-parallel process group");
  const int64_t part = divide(options_.vocab(), group_->size(), "VocabParallelEmbedding vocab");
  weight = register_parameter("weight", at::empty({part, options_.dim()}, at::kFloat));
  load_full(init_full_embedding(options_.vocab(), options_.dim(), options_.seed()));
}

namespace {

// The ids' range, agreed over the group: every rank gets every rank's [min, max] (one all_gather
// of two numbers and the one host read the check always took) and throws the same error if any
// rank's ids leave the vocabulary. A rank throwing alone would leave its peers waiting in the
// forward's all-reduce until comm_timeout_s. A bad id would otherwise read out of bounds on the
// device.
void check_ids(const at::Tensor& ids, int64_t vocab, comm::Group& g) {
  at::Tensor bounds = at::zeros({2}, ids.options().dtype(at::kLong));
  if (ids.numel() > 0) {
    auto [lo, hi] = at::aminmax(ids);
    bounds = at::stack({lo, hi}).to(at::kLong);
  }
  const at::Tensor all = comm::gather_status(g, bounds, "the token ids' range");
  for (int r = 0; r < g.size(); ++r) {
    const int64_t min_id = all[r][0].item<int64_t>(), max_id = all[r][1].item<int64_t>();
    if (min_id >= 0 && max_id < vocab) continue;
    std::ostringstream msg;
    msg << "zero: VocabParallelEmbedding got token id " << (min_id < 0 ? min_id : max_id)
        << " outside the vocabulary [0, " << vocab << ") on tensor-parallel rank " << r << " of "
        << g.size() << " (every rank of the group stops)";
    throw std::invalid_argument(msg.str());
  }
}

}  // namespace

at::Tensor VocabParallelEmbeddingImpl::forward(const at::Tensor& ids) {
  if (options_.check_ids()) check_ids(ids, options_.vocab(), comm::of(*group_));
  const int64_t start = vocab_start();
  const int64_t end = start + weight.size(0);
  at::Tensor out;
  if (group_->size() == 1 && options_.check_ids()) {
    out = at::embedding(weight, ids);
  } else {
    const at::Tensor outside = (ids < start) | (ids >= end);
    const at::Tensor local = (ids - start).masked_fill(outside, 0);
    // Row 0 stands in for the ids of other ranks (and, unchecked, for ids outside the
    // vocabulary); zeroing its output also zeroes its gradient.
    out = at::embedding(weight, local).masked_fill(outside.unsqueeze(-1), 0.0);
  }
  return options_.sequence_parallel()
             ? reduce_scatter_to_sequence_region(out, group_, options_.sequence_dim())
             : reduce_from_region(out, group_);
}

int64_t VocabParallelEmbeddingImpl::vocab_start() const { return weight.size(0) * group_->rank(); }

void VocabParallelEmbeddingImpl::load_full(const at::Tensor& w) {
  if (!w.defined() || w.dim() != 2 || w.size(0) != options_.vocab() ||
      w.size(1) != options_.dim()) {
    std::ostringstream msg;
    msg << "zero: VocabParallelEmbedding load_full weight must have the full shape ["
        << options_.vocab() << ", " << options_.dim() << "], got "
        << (w.defined() ? w.sizes() : at::IntArrayRef{});
    throw std::invalid_argument(msg.str());
  }
  at::NoGradGuard no_grad;
  weight.copy_(shard_of(w, 0, group_->rank(), group_->size(), "VocabParallelEmbedding vocab"));
}

at::Tensor VocabParallelEmbeddingImpl::gather_full() const {
  return all_gather_along(weight.detach(), 0, comm::of(*group_),
                          "VocabParallelEmbedding gather_full");
}

Placement VocabParallelEmbeddingImpl::placement(const std::string&) const {
  return {.sharded = true, .partition_dim = 0};
}

}  // namespace zero::tensor_parallel
