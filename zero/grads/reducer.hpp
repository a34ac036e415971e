// How a gradient bucket is reduced over the data-parallel group: the collective half of the
// gradient path (grad_sync.hpp composes a collector, a Reducer and a GradSink). The collectors
// decide when a bucket (or a chunk of one) is reduced and into which buffers; the reducer only
// launches the collective and says where this rank's part of the result is.
#pragma once

#include <ATen/core/Tensor.h>

#include <memory>
#include <string>
#include <vector>

#include "comm/group.hpp"
#include "zero/compress/quantized_reduce.hpp"
#include "zero/params/shard_info.hpp"

namespace zero {

struct GradSyncOptions;

class Reducer {
 public:
  virtual ~Reducer() = default;
  // Launches the sum of `in` (world x S elements, the communication dtype) over the group.
  // `out` (S elements) receives this rank's part where the collective writes one; `slot`: the
  // reduction's error-feedback slot under compression (first_slot), ignored otherwise.
  virtual comm::Work reduce(int slot, at::Tensor& out, at::Tensor& in, const std::string& what) = 0;
  // Where this rank's reduced part is once the work finished: `out`, or a view of `in`.
  virtual at::Tensor result(const at::Tensor& out, const at::Tensor& in) const = 0;
  // Whether the reduced result of a chunk needs a buffer of its own (`out`).
  virtual bool writes_out() const = 0;
  // Bytes the reducer keeps between steps (the error-feedback residuals).
  virtual int64_t bytes() const { return 0; }
  // The error-feedback residuals of compressed reduction (checkpoints), or null.
  virtual compress::ErrorFeedback* error_feedback() { return nullptr; }
  // The error-feedback slot of bucket b's first reduction; -1 without compression.
  virtual int first_slot(int /*b*/) const { return -1; }
};

// Stage 0: an all-reduce in place, every rank keeps the whole sum (in `in`).
std::unique_ptr<Reducer> make_all_reduce(comm::Group& group);
// A reduce-scatter into `out`.
std::unique_ptr<Reducer> make_reduce_scatter(comm::Group& group);
// reduce_scatter: false (DeepSpeed's option): an all-reduce, this rank keeps its own part.
std::unique_ptr<Reducer> make_all_reduce_keep_shard(comm::Group& group);
// zero_quantized_gradients: int8/int4 codes over one all-to-all, summed in fp32, into `out`;
// one error-feedback slot per reduction a bucket goes through (make_quantized_reduce).
std::unique_ptr<Reducer> make_quantized_reducer(const FlatLayout& layout, comm::Group& group,
                                                const GradSyncOptions& opts);
// The reducer `opts` asks for: `sharded` false is stage 0's all-reduce (which compression
// refuses), otherwise quantized, all-reduce-keep-shard or reduce-scatter.
std::unique_ptr<Reducer> make_reducer(const FlatLayout& layout, comm::Group& group, bool sharded,
                                      const GradSyncOptions& opts);

}  // namespace zero
