// The bucket logic shared by every ZeRO stage: which buckets are ready, launching their
// reductions in one global order, and the in-flight queue with its bounded pool of buffers.
#pragma once

#include <ATen/core/Tensor.h>

#include <deque>
#include <functional>
#include <vector>

#include "comm/group.hpp"
#include "zero/params/shard_info.hpp"

namespace zero {

// How many gradients a parameter is expected to deliver in one backward pass (see GradOrder):
// 0 for a parameter the loss does not reach (it counts as delivered with a zero gradient), 1 for
// most, more for one used inside several checkpointed blocks (each recomputation is a separate
// backward), kUnknown when it cannot be known yet (its bucket then waits for the end of backward).
constexpr int kUnknownArrivals = -1;

// One piece of a bucket's reduction when the bucket is larger than a bucket buffer
// (FlatLayout::chunk_numel): for every rank r, the bucket-local elements
// [r*S + offset, r*S + offset + numel), S being the bucket's shard size, packed rank after rank
// into world*numel elements. Each chunk is then itself an equal-split reduce-scatter whose
// rank-r output is elements [offset, offset + numel) of r's shard of the bucket. A bucket no
// larger than a buffer is one chunk covering it all (the packing is then the identity).
struct BucketChunk {
  int64_t offset = 0;
  int64_t numel = 0;
};
std::vector<BucketChunk> bucket_chunks(const BucketSlot& bucket, int64_t chunk_numel);

// Copies (or adds, `add`) what `src`, the bucket-local elements [begin, begin + src.numel()),
// holds of chunk `c` into its place in `packed` (world*c.numel elements).
void pack_chunk(const at::Tensor& packed, const BucketSlot& bucket, const BucketChunk& c,
                int64_t begin, const at::Tensor& src, bool add = false);
// The reverse: chunk `c` of `packed` back into `dst` (bucket-local elements from `begin`).
void unpack_chunk(const at::Tensor& packed, const BucketSlot& bucket, const BucketChunk& c,
                  int64_t begin, const at::Tensor& dst);

// Counts the gradients each bucket still waits for during one backward pass. Buckets are
// released strictly in one release order (index order until set_order): every rank then issues
// the same collectives in the same order, whatever order autograd happened to produce gradients
// in. The release order is the communication order only; the layout (and with it every state
// and shard) never changes, as DDP's Reducer::rebuild_buckets changes its buckets and nothing
// else.
class BucketTracker {
 public:
  explicit BucketTracker(const FlatLayout& layout);

  // Buckets are released in `order` (a permutation of the bucket indices) from the next pass on.
  void set_order(const std::vector<int>& order);
  // A new pass; `expected` per parameter (layout order), empty: one gradient each.
  // `guess_unknown`: a parameter whose count is kUnknownArrivals counts as complete after its
  // first gradient (its bucket need not wait for the end of backward); a further gradient of it
  // after its bucket was released is then "late" (mark returns 0), for the caller to reduce on
  // its own. Without it such a bucket waits for the end of backward.
  void reset(const std::vector<int>& expected = {}, bool guess_unknown = false);
  // Records that `param` delivered a gradient; returns how many it delivered in this pass so far,
  // or 0 for a late gradient of a guessed parameter (see reset). Otherwise throws if its bucket
  // was already released (its reduction would miss this gradient).
  int mark(int param);
  // The next bucket whose gradients are all in and whose predecessors were released, or -1.
  // `may_launch` (when set) can hold a complete bucket back: it is then not ready yet, and
  // neither is any bucket after it in the release order.
  int next_ready(const std::function<bool(int)>& may_launch = {});
  // The next bucket not yet released, ready or not (for the flush after backward), or -1.
  int next_unreleased();
  // Position in the release order of the first bucket not yet released.
  int next() const { return next_; }
  // Position of bucket `b` in the release order.
  int position(int b) const { return position_[b]; }

 private:
  const FlatLayout& layout_;
  std::vector<int> order_;     // release position -> bucket
  std::vector<int> position_;  // bucket -> release position
  std::vector<int> missing_;   // per bucket: parameters whose gradients are not all in
  std::vector<int> expected_;
  std::vector<int> received_;
  std::vector<char> guessed_;  // expected_ is a guess of one (see reset)
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
  // flight) and never grow; 0 when the stage needs none. `on_demand` (stage 3, which holds no
  // gradient path between steps): each buffer is allocated when it is first acquired, and
  // free_buffers() gives them all back once nothing is in flight (stage 3 calls it once per
  // accumulation window, from zero_grad).
  BucketPipeline(int64_t in_numel, int64_t out_numel, const at::TensorOptions& opts, int buffers,
                 bool on_demand = false);

  // A free buffer; when none is free, finishes the oldest reduction to free one; -1 when none
  // is free and nothing is in flight (every buffer is held by a bucket still filling).
  int acquire();
  Buffer& buffer(int i) { return buffers_[i]; }
  // Hands back a buffer that no reduction uses.
  void release(int buffer);
  // Runs `fence` when `buffer` is next acquired, before anything writes it: e.g. makes the
  // current stream wait for a copy still reading the buffer's reduced shard (grad_to_host.hpp),
  // a wait that a copy finished by then costs nothing.
  void before_reuse(int buffer, std::function<void()> fence);
  // Registers a launched reduction; `done` runs once it finished, then `buffer` (or -1) is freed.
  void push(comm::Work work, int buffer, std::function<void()> done);
  // Finishes every reduction in flight; returns the seconds spent waiting.
  double drain();
  // After a failed backward: waits for what is in flight without running its `done` (errors
  // are swallowed: the caller is already reporting one) and frees every buffer.
  void abort();
  bool idle() const { return inflight_.empty(); }
  // on_demand only: frees every buffer's bytes (the next acquire allocates it again). Nothing may
  // be in flight, and whatever read a buffer after its reduction (a copy to the host) must be
  // done: its fence is dropped with the buffer.
  void free_buffers();
  // The bytes the buffers hold now (all of them, unless on_demand).
  int64_t bytes() const;
  int buffers() const { return static_cast<int>(buffers_.size()); }
  // Most buffers held at once (by buckets filling or in flight) since construction.
  int peak_in_use() const { return peak_in_use_; }

 private:
  void finish_oldest();

  struct Entry {
    comm::Work work;
    int buffer;
    std::function<void()> done;
  };
  std::vector<Buffer> buffers_;
  int64_t in_numel_ = 0, out_numel_ = 0;
  at::TensorOptions opts_;
  bool on_demand_ = false;
  std::vector<int> free_;
  std::vector<std::function<void()>> fences_;  // per buffer, see before_reuse
  std::deque<Entry> inflight_;
  int peak_in_use_ = 0;
};

}  // namespace zero
