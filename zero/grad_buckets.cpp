#include "zero/grad_buckets.hpp"

#include <ATen/ATen.h>

#include <algorithm>
#include <chrono>

namespace zero {

BucketTracker::BucketTracker(const FlatLayout& layout) : layout_(layout) { reset(); }

void BucketTracker::reset(const std::vector<int>& expected) {
  const size_t n = layout_.params().size();
  TORCH_INTERNAL_ASSERT(expected.empty() || expected.size() == n);
  expected_ = expected.empty() ? std::vector<int>(n, 1) : expected;
  received_.assign(n, 0);
  missing_.assign(layout_.buckets().size(), 0);
  for (size_t p = 0; p < n; ++p) {
    if (expected_[p] != 0) ++missing_[layout_.params()[p].bucket];
  }
  next_ = 0;
}

int BucketTracker::mark(int param) {
  const ParamSlot& p = layout_.params()[param];
  TORCH_CHECK(p.bucket >= next_, "zero: parameter '", p.name, "' produced a gradient after its ",
              "bucket had been reduced (", received_[param], " gradient(s) of it were expected in ",
              "this backward pass and had arrived). A parameter used both inside and outside a "
              "checkpointed block, or whose use changes from step to step, can do this; use it "
              "the same way in every step.");
  const int n = ++received_[param];
  if (expected_[param] > 0 && n == expected_[param]) --missing_[p.bucket];
  return n;
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
                               int buffers) {
  for (int i = 0; i < buffers; ++i) {
    buffers_.push_back({at::empty({in_numel}, opts), at::empty({out_numel}, opts)});
    free_.push_back(i);
  }
}

int BucketPipeline::acquire() {
  while (free_.empty() && !inflight_.empty()) finish_oldest();
  if (free_.empty()) return -1;
  const int i = free_.back();
  free_.pop_back();
  peak_in_use_ = std::max(peak_in_use_, buffers() - static_cast<int>(free_.size()));
  return i;
}

void BucketPipeline::release(int buffer) {
  if (buffer >= 0) free_.push_back(buffer);
}

void BucketPipeline::push(comm::Work work, int buffer, std::function<void()> done) {
  inflight_.push_back({std::move(work), buffer, std::move(done)});
}

void BucketPipeline::finish_oldest() {
  Entry e = std::move(inflight_.front());
  inflight_.pop_front();
  e.work.wait();
  if (e.done) e.done();
  release(e.buffer);
}

double BucketPipeline::drain() {
  const auto t0 = std::chrono::steady_clock::now();
  while (!inflight_.empty()) finish_oldest();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

void BucketPipeline::abort() {
  while (!inflight_.empty()) {
    Entry e = std::move(inflight_.front());
    inflight_.pop_front();
    try {
      // The backend may still write into the buffer: it is reused only once this returned.
      e.work.wait();
    } catch (const std::exception&) {
    }
  }
  free_.clear();
  for (int i = buffers() - 1; i >= 0; --i) free_.push_back(i);
}

int64_t BucketPipeline::bytes() const {
  int64_t n = 0;
  for (const auto& b : buffers_) n += b.in.nbytes() + b.out.nbytes();
  return n;
}

}  // namespace zero
