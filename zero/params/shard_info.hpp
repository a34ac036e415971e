// Partition math: pure integers, no tensors, so it can be tested exhaustively and reused by
// checkpoint resharding.
//
// The flat parameter buffer is a sequence of buckets (groups of whole parameters in backward
// order). Each bucket is padded and split into `world` equal, aligned shards, so that every
// bucket's gradient reduction is a true equal-split reduce-scatter (NCCL's fast path) and
// every rank owns 1/world of every bucket. A parameter may straddle shard boundaries. A rank's
// shard of the whole model is the concatenation of its shards of each bucket: one contiguous
// fp32 tensor for the optimizer.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace zero {

struct Range {
  int64_t begin = 0;
  int64_t end = 0;
  int64_t size() const { return end - begin; }
  bool empty() const { return end <= begin; }
  bool operator==(const Range&) const = default;
};

inline int64_t round_up(int64_t n, int64_t multiple) {
  return (n + multiple - 1) / multiple * multiple;
}

// One segment of `numel` elements split evenly over `world` ranks, each shard a multiple of
// `align` elements (padding at the end of the segment).
struct ShardInfo {
  int64_t numel = 0;
  int world = 1;
  int64_t align = 1;

  int64_t padded_numel() const { return round_up(numel, static_cast<int64_t>(world) * align); }
  int64_t shard_numel() const { return padded_numel() / world; }
  int64_t padding() const { return padded_numel() - numel; }
  Range shard(int rank) const { return {rank * shard_numel(), (rank + 1) * shard_numel()}; }
  // The part of `r` (segment coordinates) that `rank` owns; empty if none.
  Range owned(int rank, Range r) const;
};

struct ParamSpec {
  std::string name;
  int64_t numel = 0;
  // The sharded unit the parameter belongs to (docs/design/sharded-units.md §2.1): specs come
  // unit by unit, and a bucket never spans two units. Stages 0-2: all 0, one unit.
  int unit = 0;
};

struct ParamSlot {
  std::string name;
  int64_t numel = 0;
  int bucket = 0;
  int64_t flat_offset = 0;  // where the parameter starts in the flat buffer
};

struct BucketSlot {
  int64_t flat_offset = 0;   // where the bucket starts in the flat buffer
  int64_t shard_offset = 0;  // where this bucket's shard starts in each rank's shard tensor
  ShardInfo shard;
  std::vector<int> params;  // indices into FlatLayout::params()
};

// One unit's range of the layout: buckets [first_bucket, end_bucket), the flat buffer's
// [flat_begin, flat_end) and each rank's shard's [shard_begin, shard_end).
struct UnitSlot {
  int unit = 0;  // ParamSpec::unit
  int first_bucket = 0, end_bucket = 0;
  int64_t flat_begin = 0, flat_end = 0;
  int64_t shard_begin = 0, shard_end = 0;
  std::vector<int> params;  // indices into FlatLayout::params()
};

// A piece of one parameter that one rank owns.
struct OwnedPiece {
  int param = 0;
  int64_t param_offset = 0;  // element offset inside the parameter
  int64_t shard_offset = 0;  // element offset inside the rank's shard tensor
  int64_t numel = 0;
};

class FlatLayout {
 public:
  // Parameters in the order their gradients are expected (backward order). A bucket closes
  // before the parameter that would take it past `bucket_numel` elements (DeepSpeed's rule); a
  // parameter larger than that gets its own bucket (bucket_numel 0: every parameter does). A bucket also closes where the unit
  // changes; a unit must come in one run (std::invalid_argument otherwise).
  static FlatLayout build(const std::vector<ParamSpec>& params, int64_t bucket_numel, int world,
                          int64_t align);
  // The units in layout order, each a contiguous range of buckets; one (unit 0, possibly
  // empty) when every parameter is in unit 0 or there are none.
  const std::vector<UnitSlot>& units() const { return units_; }

  const std::vector<ParamSlot>& params() const { return params_; }
  const std::vector<BucketSlot>& buckets() const { return buckets_; }
  int world() const { return world_; }
  int64_t num_elements() const { return num_elements_; }  // real elements, no padding
  int64_t total_numel() const { return total_numel_; }    // flat buffer size, with padding
  int64_t shard_numel() const { return total_numel_ / world_; }
  int64_t max_bucket_numel() const;
  // Per-rank elements one reduction moves at a time: a bucket whose shard is larger (a parameter
  // bigger than reduce_bucket_size makes one) is reduced in chunks of this many elements per
  // rank, so a bucket buffer holds at most world() x chunk_numel() <= bucket_numel elements
  // (one aligned row per rank when bucket_numel is smaller than that), never a whole bucket.
  int64_t chunk_numel() const;
  // Elements of one bucket buffer: world() x chunk_numel().
  int64_t buffer_numel() const { return world_ * chunk_numel(); }

  // Every piece of every parameter that `rank` owns, in shard order.
  std::vector<OwnedPiece> owned_pieces(int rank) const;
  // Merged shard ranges of `rank` covering the parameters `select` accepts.
  template <class Pred>
  std::vector<Range> owned_ranges(int rank, Pred select) const {
    std::vector<Range> out;
    for (const OwnedPiece& p : owned_pieces(rank)) {
      if (!select(params_[p.param])) continue;
      Range r{p.shard_offset, p.shard_offset + p.numel};
      if (!out.empty() && out.back().end == r.begin) {
        out.back().end = r.end;
      } else {
        out.push_back(r);
      }
    }
    return out;
  }

 private:
  std::vector<ParamSlot> params_;
  std::vector<BucketSlot> buckets_;
  std::vector<UnitSlot> units_;
  int world_ = 1;
  int64_t bucket_numel_ = 1;
  int64_t align_ = 1;
  int64_t num_elements_ = 0;
  int64_t total_numel_ = 0;
};

}  // namespace zero
