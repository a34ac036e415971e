// Stage 3 in the planner: its units (the example GPT's blocks and the root), those gathered on
// use, a pass's gathers as the engine's trace decides them, and the bytes they hold (formulas in
// include/zero/memory_plan.hpp). The prefetch and reuse rules are the engine's own
// (zero/units/unit_trace.cpp, compiled into this library).
#include <algorithm>
#include <stdexcept>

#include "zero/memory_plan.hpp"
#include "zero/plan/plan_shape.hpp"
#include "zero/time_plan.hpp"
#include "zero/units/unit_trace.hpp"

namespace zero {

std::vector<std::vector<int64_t>> stage3_units(const PlanInput& in) {
  if (!shape_is_model(in)) return {};
  const std::vector<int64_t> sizes = in.shape.parameter_sizes();
  // parameter_sizes: the embedding, then 9 per block, then the final norm (and an untied head),
  // each module a unit of its own (models/gpt.cpp marks them all, zero::shard): unit 1 the
  // embedding (a tied head runs it again), 2..L+1 the blocks, then the norm and the head.
  constexpr int64_t kPerBlock = 9;
  const int64_t layers = in.shape.layers;
  std::vector<std::vector<int64_t>> units(static_cast<size_t>(layers) + 4);
  int64_t persistent = 0;
  for (size_t i = 0; i < sizes.size(); ++i) {
    const int64_t n = sizes[i];
    bool whole = false;  // unit_plan.cpp's persistence rule, in registration order
    if (n <= in.model_persistence_threshold - persistent && n <= in.param_persistence_threshold) {
      whole = true;
      persistent += n;
    }
    const int64_t k = static_cast<int64_t>(i) - 1;
    size_t u = 0;
    if (i == 0) {
      u = 1;
    } else if (k < layers * kPerBlock) {
      u = static_cast<size_t>(2 + k / kPerBlock);
    } else {
      u = static_cast<size_t>(2 + layers + (k - layers * kPerBlock));  // norm, then head
    }
    units[whole ? 0 : u].push_back(n);
  }
  std::vector<std::vector<int64_t>> out;
  for (size_t u = 0; u < units.size(); ++u) {
    if (u > 0 && units[u].empty()) continue;
    std::reverse(units[u].begin(), units[u].end());
    out.push_back(std::move(units[u]));
  }
  return out;
}

int64_t stage3_root_params(const PlanInput& in) {
  const auto units = stage3_units(in);
  int64_t root = 0;
  if (!units.empty()) {
    for (int64_t n : units[0]) root += n;
  }
  return root;
}

std::vector<int64_t> stage3_gathered_units(const PlanInput& in) {
  const auto units = stage3_units(in);
  // Without the model's shape: the parameters in reduce_bucket_size pieces, as equal units.
  if (units.empty()) return bucket_sizes(in);
  std::vector<int64_t> out;
  for (size_t u = 1; u < units.size(); ++u) {
    int64_t n = 0;
    for (int64_t x : units[u]) n += x;
    out.push_back(n);
  }
  return out;
}

bool stage3_tied_head(const PlanInput& in) {
  const auto all = stage3_units(in);
  return in.shape.tied && all.size() > 1 && all[1].size() == 1 &&
         all[1][0] == in.shape.vocab * in.shape.hidden;
}

Stage3Pass stage3_pass(const std::vector<int64_t>& units, const std::vector<double>& gather_s,
                       const std::vector<double>& forward_s, const std::vector<double>& backward_s,
                       const PlanInput& limits, const std::vector<double>& reduce_s,
                       const TiedHead* tied) {
  const size_t k = units.size();
  if (gather_s.size() != k || forward_s.size() != k || backward_s.size() != k ||
      (!reduce_s.empty() && reduce_s.size() != k) || (tied && k == 0)) {
    throw std::invalid_argument(
        "stage3_pass: one gather, forward, backward (and reduce) time per unit");
  }
  // The engine's trace: forward in unit order, backward in reverse; a tied head is unit 0 once
  // more at the end of forward and at the start of backward.
  std::vector<units::TraceEntry> trace;
  for (size_t u = 0; u < k; ++u) trace.push_back({static_cast<int>(u), false});
  if (tied) trace.push_back({0, false});
  const size_t forward_entries = trace.size();
  if (tied) trace.push_back({0, true});
  for (size_t u = k; u-- > 0;) trace.push_back({static_cast<int>(u), true});
  const auto head_run = [&](size_t pos) {
    return tied && (pos + 1 == forward_entries || pos == forward_entries);
  };
  // A unit whose backward comes again later (the tied head's) stays gathered, and its gradient
  // is complete, only at its last use.
  const auto used_later = [&](size_t pos) {
    for (size_t j = pos + 1; j < trace.size(); ++j) {
      if (trace[j].unit == trace[pos].unit) return true;
    }
    return false;
  };
  const units::PrefetchLimits lim{limits.prefetch_bucket_size, limits.max_live_parameters,
                                  limits.max_reuse_distance};

  Stage3Pass p;
  std::vector<double> ready(k, -1);  // when a gathered unit's all-gather is done; -1: released
  int64_t live = 0;
  double stream = 0, t = 0, compute = 0;  // the gathers' stream, the compute cursor
  auto issue = [&](int u, bool backward) {
    const double start = std::max(t, stream);
    ready[u] = stream = start + gather_s[u];
    live += units[u];
    ++p.gathers;
    (backward ? p.backward_gather_s : p.forward_gather_s) += gather_s[u];
  };
  auto gathered = [&](int u) { return ready[u] >= 0; };
  double forward_end = 0;
  for (size_t pos = 0; pos < trace.size(); ++pos) {
    const auto [u, backward] = trace[pos];
    if (!gathered(u)) issue(u, backward);
    for (int v :
         units::prefetch_after(trace, static_cast<int64_t>(pos), units, gathered, live, lim))
      issue(v, backward);
    p.peak_live = std::max(p.peak_live, live);
    const double c = head_run(pos) ? (backward ? tied->backward_s : tied->forward_s)
                     : backward    ? backward_s[u]
                                   : forward_s[u];
    t = std::max(t, ready[u]) + c;
    compute += c;
    const bool last_use = !backward || !used_later(pos);
    if (backward && last_use && !reduce_s.empty()) stream = std::max(stream, t) + reduce_s[u];
    const bool keep = backward ? !last_use
                               : units::reused_soon(trace, static_cast<int64_t>(pos), units,
                                                    lim.max_reuse_distance);
    if (!keep) ready[u] = -1, live -= units[u];
    if (pos + 1 == forward_entries) forward_end = t;
  }
  p.forward_s = forward_end;
  p.backward_s = t - forward_end;
  p.exposed_s = t - compute;
  p.link_free_s = stream;
  return p;
}

int64_t stage3_transient_bytes(const PlanInput& in, int stage) {
  if (stage != 3) return 0;
  const std::vector<int64_t> units = stage3_gathered_units(in);
  if (units.empty()) return stage3_gradient_path_bytes(in, stage);
  // Only the order and the sizes decide what is live: any positive times will do.
  const std::vector<double> ones(units.size(), 1.0);
  int64_t live = stage3_pass(units, ones, ones, ones, in).peak_live;
  // A tied head runs the embedding's unit again at the end of forward, and the weight's
  // gradient is complete only after the embedding's backward: the unit stays gathered through
  // the whole backward, beside whatever the pass (which sees it once, first) holds there.
  if (stage3_tied_head(in)) live += in.shape.vocab * in.shape.hidden;
  const int64_t largest = *std::max_element(units.begin(), units.end());
  return static_cast<int64_t>(in.param_bytes) * (live + largest) +
         stage3_gradient_path_bytes(in, stage);
}

}  // namespace zero
