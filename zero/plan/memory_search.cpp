// The memory planner's search: which configurations fit a device and which of them it picks
// (formulas in include/zero/memory_plan.hpp, the bytes in memory_plan.cpp).
//
// Ranking of configurations that fit, and why:
//  1. Least recompute: checkpointing re-runs every block's forward in backward (about a third
//     more compute); CPU offload adds two PCIe copies of every block input on top.
//  2. The largest micro-batch: fuller kernels, and fewer accumulation steps per global batch.
//  3. The lowest stage. With NCCL, stage 1's reduce-scatter + all-gather moves the same bytes as
//     stage 0's all-reduce, and so does stage 2: the stage buys memory, not bandwidth. Memory
//     matters only through 1 and 2, so among otherwise equal configurations the stage that does
//     less wins: stages 1 and 2 all-gather the updated parameters after the step, outside
//     backward's overlap, and stage 2 reduce-scatters every micro-step under gradient
//     accumulation where stages 0 and 1 reduce once per step. (Without accumulation stage 1
//     reduces during backward as stage 2 does and holds the same bytes, so it wins the tie.)
#include "zero/memory_plan.hpp"
#include "zero/plan/plan_shape.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>

namespace zero {

int64_t PlanLimits::budget() const {
  return static_cast<int64_t>(static_cast<double>(device_bytes) * (1.0 - reserve));
}

int64_t PlanLimits::host_budget() const {
  return static_cast<int64_t>(static_cast<double>(host_bytes) * (1.0 - reserve));
}

namespace {

constexpr Recompute kModes[] = {Recompute::kNone, Recompute::kCheckpoint,
                                Recompute::kCheckpointOffload};

PlanCandidate candidate(const PlanInput& in, int stage, Recompute r) {
  const bool offload = in.offload_optimizer && stage > 0;
  return {stage,
          r,
          in.micro_batch,
          plan_model_states(in, stage),
          predict_activations(in, r),
          offload,
          plan_host_states(in, stage)};
}

StageOption search(const PlanInput& in, const PlanLimits& lim, int stage, Recompute r) {
  StageOption o;
  if (in.offload_optimizer && stage == 0) return o;  // the engine offloads at stages 1-2 only
  PlanInput x = in;
  // Without a shape activations are unknown: only the micro-batch asked for is meaningful.
  const bool sweep = in.shape.known();
  const int64_t max_b = sweep ? std::max<int64_t>(1, lim.max_micro_batch) : in.micro_batch;
  for (int64_t b = sweep ? 1 : in.micro_batch;; b *= 2) {
    x.micro_batch = b;
    const PlanCandidate c = candidate(x, stage, r);
    if (c.total() > lim.budget()) {
      o.refused = c;
      break;
    }
    o.fits = true;
    o.best = c;
    if (b * 2 > max_b) {
      o.refused.micro_batch = 0;
      break;
    }
  }
  return o;
}

std::string fmt(const char* f, auto... args) {
  char buf[512];
  std::snprintf(buf, sizeof buf, f, args...);
  return buf;
}

using Options = StageOption[3][3];

std::string stage_line(const PlanInput& in, const PlanLimits& lim, const Options& opts, int s) {
  const MemoryBreakdown st = plan_model_states(in, s);
  const int64_t host = plan_host_states(in, s);
  std::string line;
  if (host > 0) {
    // The device keeps the parameters, stage 1's accumulator if any, and the buffers.
    const int64_t device = st.total() - host;
    line =
        fmt("stage %d with optimizer offload: device %s (%dΨ parameters + %s of gradient "
            "accumulator and bucket buffers), host %s per rank (%dΨ/%d: fp32 master, %d states, "
            "fp32 gradient shard, %d-byte copy)",
            s, format_gb(device).c_str(), in.param_bytes, format_gb(device - st.params).c_str(),
            format_gb(host).c_str(), 8 + 4 * in.optimizer_states + in.param_bytes, in.world_size,
            in.optimizer_states, in.param_bytes);
    if (device > lim.budget()) {
      return line + fmt(" > %s: does not fit at any micro-batch", format_gb(lim.budget()).c_str());
    }
  } else {
    line = fmt("stage %d: model states %s = %s + %s bucket buffers = %s", s,
               model_state_formula(in, s).c_str(), format_gb(st.total() - st.comm_buffers).c_str(),
               format_gb(st.comm_buffers).c_str(), format_gb(st.total()).c_str());
    if (st.total() > lim.budget()) {
      return line + fmt(" > %s: does not fit at any micro-batch", format_gb(lim.budget()).c_str());
    }
  }
  for (int r = 0; r < (in.shape.known() ? 3 : 1); ++r) {
    const StageOption& o = opts[s][r];
    line += fmt("\n    %s: ", recompute_name(kModes[r]));
    if (!o.fits) {
      line += fmt("micro-batch %lld needs %s", (long long)o.refused.micro_batch,
                  format_gb(o.refused.total()).c_str());
      continue;
    }
    line += fmt("micro-batch %lld fits (%s", (long long)o.best.micro_batch,
                format_gb(o.best.total()).c_str());
    if (o.best.host() > 0) line += fmt("; %s in host memory", format_gb(o.best.host()).c_str());
    line += ")";
    if (!in.shape.known()) continue;  // one micro-batch, activations not counted
    line += o.refused.micro_batch == 0
                ? fmt(", the search stops at %lld", (long long)lim.max_micro_batch)
                : fmt(", %lld needs %s", (long long)o.refused.micro_batch,
                      format_gb(o.refused.total()).c_str());
  }
  return line;
}

// The smallest world size at which stage 2 with offloaded checkpoints fits micro-batch 1.
int min_world_for_stage2(PlanInput in, const PlanLimits& lim) {
  in.micro_batch = 1;
  for (int n = in.world_size + 1; n <= (1 << 16); ++n) {
    in.world_size = n;
    if (candidate(in, 2, Recompute::kCheckpointOffload).total() <= lim.budget()) return n;
  }
  return 0;
}

// The best of `opts` by the ranking in the header; false when nothing fits.
bool pick(const Options& opts, PlanCandidate& best) {
  bool found = false;
  for (int r = 0; r < 3 && !found; ++r) {
    for (int s = 0; s < 3; ++s) {
      const StageOption& o = opts[s][r];
      if (o.fits && (!found || o.best.micro_batch > best.micro_batch)) {
        found = true;
        best = o.best;
      }
    }
  }
  return found;
}

// "no stage fits without checkpointing; stage 0 does not fit that way; ..."
std::string because(const Options& opts, const PlanCandidate& b) {
  std::string out = b.recompute == Recompute::kNone
                        ? "nothing is recomputed"
                        : fmt("no stage fits without %s", b.recompute == Recompute::kCheckpoint
                                                              ? "checkpointing"
                                                              : "offloading the checkpoints");
  const int r = static_cast<int>(b.recompute);
  for (int s = b.offload ? 1 : 0; s < 3; ++s) {
    const StageOption& o = opts[s][r];
    if (s == b.stage) continue;
    if (!o.fits) {
      out += fmt("; stage %d does not fit that way", s);
    } else if (o.best.micro_batch < b.micro_batch) {
      out += fmt("; stage %d fits only micro-batch %lld", s, (long long)o.best.micro_batch);
    } else {
      out += fmt("; stage %d fits it too but does more per step", s);
    }
  }
  return out;
}

// Why nothing fits without optimizer offload, and what would.
void explain_nothing_fits(const PlanInput& plain, const MemoryPlan& plan,
                          std::vector<std::string>& why) {
  const PlanLimits& limits = plan.limits;
  const StageOption& least = plan.options[2][2];
  why.push_back(
      fmt("=> nothing fits without optimizer offload: the smallest configuration, stage 2 with %s "
          "at micro-batch %lld, needs %s > %s",
          recompute_name(Recompute::kCheckpointOffload), (long long)least.refused.micro_batch,
          format_gb(least.refused.total()).c_str(), format_gb(limits.budget()).c_str()));
  const int64_t buffers = least.refused.states.comm_buffers;
  if (least.refused.total() - buffers <= limits.budget()) {
    why.push_back(fmt("   %s of it are bucket buffers: a smaller reduce_bucket_size makes it fit",
                      format_gb(buffers).c_str()));
  }
  if (const int n = min_world_for_stage2(plain, limits); n > 0) {
    why.push_back(
        fmt("   stage 2 would fit on %d or more such devices: its sharded states, "
            "%gΨ/N, shrink with N",
            n, 8.0 + 4.0 * plain.optimizer_states));
  } else {
    why.push_back(
        fmt("   the %dΨ of parameters every rank holds leaves no room: it needs "
            "parameter partitioning (zero_optimization.stage: 3, which stage: auto picks when "
            "it fits: see its column above) or a larger device",
            plain.param_bytes));
  }
}

}  // namespace

MemoryPlan plan_memory(const PlanInput& in, const PlanLimits& limits) {
  MemoryPlan plan;
  plan.limits = limits;
  PlanInput plain = in, off = in;
  plain.offload_optimizer = false;
  off.offload_optimizer = true;
  for (int s = 0; s < 3; ++s) {
    for (int r = 0; r < 3; ++r) {
      plan.options[s][r] = search(plain, limits, s, kModes[r]);
      plan.offload[s][r] = search(off, limits, s, kModes[r]);
    }
  }
  auto& why = plan.reasons;
  why.push_back(
      fmt("budget per rank: %s - %.0f%% reserve (CUDA context, fragmentation, backward's "
          "transient gradients) = %s",
          format_gb(limits.device_bytes).c_str(), 100.0 * limits.reserve,
          format_gb(limits.budget()).c_str()));
  if (!in.shape.known()) {
    why.push_back("activations not estimated (no model shape): model states only");
  }
  const std::string rule =
      "rule: least recompute first (none < checkpointing < checkpointing + offload), then the "
      "largest micro-batch, then the lowest stage.";
  const std::string stage_last =
      "  The stage comes last because with NCCL all three move the same gradient bytes "
      "(reduce-scatter + all-gather = all-reduce): it buys memory, which only matters through "
      "the first two. Among equals the lower stage does less: stages 1-2 all-gather parameters "
      "after the step, outside backward's overlap, and stage 2 reduce-scatters every micro-step "
      "under gradient accumulation.";

  std::string reason;
  if (!in.offload_optimizer) {
    for (int s = 0; s < 3; ++s) why.push_back(stage_line(plain, limits, plan.options, s));
    why.push_back(rule);
    why.push_back(stage_last);
    plan.found = pick(plan.options, plan.best);
    if (plan.found) reason = because(plan.options, plan.best);
  }
  if (!plan.found) {
    if (!in.offload_optimizer) explain_nothing_fits(plain, plan, why);
    // Offload last: a CPU optimizer step and two PCIe copies of the shard per step.
    for (int s = 1; s < 3; ++s) why.push_back(stage_line(off, limits, plan.offload, s));
    if (in.offload_optimizer) why.push_back(rule);
    plan.found = pick(plan.offload, plan.best);
    if (plan.found) {
      reason = std::string(in.offload_optimizer ? "optimizer offload is on"
                                                : "only optimizer offload fits the device") +
               "; " + because(plan.offload, plan.best);
    }
  }

  if (plan.found) {
    const PlanCandidate& b = plan.best;
    why.push_back(fmt("=> stage %d%s, %s, micro-batch %lld: %s", b.stage,
                      b.offload ? " with optimizer offload" : "", recompute_name(b.recompute),
                      (long long)b.micro_batch, reason.c_str()));
    plan.ranks_per_node =
        limits.ranks_per_node > 0 ? std::min(limits.ranks_per_node, in.world_size) : in.world_size;
    plan.host_per_node = plan.ranks_per_node * b.host();
    if (b.host() > 0 && limits.host_bytes > 0) {
      plan.host_fits = plan.host_per_node <= limits.host_budget();
      why.push_back(fmt("%shost memory per node: %d ranks x %s = %s %s %s (%s - %.0f%% reserve)%s",
                        plan.host_fits ? "   " : "   WARNING: ", plan.ranks_per_node,
                        format_gb(b.host()).c_str(), format_gb(plan.host_per_node).c_str(),
                        plan.host_fits ? "<=" : ">", format_gb(limits.host_budget()).c_str(),
                        format_gb(limits.host_bytes).c_str(), 100.0 * limits.reserve,
                        plan.host_fits
                            ? ""
                            : ": does not fit; use fewer ranks per node, more ranks (the host "
                              "part shrinks with N), or more host memory"));
    }
    return plan;
  }
  const StageOption& least = plan.offload[2][2];
  why.push_back(
      fmt("=> nothing fits, even with optimizer offload: stage 2 with it and %s at micro-batch "
          "%lld needs %s > %s",
          recompute_name(Recompute::kCheckpointOffload), (long long)least.refused.micro_batch,
          format_gb(least.refused.total()).c_str(), format_gb(limits.budget()).c_str()));
  if (in.offload_optimizer) explain_nothing_fits(plain, plan, why);
  return plan;
}
std::string format_gb(int64_t bytes) { return fmt("%.2f GB", static_cast<double>(bytes) / 1e9); }

}  // namespace zero
