// zero-memory's per-rank memory table at T = P = 1, the recommendation and the --svg chart.
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <string>

#include "zero_memory_report.hpp"
#include "zero_memory_rows.hpp"

namespace zero::tools {
namespace {

std::string grouped(int64_t v) {
  std::string s = std::to_string(v), out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (i > 0 && (s.size() - i) % 3 == 0) out += ',';
    out += s[i];
  }
  return out;
}

std::string mb(int64_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f MB", static_cast<double>(bytes) / 1e6);
  return buf;
}

}  // namespace

void print_report(const PlanInput& in, const std::string& name, const std::string& device_arg,
                  const MemoryPlan& plan) {
  const ModelShape& m = in.shape;
  const char* dtype = in.param_bytes == 2 ? "bf16" : "fp32";
  std::printf("zero-memory: %s, Ψ = %s parameters", name.c_str(), grouped(in.num_params).c_str());
  if (m.known()) {
    std::printf("; %lld layers, hidden %lld, %lld heads", (long long)m.layers, (long long)m.hidden,
                (long long)m.head_count());
    if (m.kv_head_count() != m.head_count()) {
      std::printf(" (%lld key/value heads)", (long long)m.kv_head_count());
    }
    std::printf(", ffn %lld, vocab %lld", (long long)m.ffn_dim(), (long long)m.vocab);
  }
  std::printf("\n  %d ranks, %s parameters and activations, %s gradient accumulation, ",
              in.world_size, dtype, in.grad_accum_bytes == 4 ? "fp32" : "16-bit");
  std::printf("fp32 master weights, %d fp32 optimizer states (AdamW: 2)\n", in.optimizer_states);
  std::printf(
      "  micro-batch %lld x %lld tokens per rank; reduce buckets of %s elements "
      "(largest %s); GB = 10^9 bytes\n\n",
      (long long)in.micro_batch, (long long)in.seq_len, grouped(in.bucket_elements).c_str(),
      grouped(max_bucket_elements(in)).c_str());

  // Stage 3's column: model states with each block a unit (examples/gpt.cpp), and the units
  // gathered at once (with prefetch) and one unit's gradients in their own row, counted in the
  // totals. The recommendation below searches stages 0-2.
  MemoryBreakdown st[4];
  ActivationEstimate act[3];
  for (int s = 0; s < 4; ++s) st[s] = plan_model_states(in, s);
  for (int r = 0; r < 3; ++r) act[r] = predict_activations(in, kModes[r]);
  std::printf("  %-40s %12s %12s %12s %12s\n", "per-rank memory", "stage 0", "stage 1", "stage 2",
              "stage 3");
  auto row = [&](const char* label, auto value) {
    std::printf("  %-40s", label);
    for (int s = 0; s < 4; ++s) std::printf(" %12s", format_gb(value(s)).c_str());
    std::printf("\n");
  };
  row("parameters", [&](int s) { return st[s].params; });
  row("gradients", [&](int s) { return st[s].grads; });
  row("fp32 master weights", [&](int s) { return st[s].master; });
  row("optimizer states", [&](int s) { return st[s].optimizer; });
  row("bucket buffers", [&](int s) { return st[s].comm_buffers; });
  // What of the above lives in host memory (plan_host_states): the offloaded optimizer part with
  // --offload-optimizer, and stage 3's error-feedback residual (page-locked host memory there).
  // The device rows and totals leave it out, as the recommendation does (PlanCandidate::total).
  bool host_part = false;
  for (int s = 0; s < 4; ++s) host_part = host_part || plan_host_states(in, s) > 0;
  if (host_part) row("  of which in host memory", [&](int s) { return plan_host_states(in, s); });
  row("= model states on the device", [&](int s) { return device_model_states(in, s); });
  // --startup: a deferred model never holds its fp32 copy on the device; an eager one does.
  row(in.deferred_start ? "start-up peak (initialize, deferred)"
                        : "start-up peak (initialize, eager model)",
      [&](int s) { return plan_startup_peak(in, s); });
  // Stage 3 also allocates its gradient shard and bucket buffers for backward and the step only.
  row("in a step: gathered units, gradient path",
      [&](int s) { return stage3_transient_bytes(in, s); });
  // Optimizer offload (stages 1 to 3): what stays on the device, and what goes to the host.
  row("optimizer offload: states on device",
      [&](int s) { return optimizer_offload_split(in, s).device; });
  row("optimizer offload: states in host mem",
      [&](int s) { return optimizer_offload_split(in, s).host; });
  if (m.known()) {
    for (int r = 0; r < 3; ++r) {
      const std::string label = std::string("activations, ") + recompute_name(kModes[r]);
      row(label.c_str(), [&](int) { return act[r].peak(); });
    }
    for (int r = 0; r < 3; ++r) {
      const std::string label = std::string("total, ") + recompute_name(kModes[r]);
      row(label.c_str(), [&](int s) {
        return device_model_states(in, s) + act[r].peak() + stage3_transient_bytes(in, s);
      });
    }
  }
  std::printf("\n  model states (memory.hpp's formulas; + bucket buffers):\n");
  for (int s = 0; s < 4; ++s) {
    std::printf("    stage %d: %s = %s\n", s, model_state_formula(in, s).c_str(),
                format_gb(st[s].total() - st[s].comm_buffers).c_str());
  }
  if (in.grad_accum_bytes == 4 && in.param_bytes == 2) {
    std::printf(
        "    (gradients accumulate in fp32 here, 4Ψ: the ZeRO paper's 16Ψ for stage 0 "
        "counts 2Ψ of fp16 gradients; --grad-accum-bytes 2, the default for bf16, gives it)\n");
  }
  if (m.known()) {
    const int p = in.param_bytes;
    const int64_t block = block_activation_bytes(m, in.micro_batch, in.seq_len, p);
    std::printf(
        "  activations (see memory_plan.hpp): per block s·b·(%dh + %df) + 4·a·s·b + 8·s·b "
        "= %s, x %lld blocks = %s\n",
        8 * p + 8, 4 * p, mb(block).c_str(), (long long)m.layers,
        format_gb(block * m.layers).c_str());
    std::printf(
        "    final norm + head input + token ids %s; logits 12·s·b·V = %s (fp32 "
        "log-probs and two gradients at backward's start)\n",
        mb(act[0].head).c_str(), format_gb(act[0].loss).c_str());
    std::printf(
        "    checkpointing keeps %d·s·b·h = %s per block and rebuilds one block; CPU "
        "offload moves %s to host memory, the device keeps 2 block inputs\n",
        p, mb(act[1].blocks / m.layers).c_str(), format_gb(act[2].host).c_str());
  }
  std::printf(
      "  optimizer offload (stages 1 to 3) keeps the fp32 master, the %d states, the fp32 gradient "
      "shard and the %d-byte copy of the shard in host memory, (%d + %d + 4 + %d)Ψ/N per rank, "
      "and a pinned landing ring; stage 3's device keeps its root and 1/N compute shard\n",
      in.optimizer_states, in.param_bytes, 4, 4 * in.optimizer_states, in.param_bytes);
  std::printf(
      "\nrecommendation for %d x %s (--device-memory %s), %s of host memory per %d-rank "
      "node (--host-memory, --gpus-per-node):\n",
      in.world_size, format_gb(plan.limits.device_bytes).c_str(), device_arg.c_str(),
      format_gb(plan.limits.host_bytes).c_str(),
      std::min(in.world_size, plan.limits.ranks_per_node));
  for (const std::string& line : plan.reasons) std::printf("  %s\n", line.c_str());
}

