#include "zero/engine/engine_units.hpp"

#include <utility>

namespace zero {
namespace {

// The elements a gather brings in: the unit's whole buffer, padding included (what the cap on
// live parameters bounds is memory). Resident units are never gathered: 0.
std::vector<int64_t> gathered_numels(const std::vector<ShardedUnit*>& units) {
  std::vector<int64_t> n;
  for (const ShardedUnit* u : units) {
    const bool on_use = u->residency() == Residency::kOnUse;
    n.push_back(on_use ? u->slot().flat_end - u->slot().flat_begin : 0);
  }
  return n;
}

}  // namespace

EngineUnits::EngineUnits(std::vector<ShardedUnit*> units, const bool& in_backward,
                         units::PrefetchLimits limits, std::function<void(int)> on_forward,
                         std::function<void(int)> on_backward)
    : units_(std::move(units)),
      numel_(gathered_numels(units_)),
      in_backward_(in_backward),
      limits_(limits),
      on_forward_(std::move(on_forward)),
      on_backward_(std::move(on_backward)),
      trace_(numel_),
      check_([this](int u) { return at(u).name(); }) {}

void EngineUnits::gather(int unit) {
  at(unit).gather();
  order_.issued(unit);
  ++counters_.gathers;
}

void EngineUnits::wait(int unit) {
  const auto t0 = std::chrono::steady_clock::now();
  at(unit).wait();
  wait_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

void EngineUnits::entered_forward(int unit) {
  trace_.enter(unit, /*backward=*/false);
  if (on_forward_) on_forward_(unit);
}

void EngineUnits::entered_backward(int unit) {
  trace_.enter(unit, /*backward=*/true);
  if (on_backward_) on_backward_(unit);
}

int64_t EngineUnits::live_numel() const {
  int64_t n = 0;
  for (size_t u = 0; u < units_.size(); ++u) {
    if (numel_[u] > 0 && units_[u]->gathered()) n += numel_[u];
  }
  return n;
}

void EngineUnits::prefetch() {
  // Every rank decides from the same trace, the same gathered set (gathers and releases follow
  // the same graph on every rank) and the same limits, so the gathers issued here come in the
  // same order everywhere; the order check at the end of backward holds the rest to it.
  const std::vector<int> next = trace_.prefetch(
      [this](int u) { return at(u).gathered(); }, live_numel(), limits_);
  for (const int u : next) {
    gather(u);
    ++counters_.prefetched;
  }
}

bool EngineUnits::keep_after_forward(int unit) const {
  // Asked right after the unit's own forward; a unit run inside another one's leaves the
  // position elsewhere, and is released as without a trace.
  const int64_t pos = trace_.position();
  if (pos < 0 || trace_.trace()[pos].unit != unit) return false;
  return trace_.keep_after_forward(limits_.max_reuse_distance);
}

void EngineUnits::end_pass(comm::Group& gathers, const c10::Device& device) {
  trace_.end_pass();
  check_.check(gathers, device, order_);
}

void EngineUnits::abandon_pass() {
  trace_.forget();
  check_.forget(order_);
}

}  // namespace zero
