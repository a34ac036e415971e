// The bucket logic shared by every ZeRO stage: which buckets are ready, launching their
// reductions in one global order, and the in-flight queue with its reusable buffers.
#pragma once

#include <ATen/core/Tensor.h>

#include <deque>
#include <functional>
#include <vector>

#include "comm/group.hpp"
#include "zero/shard_info.hpp"

namespace zero {

// Counts the gradients each bucket still waits for during one backward pass. Buckets are
// released strictly in index order: every rank then issues the same collectives in the same
// order, whatever order autograd happened to produce gradients in.
class BucketTracker {
 public:
  explicit BucketTracker(const FlatLayout& layout);

  void reset();
  // Records that `param` delivered its gradient. Throws if it already did in this pass, or if its
  // bucket was already released (its reduction would miss this gradient).
  void mark(int param);
  // The next bucket whose gradients are all in and whose predecessors were released, or -1.
  int next_ready();
  // The next bucket not yet released, ready or not (for the flush after backward), or -1.
  int next_unreleased();
  bool received(int param) const { return received_[param]; }

 private:
  const FlatLayout& layout_;
  std::vector<int> missing_;  // per bucket
  std::vector<char> received_;
  int next_ = 0;
};

// Reductions launched and not yet finished, oldest first, and the buffers they use. Waiting is
// always oldest-first, the order the backends complete them in.
class BucketPipeline {
 public:
  struct Buffer {
    at::Tensor in;   // padded bucket, communication dtype
    at::Tensor out;  // one shard of the bucket, communication dtype
  };

  // `in_numel`/`out_numel`: the largest padded bucket and its shard. `buffers` are allocated up
  // front (the declared bucket buffers: two let one bucket fill while the previous one is in
  // flight); 0 when the stage needs none.
  BucketPipeline(int64_t in_numel, int64_t out_numel, const at::TensorOptions& opts, int buffers);

  // A free buffer; when none is free, finishes the oldest reduction to free one. The pool grows
  // past its declared size only when nothing is in flight (gradients arriving far out of
  // bucket order), which buffers_allocated() shows.
  int acquire();
  Buffer& buffer(int i) { return buffers_[i]; }
  // Registers a launched reduction; `done` runs once it finished, then `buffer` (or -1) is freed.
  void push(comm::Work work, int buffer, std::function<void()> done);
  // Finishes every reduction in flight; returns the seconds spent waiting.
  double drain();
  bool idle() const { return inflight_.empty(); }
  int64_t bytes() const;
  int64_t buffers_allocated() const { return static_cast<int64_t>(buffers_.size()); }

 private:
  void finish_oldest();

  struct Entry {
    comm::Work work;
    int buffer;
    std::function<void()> done;
  };
  int64_t in_numel_;
  int64_t out_numel_;
  at::TensorOptions opts_;
  std::vector<Buffer> buffers_;
  std::vector<int> free_;
  std::deque<Entry> inflight_;
};

}  // namespace zero
