#include "zero/units/unit_trace.hpp"

#include <algorithm>
#include <stdexcept>
#include <string>
#include <utility>

namespace zero::units {
namespace {

constexpr uint64_t kPrime = 1099511628211ull;

uint64_t fnv(uint64_t h, uint32_t v) {
  for (int i = 0; i < 4; ++i) {
    h ^= (v >> (8 * i)) & 0xffu;
    h *= kPrime;
  }
  return h;
}

int64_t numel_of(const std::vector<int64_t>& unit_numel, int unit) {
  if (unit < 0 || static_cast<size_t>(unit) >= unit_numel.size()) {
    throw std::out_of_range("zero: unit trace: unit " + std::to_string(unit) +
                            " has no size (units 0.." + std::to_string(unit_numel.size()) + ")");
  }
  return unit_numel[unit];
}

}  // namespace

void GatherOrder::issued(int unit) {
  units_.push_back(unit);
  // Each id is hashed with its position.
  hash_ = fnv(fnv(hash_, static_cast<uint32_t>(unit)), static_cast<uint32_t>(units_.size()));
}

void GatherOrder::clear() {
  units_.clear();
  hash_ = kOffset;
}

int64_t first_difference(const std::vector<int>& a, const std::vector<int>& b) {
  const size_t n = std::min(a.size(), b.size());
  for (size_t i = 0; i < n; ++i) {
    if (a[i] != b[i]) return static_cast<int64_t>(i);
  }
  return a.size() == b.size() ? -1 : static_cast<int64_t>(n);
}

std::vector<int> prefetch_after(const std::vector<TraceEntry>& trace, int64_t pos,
                                const std::vector<int64_t>& unit_numel,
                                const std::function<bool(int)>& gathered, int64_t live_numel,
                                const PrefetchLimits& limits) {
  std::vector<int> chosen;
  if (limits.prefetch_bucket_size <= 0 || pos < 0) return chosen;
  const int64_t budget =
      std::min(limits.max_live_parameters - live_numel, limits.prefetch_bucket_size);
  int64_t taken = 0;
  for (size_t j = static_cast<size_t>(pos) + 1; j < trace.size() && taken < budget; ++j) {
    const int u = trace[j].unit;
    if (gathered(u) || std::find(chosen.begin(), chosen.end(), u) != chosen.end()) continue;
    chosen.push_back(u);
    taken += numel_of(unit_numel, u);
  }
  return chosen;
}

bool reused_soon(const std::vector<TraceEntry>& trace, int64_t pos,
                 const std::vector<int64_t>& unit_numel, int64_t max_reuse_distance) {
  if (pos < 0 || static_cast<size_t>(pos) >= trace.size()) return false;
  const int unit = trace[pos].unit;
  int64_t traversed = 0;
  for (size_t j = static_cast<size_t>(pos) + 1; j < trace.size(); ++j) {
    if (traversed >= max_reuse_distance) return false;
    if (trace[j].unit == unit) return true;
    traversed += numel_of(unit_numel, trace[j].unit);
  }
  return false;
}

UnitTrace::UnitTrace(std::vector<int64_t> unit_numel) : numel_(std::move(unit_numel)) {}

void UnitTrace::begin_pass() {
  pass_.clear();
  pos_ = -1;
  deviated_ = trace_.empty();
  in_pass_ = true;
}

void UnitTrace::enter(int unit, bool backward) {
  numel_of(numel_, unit);  // range check
  if (!in_pass_) begin_pass();
  const TraceEntry e{unit, backward};
  pass_.push_back(e);
  if (deviated_) return;
  const size_t next = pass_.size() - 1;
  if (next < trace_.size() && trace_[next] == e) {
    pos_ = static_cast<int64_t>(next);
  } else {
    deviated_ = true;
    pos_ = -1;
  }
}

void UnitTrace::end_pass() {
  if (!in_pass_) return;
  in_pass_ = false;
  // An empty pass (no unit entered) says nothing about the order.
  if (pass_.empty()) {
    deviated_ = true;
    return;
  }
  // A pass that ended early (a shorter branch) departed from the trace as much as one that
  // entered another unit.
  if (deviated_ || pass_.size() != trace_.size()) {
    trace_ = pass_;
    ++recordings_;
  }
  pos_ = -1;
  deviated_ = true;
}

void UnitTrace::forget() {
  trace_.clear();
  pass_.clear();
  pos_ = -1;
  deviated_ = true;
  in_pass_ = false;
}

std::vector<int> UnitTrace::prefetch(const std::function<bool(int)>& gathered, int64_t live_numel,
                                     const PrefetchLimits& limits) const {
  if (!following()) return {};
  return prefetch_after(trace_, pos_, numel_, gathered, live_numel, limits);
}

bool UnitTrace::keep_after_forward(int64_t max_reuse_distance) const {
  if (!following()) return false;
  return reused_soon(trace_, pos_, numel_, max_reuse_distance);
}

}  // namespace zero::units