void write_svg(const std::string& path, const PlanInput& in, const std::string& name,
               const MemoryPlan& plan) {
  const ActivationEstimate act = predict_activations(in, Recompute::kNone);
  MemoryChart chart;
  chart.title = "Per-rank memory of " + name + " on " + std::to_string(in.world_size) + " ranks";
  chart.subtitle = std::string(in.param_bytes == 2 ? "bf16" : "fp32") + ", AdamW, micro-batch " +
                   std::to_string(in.micro_batch) + " x " + std::to_string(in.seq_len) +
                   " tokens, no activation checkpointing";
  for (int s = 0; s < 3; ++s) {
    const MemoryBreakdown b = plan_model_states(in, s);
    chart.bars.push_back({"stage " + std::to_string(s),
                          {{"parameters", b.params},
                           {"gradients", b.grads},
                           {"fp32 master", b.master},
                           {"optimizer states", b.optimizer},
                           {"bucket buffers", b.comm_buffers},
                           {"activations", act.peak()}}});
  }
  chart.limit_bytes = plan.limits.device_bytes;
  chart.limit_label = "device memory " + format_gb(plan.limits.device_bytes);
  std::ofstream out(path);
  if (!out) throw std::runtime_error("cannot write --svg file '" + path + "'");
  out << memory_chart_svg(chart);
}

}  // namespace zero::tools
