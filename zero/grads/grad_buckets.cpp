#include "zero/grads/grad_buckets.hpp"

#include "zero/grads/grad_sync.hpp"

#include <ATen/ATen.h>

#include <algorithm>
#include <chrono>
#include <utility>

#include "zero/host_counting.hpp"

namespace zero {

std::vector<BucketChunk> bucket_chunks(const BucketSlot& bucket, int64_t chunk_numel) {
  std::vector<BucketChunk> out;
  const int64_t S = bucket.shard.shard_numel();
  for (int64_t at = 0; at < S; at += chunk_numel)
    out.push_back({at, std::min(chunk_numel, S - at)});
  return out;
}

std::unique_ptr<compress::QuantizedReduceScatter> make_quantized_reduce(
    const FlatLayout& layout, comm::Group& group, const GradSyncOptions& opts,
    std::vector<int>& first_slot) {
  first_slot.clear();
  if (!opts.compress.enabled) return nullptr;
  std::vector<int64_t> slots;
  for (const BucketSlot& b : layout.buckets()) {
    first_slot.push_back(static_cast<int>(slots.size()));
    const std::vector<BucketChunk> chunks = bucket_chunks(b, layout.chunk_numel());
    for (const BucketChunk& c : chunks) slots.push_back(layout.world() * c.numel);
    if (chunks.empty()) slots.push_back(0);  // an empty shard is still one (empty) reduction
  }
  return std::make_unique<compress::QuantizedReduceScatter>(group, opts.compress, slots,
                                                            opts.device, opts.node_of);
}

namespace {

// Calls f(packed_offset, bucket_offset, numel) for each overlap of chunk `c` with the
// bucket-local range [begin, end).
template <class F>
void for_each_overlap(const BucketSlot& bucket, const BucketChunk& c, int64_t begin, int64_t end,
                      F f) {
  const int64_t S = bucket.shard.shard_numel();
  for (int r = 0; r < bucket.shard.world; ++r) {
    const int64_t lo = r * S + c.offset;
    const int64_t b = std::max(lo, begin), e = std::min(lo + c.numel, end);
    if (b < e) f(r * c.numel + (b - lo), b, e - b);
  }
}

}  // namespace

void pack_chunk(const at::Tensor& packed, const BucketSlot& bucket, const BucketChunk& c,
                int64_t begin, const at::Tensor& src, bool add) {
  for_each_overlap(bucket, c, begin, begin + src.numel(), [&](int64_t p, int64_t b, int64_t n) {
    at::Tensor dst = packed.narrow(0, p, n);
    const at::Tensor from = src.narrow(0, b - begin, n);
    if (add) {
      dst.add_(from.to(dst.scalar_type()));
    } else {
      dst.copy_(from);
    }
  });
}

void unpack_chunk(const at::Tensor& packed, const BucketSlot& bucket, const BucketChunk& c,
                  int64_t begin, const at::Tensor& dst) {
  for_each_overlap(bucket, c, begin, begin + dst.numel(), [&](int64_t p, int64_t b, int64_t n) {
    dst.narrow(0, b - begin, n).copy_(packed.narrow(0, p, n));
  });
}

BucketTracker::BucketTracker(const FlatLayout& layout) : layout_(layout) {
  std::vector<int> identity(layout.buckets().size());
  for (size_t b = 0; b < identity.size(); ++b) identity[b] = static_cast<int>(b);
  set_order(identity);
  reset();
}

void BucketTracker::set_order(const std::vector<int>& order) {
  TORCH_INTERNAL_ASSERT(order.size() == layout_.buckets().size());
  order_ = order;
  position_.assign(order.size(), -1);
  for (size_t k = 0; k < order.size(); ++k) {
    TORCH_INTERNAL_ASSERT(order[k] >= 0 && order[k] < static_cast<int>(order.size()) &&
                          position_[order[k]] < 0);
    position_[order[k]] = static_cast<int>(k);
  }
}

void BucketTracker::reset(const std::vector<int>& expected, bool guess_unknown) {
  const size_t n = layout_.params().size();
  TORCH_INTERNAL_ASSERT(expected.empty() || expected.size() == n);
  expected_ = expected.empty() ? std::vector<int>(n, 1) : expected;
  guessed_.assign(n, 0);
  for (size_t p = 0; p < n && guess_unknown; ++p) {
    if (expected_[p] == kUnknownArrivals) {
      expected_[p] = 1;
      guessed_[p] = 1;
    }
  }
  received_.assign(n, 0);
  missing_.assign(layout_.buckets().size(), 0);
  for (size_t p = 0; p < n; ++p) {
    if (expected_[p] != 0) ++missing_[layout_.params()[p].bucket];
  }
  next_ = 0;
}

int BucketTracker::mark(int param) {
  const ParamSlot& p = layout_.params()[param];
  if (guessed_[param] && position_[p.bucket] < next_) {
    ++received_[param];
    return 0;
  }
  TORCH_CHECK(position_[p.bucket] >= next_, "zero: parameter '", p.name,
              "' produced a gradient after its ", "bucket had been reduced (", received_[param],
              " gradient(s) of it were expected in ",
              "this backward pass and had arrived). A parameter used both inside and outside a "
              "checkpointed block, or whose use changes from step to step, can do this; use it "
              "the same way in every step.");
  const int n = ++received_[param];
  if (expected_[param] > 0 && n == expected_[param]) --missing_[p.bucket];
  return n;
}

int BucketTracker::next_ready(const std::function<bool(int)>& may_launch) {
  if (next_ >= static_cast<int>(missing_.size()) || missing_[order_[next_]] > 0) return -1;
  if (may_launch && !may_launch(order_[next_])) return -1;
  return order_[next_++];
}

int BucketTracker::next_unreleased() {
  if (next_ >= static_cast<int>(missing_.size())) return -1;
  return order_[next_++];
}

BucketPipeline::BucketPipeline(int64_t in_numel, int64_t out_numel, const at::TensorOptions& opts,
                               int buffers, bool on_demand)
    : in_numel_(in_numel), out_numel_(out_numel), opts_(opts), on_demand_(on_demand) {
  for (int i = 0; i < buffers; ++i) {
    buffers_.push_back(
        on_demand ? Buffer{} : Buffer{at::empty({in_numel}, opts), at::empty({out_numel}, opts)});
    free_.push_back(i);
  }
  fences_.resize(buffers);
}

int BucketPipeline::acquire() {
  while (free_.empty() && !inflight_.empty()) finish_oldest();
  if (free_.empty()) return -1;
  const int i = free_.back();
  free_.pop_back();
  if (auto fence = std::exchange(fences_[i], nullptr)) fence();
  if (!buffers_[i].in.defined()) {
    const HostCountingAllocator::Tag tag(HostTag::kBuckets);  // what a CPU peak is made of
    buffers_[i] = {at::empty({in_numel_}, opts_), at::empty({out_numel_}, opts_)};
  }
  peak_in_use_ = std::max(peak_in_use_, buffers() - static_cast<int>(free_.size()));
  return i;
}

void BucketPipeline::release(int buffer) {
  if (buffer >= 0) free_.push_back(buffer);
}

void BucketPipeline::before_reuse(int buffer, std::function<void()> fence) {
  fences_[buffer] = std::move(fence);
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
  // Whoever set them waited for their copies in its own abort (GradToHost::abort).
  for (auto& f : fences_) f = nullptr;
}

void BucketPipeline::free_buffers() {
  TORCH_INTERNAL_ASSERT(on_demand_, "zero: the bucket buffers are allocated up front");
  TORCH_INTERNAL_ASSERT(inflight_.empty(), "zero: bucket buffers freed while a reduction runs");
  TORCH_INTERNAL_ASSERT(free_.size() == buffers_.size(), "zero: a bucket buffer is still held");
  for (auto& b : buffers_) b = Buffer{};
  for (auto& f : fences_) f = nullptr;
}

int64_t BucketPipeline::bytes() const {
  int64_t n = 0;
  for (const auto& b : buffers_) {
    if (b.in.defined()) n += b.in.nbytes() + b.out.nbytes();
  }
  return n;
}

}  // namespace zero
