#include "zero/step/deepspeed_norm.hpp"

#include <ATen/ATen.h>

#include <algorithm>
#include <vector>

namespace zero {

namespace {

at::Tensor fp64_square_sum(const at::Tensor& t) {
  return at::linalg_vector_norm(t.to(at::kDouble), 2).square();
}

}  // namespace

at::Tensor deepspeed_squared_norm(const at::Tensor& g, const FlatParams& fp,
                                  const Sharding& sharding, comm::Group& group,
                                  const std::vector<char>& counted) {
  const FlatLayout& layout = fp.layout;
  if (!sharding.optimizer) {
    // One bucket window converted to fp64 at a time, not the whole gradient.
    at::Tensor sq = at::zeros({1}, g.options().dtype(at::kDouble));
    if (!counted.empty()) {
      for (const OwnedPiece& p : layout.owned_pieces(0)) {
        if (counted[p.param]) sq.add_(fp64_square_sum(g.narrow(0, p.shard_offset, p.numel)));
      }
      return sq.to(at::kFloat);
    }
    for (const BucketSlot& b : layout.buckets()) {
      sq.add_(fp64_square_sum(g.narrow(0, b.shard_offset, b.shard.shard_numel())));
    }
    return sq.to(at::kFloat);
  }
  // Where each parameter starts in DeepSpeed's flat buffer: registration order, trainable ones.
  std::vector<int64_t> ds_offset(layout.params().size(), 0);
  int64_t total = 0;
  for (int li : fp.layout_of_named) {
    if (li < 0) continue;
    ds_offset[li] = total;
    total += layout.params()[li].numel;
  }
  // DeepSpeed pads the flat buffer to a multiple of 2 x N (nccl_start_alignment_factor) and
  // gives rank r the elements [r x part, (r + 1) x part).
  const int n = group.size();
  const int64_t align = 2 * static_cast<int64_t>(n);
  const int64_t part = (total + align - 1) / align * align / n;

  at::Tensor parts = at::zeros({n}, g.options().dtype(at::kDouble));
  for (const OwnedPiece& p : layout.owned_pieces(sharding.owner)) {
    if (!counted.empty() && !counted[p.param]) continue;
    int64_t at = ds_offset[p.param] + p.param_offset;
    const int64_t end = at + p.numel;
    while (at < end) {
      const int r = static_cast<int>(at / part);
      const int64_t stop = std::min(end, (r + 1) * part);
      parts.narrow(0, r, 1).add_(fp64_square_sum(
          g.narrow(0, p.shard_offset + (at - ds_offset[p.param] - p.param_offset), stop - at)));
      at = stop;
    }
  }
  group.all_reduce_sum(parts, "all_reduce of the gradient norm (DeepSpeed's partitions)").wait();
  // Added in rank order, one fp32 rounding each (at::sum may pair them otherwise).
  const at::Tensor rounded = parts.to(at::kFloat);
  at::Tensor sq = rounded.narrow(0, 0, 1).clone();
  for (int r = 1; r < n; ++r) sq.add_(rounded.narrow(0, r, 1));
  return sq;
}

at::Tensor deepspeed3_squared_norm(const at::Tensor& g, const std::vector<optim::Range>& pieces) {
  std::vector<at::Tensor> parts;
  for (const optim::Range& r : pieces) {
    if (r.end > r.begin) parts.push_back(g.narrow(0, r.begin, r.end - r.begin));
  }
  return deepspeed3_squared_norm(parts, g.options());
}

at::Tensor deepspeed3_squared_norm(const std::vector<at::Tensor>& pieces,
                                   const at::TensorOptions& options) {
  at::Tensor sq = at::zeros({1}, options.dtype(at::kDouble));
  // DeepSpeed's g.to(double).norm(): a piece's fp64 copy, one at a time.
  for (const at::Tensor& p : pieces) sq.add_(fp64_square_sum(p));
  return sq;
}

}  // namespace zero
