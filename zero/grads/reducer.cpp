#include "zero/grads/reducer.hpp"

#include <ATen/ATen.h>

#include "zero/grads/grad_sync.hpp"

namespace zero {
namespace {

class AllReduce final : public Reducer {
 public:
  explicit AllReduce(comm::Group& group) : group_(group) {}
  comm::Work reduce(int, at::Tensor&, at::Tensor& in, const std::string& what) override {
    return group_.all_reduce_sum(in, what);
  }
  at::Tensor result(const at::Tensor&, const at::Tensor& in) const override { return in; }
  bool writes_out() const override { return false; }

 private:
  comm::Group& group_;
};

class ReduceScatter final : public Reducer {
 public:
  explicit ReduceScatter(comm::Group& group) : group_(group) {}
  comm::Work reduce(int, at::Tensor& out, at::Tensor& in, const std::string& what) override {
    return group_.reduce_scatter_sum(out, in, what);
  }
  at::Tensor result(const at::Tensor& out, const at::Tensor&) const override { return out; }
  bool writes_out() const override { return true; }

 private:
  comm::Group& group_;
};

class AllReduceKeepShard final : public Reducer {
 public:
  explicit AllReduceKeepShard(comm::Group& group) : group_(group) {}
  comm::Work reduce(int, at::Tensor&, at::Tensor& in, const std::string& what) override {
    return group_.all_reduce_sum(in, what);
  }
  // `out` only gives the part's size: the all-reduce left every rank's part in `in`.
  at::Tensor result(const at::Tensor& out, const at::Tensor& in) const override {
    const int64_t S = out.numel();
    return in.narrow(0, group_.rank() * S, S);
  }
  bool writes_out() const override { return false; }

 private:
  comm::Group& group_;
};

class Quantized final : public Reducer {
 public:
  Quantized(std::unique_ptr<compress::QuantizedReduceScatter> q, std::vector<int> first_slot)
      : quant_(std::move(q)), first_slot_(std::move(first_slot)) {}
  comm::Work reduce(int slot, at::Tensor& out, at::Tensor& in, const std::string& what) override {
    return quant_->reduce_scatter(static_cast<size_t>(slot), out, in, what);
  }
  at::Tensor result(const at::Tensor& out, const at::Tensor&) const override { return out; }
  bool writes_out() const override { return true; }
  int64_t bytes() const override { return quant_->bytes(); }
  compress::ErrorFeedback* error_feedback() override { return quant_->feedback(); }
  int first_slot(int b) const override { return first_slot_[b]; }

 private:
  std::unique_ptr<compress::QuantizedReduceScatter> quant_;
  std::vector<int> first_slot_;
};

}  // namespace

std::unique_ptr<Reducer> make_all_reduce(comm::Group& group) {
  return std::make_unique<AllReduce>(group);
}
std::unique_ptr<Reducer> make_reduce_scatter(comm::Group& group) {
  return std::make_unique<ReduceScatter>(group);
}
std::unique_ptr<Reducer> make_all_reduce_keep_shard(comm::Group& group) {
  return std::make_unique<AllReduceKeepShard>(group);
}

std::unique_ptr<Reducer> make_quantized_reducer(const FlatLayout& layout, comm::Group& group,
                                                const GradSyncOptions& opts) {
  std::vector<int> first_slot;
  auto q = make_quantized_reduce(layout, group, opts, first_slot);
  TORCH_CHECK(q, "zero: make_quantized_reducer without zero_quantized_gradients");
  return std::make_unique<Quantized>(std::move(q), std::move(first_slot));
}

std::unique_ptr<Reducer> make_reducer(const FlatLayout& layout, comm::Group& group, bool sharded,
                                      const GradSyncOptions& opts) {
  if (!sharded) {
    TORCH_CHECK(!opts.compress.enabled,
                "zero: zero_quantized_gradients compresses the reduce-scatter of ZeRO stages 1 "
                "to 3; stage 0 all-reduces full gradients. Set zero_optimization.stage: 1, 2 or "
                "3, or zero_quantized_gradients: false");
    return make_all_reduce(group);
  }
  if (opts.compress.enabled) return make_quantized_reducer(layout, group, opts);
  if (!opts.reduce_scatter) return make_all_reduce_keep_shard(group);
  return make_reduce_scatter(group);
}

}  // namespace zero
