// zero-memory's predicted step time of each stage (time_plan.hpp's model) and the --time-svg chart.
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "zero_memory_report.hpp"

namespace zero::tools {

TimeEstimate time_of(const PlanInput& in, const TimeSetup& ts, int stage) {
  StepShape s = ts.step;
  s.stage = stage;
  return predict_step_time(in, s, ts.hw);
}

void print_time(const PlanInput& in, const TimeSetup& ts, const MemoryPlan& plan) {
  const Hardware& hw = ts.hw;
  std::printf(
      "\npredicted step time on %d x %s: %.0f TFLOP/s peak x %.0f%% efficiency, memory %.0f GB/s, "
      "bus bandwidth all-reduce %.1f / reduce-scatter %.1f / all-gather %.1f GB/s, latency %.0f "
      "us\n  micro-batch %lld x %lld tokens, accumulation %lld, %s (time_plan.hpp has the "
      "model)\n",
      in.world_size, hw.name.c_str(), hw.peak_flops / 1e12, 100 * hw.efficiency, hw.memory_bw / 1e9,
      hw.all_reduce_bw / 1e9, hw.reduce_scatter_bw / 1e9, hw.all_gather_bw / 1e9,
      hw.latency_s * 1e6, (long long)in.micro_batch, (long long)in.seq_len,
      (long long)ts.step.grad_accum, recompute_name(ts.step.recompute));
  TimeEstimate t[4];
  for (int s = 0; s < 4; ++s) t[s] = time_of(in, ts, s);
  std::printf("  %-40s %12s %12s %12s %12s\n", "per step, seconds", "stage 0", "stage 1", "stage 2",
              "stage 3");
  auto row = [&](const char* label, const char* f, auto value) {
    std::printf("  %-40s", label);
    for (int s = 0; s < 4; ++s) {
      char buf[32];
      std::snprintf(buf, sizeof buf, f, value(t[s]));
      std::printf(" %12s", buf);
    }
    std::printf("\n");
  };
  row("compute: forward", "%.4g", [](const TimeEstimate& e) { return e.forward_s; });
  row("compute: backward", "%.4g", [](const TimeEstimate& e) { return e.backward_s; });
  row("compute: recompute", "%.4g", [](const TimeEstimate& e) { return e.recompute_s; });
  row("gradient communication", "%.4g", [](const TimeEstimate& e) { return e.grad_comm_s; });
  row("  of which hidden behind backward", "%.4g",
      [](const TimeEstimate& e) { return e.grad_comm_s - e.grad_comm_exposed_s; });
  row("  exposed", "%.4g", [](const TimeEstimate& e) { return e.grad_comm_exposed_s; });
  row("parameter all-gather (exposed)", "%.4g",
      [](const TimeEstimate& e) { return e.param_gather_s; });
  row("unit gathers (stage 3)", "%.4g", [](const TimeEstimate& e) { return e.unit_gather_s; });
  row("  exposed (after prefetch)", "%.4g",
      [](const TimeEstimate& e) { return e.unit_gather_exposed_s; });
  row("optimizer step", "%.4g", [](const TimeEstimate& e) { return e.optimizer_s; });
  if (ts.step.recompute == Recompute::kCheckpointOffload) {
    row("activation offload (exposed)", "%.4g",
        [](const TimeEstimate& e) { return e.offload_exposed_s; });
  }
  row("= step", "%.4g", [](const TimeEstimate& e) { return e.step_s; });
  row("tokens/s (all ranks)", "%.4g", [](const TimeEstimate& e) { return e.tokens_per_s; });
  row("MFU", "%.1f%%", [](const TimeEstimate& e) { return 100 * e.mfu; });
  std::printf("  %lld gradient buckets; model FLOPs per token %.4g%s\n", (long long)t[0].buckets,
              t[0].model_flops_per_token,
              ts.step.recompute != Recompute::kNone ? " (+ recomputation)" : "");
  if (plan.found) {
    PlanInput r = in;
    r.micro_batch = plan.best.micro_batch;
    StepShape s = ts.step;
    s.stage = plan.best.stage;
    s.recompute = plan.best.recompute;
    const TimeEstimate e = predict_step_time(r, s, hw);
    std::printf("  recommended (stage %d, %s, micro-batch %lld): %s\n", plan.best.stage,
                recompute_name(plan.best.recompute), (long long)plan.best.micro_batch,
                describe_time(e).c_str());
  }
}

void write_time_svg(const std::string& path, const PlanInput& in, const std::string& name,
                    const TimeSetup& ts) {
  std::vector<TimeChartBar> bars;
  for (int s = 0; s < 3; ++s) bars.push_back({"stage " + std::to_string(s), time_of(in, ts, s)});
  char sub[200];
  std::snprintf(sub, sizeof sub, "%s, micro-batch %lld x %lld tokens, accumulation %lld, %s",
                ts.hw.name.c_str(), (long long)in.micro_batch, (long long)in.seq_len,
                (long long)ts.step.grad_accum, recompute_name(ts.step.recompute));
  std::ofstream out(path);
  if (!out) throw std::runtime_error("cannot write --time-svg file '" + path + "'");
  out << time_chart_svg(
      "Predicted step time of " + name + " on " + std::to_string(in.world_size) + " ranks", sub,
      bars);
}

}  // namespace zero::tools
