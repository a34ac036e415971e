#include "zero/params/shard_info.hpp"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace zero {

Range ShardInfo::owned(int rank, Range r) const {
  const Range s = shard(rank);
  const Range o{std::max(s.begin, r.begin), std::min(s.end, r.end)};
  return o.empty() ? Range{} : o;
}

FlatLayout FlatLayout::build(const std::vector<ParamSpec>& params, int64_t bucket_numel, int world,
                             int64_t align) {
  // bucket_numel 0 is DeepSpeed's reduce_bucket_size 0: every parameter its own bucket.
  if (world < 1 || align < 1 || bucket_numel < 0) {
    throw std::invalid_argument(
        "FlatLayout: world and align must be positive and the bucket size not negative");
  }
  FlatLayout L;
  L.world_ = world;
  L.bucket_numel_ = bucket_numel;
  L.align_ = align;
  int64_t shard_offset = 0;
  auto close_bucket = [&](BucketSlot& b, int64_t numel) {
    b.shard = ShardInfo{numel, world, align};
    b.shard_offset = shard_offset;
    shard_offset += b.shard.shard_numel();
    L.total_numel_ += b.shard.padded_numel();
    L.buckets_.push_back(std::move(b));
  };
  BucketSlot open;
  int64_t open_numel = 0;
  // The open unit's slot is completed when the next unit starts, or at the end.
  auto close_unit = [&] {
    if (L.units_.empty()) return;
    UnitSlot& u = L.units_.back();
    u.end_bucket = static_cast<int>(L.buckets_.size());
    u.flat_end = L.total_numel_;
    u.shard_end = shard_offset;
  };
  for (const ParamSpec& p : params) {
    if (p.numel <= 0) continue;  // nothing to shard, and no gradient will arrive for it
    if (L.units_.empty() || L.units_.back().unit != p.unit) {
      for (const UnitSlot& u : L.units_) {
        if (u.unit == p.unit) {
          throw std::invalid_argument("FlatLayout: unit " + std::to_string(p.unit) + " ('" +
                                      p.name +
                                      "') comes in two runs; specs must come unit by unit");
        }
      }
      if (open_numel > 0) {
        close_bucket(open, open_numel);
        open = BucketSlot{};
        open_numel = 0;
      }
      close_unit();
      UnitSlot u;
      u.unit = p.unit;
      u.first_bucket = static_cast<int>(L.buckets_.size());
      u.flat_begin = L.total_numel_;
      u.shard_begin = shard_offset;
      L.units_.push_back(std::move(u));
    }
    L.units_.back().params.push_back(static_cast<int>(L.params_.size()));
    // DeepSpeed's rule (stage_1_and_2.py, reduce_independent_p_g_buckets_and_remove_grads):
    // a bucket is reduced before the parameter that would take it past reduce_bucket_size
    // joins, so only a parameter larger than that on its own makes a bucket larger (and the
    // chunked reduction): buckets that close after crossing it would all be larger.
    if (open_numel > 0 && open_numel + p.numel > bucket_numel) {
      close_bucket(open, open_numel);
      open = BucketSlot{};
      open_numel = 0;
    }
    if (open_numel == 0) open.flat_offset = L.total_numel_;
    ParamSlot slot{p.name, p.numel, static_cast<int>(L.buckets_.size()),
                   open.flat_offset + open_numel};
    open.params.push_back(static_cast<int>(L.params_.size()));
    L.params_.push_back(std::move(slot));
    open_numel += p.numel;
    L.num_elements_ += p.numel;
    if (open_numel >= bucket_numel) {
      close_bucket(open, open_numel);
      open = BucketSlot{};
      open_numel = 0;
    }
  }
  if (open_numel > 0) close_bucket(open, open_numel);
  if (L.units_.empty()) L.units_.push_back(UnitSlot{});
  close_unit();
  return L;
}

int64_t FlatLayout::max_bucket_numel() const {
  int64_t m = 0;
  for (const auto& b : buckets_) m = std::max(m, b.shard.padded_numel());
  return m;
}

int64_t FlatLayout::chunk_numel() const {
  int64_t largest_shard = 0;
  for (const auto& b : buckets_) largest_shard = std::max(largest_shard, b.shard.shard_numel());
  // bucket_numel 0 (DeepSpeed's reduce_bucket_size 0) puts each parameter in a bucket of its own
  // and reduces it whole, as DeepSpeed does: chunks of `align` elements would mean thousands of
  // collectives per parameter.
  if (bucket_numel_ == 0) return largest_shard;
  const int64_t bounded = std::max(align_, bucket_numel_ / world_ / align_ * align_);
  return std::min(largest_shard, bounded);
}

std::vector<OwnedPiece> FlatLayout::owned_pieces(int rank) const {
  std::vector<OwnedPiece> out;
  for (const BucketSlot& b : buckets_) {
    const int64_t shard_begin = b.shard.shard(rank).begin;
    for (int pi : b.params) {
      const ParamSlot& p = params_[pi];
      const int64_t begin = p.flat_offset - b.flat_offset;
      const Range o = b.shard.owned(rank, {begin, begin + p.numel});
      if (o.empty()) continue;
      out.push_back({pi, o.begin - begin, b.shard_offset + (o.begin - shard_begin), o.size()});
    }
  }
  return out;
}

}  // namespace zero
