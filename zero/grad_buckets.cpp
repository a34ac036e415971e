#include "zero/grad_buckets.hpp"

#include <ATen/ATen.h>

#include <chrono>

namespace zero {

BucketTracker::BucketTracker(const FlatLayout& layout) : layout_(layout) { reset(); }

void BucketTracker::reset() {
  missing_.clear();
  for (const auto& b : layout_.buckets()) missing_.push_back(static_cast<int>(b.params.size()));
  received_.assign(layout_.params().size(), 0);
  next_ = 0;
}

void BucketTracker::mark(int param) {
  const ParamSlot& p = layout_.params()[param];
  TORCH_CHECK(!received_[param], "zero: parameter '", p.name,
              "' received a second gradient in one backward pass after the engine had taken the "
              "first. Use the parameter through one autograd graph per backward (a checkpointed "
              "block recomputes inside the same pass, which is fine).");
  TORCH_CHECK(p.bucket >= next_, "zero: parameter '", p.name, "' produced its gradient after ",
              "its bucket had been reduced");
  received_[param] = 1;
  --missing_[p.bucket];
}

int BucketTracker::next_ready() {
  if (next_ >= static_cast<int>(missing_.size()) || missing_[next_] > 0) return -1;
  return next_++;
}

int BucketTracker::next_unreleased() {
  if (next_ >= static_cast<int>(missing_.size())) return -1;
  return next_++;
}

BucketPipeline::BucketPipeline(int64_t in_numel, int64_t out_numel, const at::TensorOptions& opts,
                               int buffers)
    : in_numel_(in_numel), out_numel_(out_numel), opts_(opts) {
  for (int i = 0; i < buffers; ++i) {
    buffers_.push_back({at::empty({in_numel_}, opts_), at::empty({out_numel_}, opts_)});
    free_.push_back(i);
  }
}

int BucketPipeline::acquire() {
  while (free_.empty() && !inflight_.empty()) finish_oldest();
  if (free_.empty()) {
    buffers_.push_back({at::empty({in_numel_}, opts_), at::empty({out_numel_}, opts_)});
    return static_cast<int>(buffers_.size()) - 1;
  }
  const int i = free_.back();
  free_.pop_back();
  return i;
}

void BucketPipeline::push(comm::Work work, int buffer, std::function<void()> done) {
  inflight_.push_back({std::move(work), buffer, std::move(done)});
}

void BucketPipeline::finish_oldest() {
  Entry e = std::move(inflight_.front());
  inflight_.pop_front();
  e.work.wait();
  if (e.done) e.done();
  if (e.buffer >= 0) free_.push_back(e.buffer);
}

double BucketPipeline::drain() {
  const auto t0 = std::chrono::steady_clock::now();
  while (!inflight_.empty()) finish_oldest();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

int64_t BucketPipeline::bytes() const {
  int64_t n = 0;
  for (const auto& b : buffers_) n += b.in.nbytes() + b.out.nbytes();
  return n;
}

}  // namespace zero
