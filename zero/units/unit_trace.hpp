// The order units are used in, and what follows from it (design sharded-units.md §3.5): the hash
// that proves every rank issued its gathers in one order, the recorded trace of a pass, and the
// prefetch and reuse decisions DeepSpeed's PartitionedParameterCoordinator makes from it. Pure:
// no tensors, no communication.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

namespace zero::units {

// The units a rank issued gathers for, in order, over one pass. All-gathers are collectives:
// two ranks gathering different units of equal size would exchange the wrong shards without
// any error, so the engine compares hash() across ranks at the end of each backward.
class GatherOrder {
 public:
  void issued(int unit);
  void clear();
  // FNV-1a over the unit ids and their count; equal lists give equal hashes.
  uint64_t hash() const { return hash_; }
  const std::vector<int>& units() const { return units_; }

 private:
  std::vector<int> units_;
  uint64_t hash_ = kOffset;
  static constexpr uint64_t kOffset = 14695981039346656037ull;
};

// Where two ranks' orders part: the first differing position, the shorter one's length if one
// is a prefix of the other, -1 if they are equal.
int64_t first_difference(const std::vector<int>& a, const std::vector<int>& b);

struct TraceEntry {
  int unit = 0;
  bool backward = false;
  bool operator==(const TraceEntry&) const = default;
};

// DeepSpeed's knobs, in elements (config keys stage3_prefetch_bucket_size,
// stage3_max_live_parameters, stage3_max_reuse_distance; DeepSpeed's defaults).
struct PrefetchLimits {
  int64_t prefetch_bucket_size = 50'000'000;  // 0: no prefetch
  int64_t max_live_parameters = 1'000'000'000;
  int64_t max_reuse_distance = 1'000'000'000;
};

// The units to gather ahead when the pass is at `trace[pos]`: the next entries' units in order,
// skipping those gathered (or already chosen), while the elements chosen so far are below
// min(prefetch_bucket_size, max_live_parameters - live_numel) - so the last one chosen may
// cross it, as in DeepSpeed's fetch_sub_module. `live_numel` counts what is gathered now,
// the current unit included.
std::vector<int> prefetch_after(const std::vector<TraceEntry>& trace, int64_t pos,
                                const std::vector<int64_t>& unit_numel,
                                const std::function<bool(int)>& gathered, int64_t live_numel,
                                const PrefetchLimits& limits);

// Whether the unit at `trace[pos]` recurs before the elements of the entries in between add up
// to `max_reuse_distance` (DeepSpeed's __params_to_release): then it is kept gathered.
bool reused_soon(const std::vector<TraceEntry>& trace, int64_t pos,
                 const std::vector<int64_t>& unit_numel, int64_t max_reuse_distance);

// A rank's record of its passes (forward then backward of one micro-step). The first pass is
// recorded; the following ones are checked against it entry by entry. A pass that departs from
// the trace (a branch taken differently: alike on all ranks, or the hash catches it) gets no
// decisions from then on and becomes the trace when it ends.
class UnitTrace {
 public:
  explicit UnitTrace(std::vector<int64_t> unit_numel);

  void begin_pass();
  void enter(int unit, bool backward);
  void end_pass();
  // Drops the trace and the pass under way: the next pass is recorded afresh.
  void forget();

  // A trace exists and the current pass has matched it so far (at least one entry).
  bool following() const { return !deviated_ && pos_ >= 0; }
  // The current entry's position in trace(); -1 when not following.
  int64_t position() const { return following() ? pos_ : -1; }
  const std::vector<TraceEntry>& trace() const { return trace_; }
  const std::vector<TraceEntry>& recorded() const { return pass_; }
  int64_t passes_recorded() const { return recordings_; }

  // The decisions at the current entry; nothing to prefetch and no reuse when not following.
  std::vector<int> prefetch(const std::function<bool(int)>& gathered, int64_t live_numel,
                            const PrefetchLimits& limits) const;
  bool keep_after_forward(int64_t max_reuse_distance) const;

 private:
  std::vector<int64_t> numel_;
  std::vector<TraceEntry> trace_;
  std::vector<TraceEntry> pass_;
  int64_t pos_ = -1;
  bool deviated_ = false;
  bool in_pass_ = false;
  int64_t recordings_ = 0;
};

}  // namespace zero::units
