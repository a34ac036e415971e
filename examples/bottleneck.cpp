// The bottleneck verdict: rules in bottleneck.hpp. The optimizer step is memory-bandwidth-bound
// (it streams every updated element's master weight, gradient and states once), so a large
// optimizer share is reported as memory-bound, like a device too full to grow the micro-batch.
#include "bottleneck.hpp"

#include <algorithm>
#include <cstdio>

namespace zero::examples {
namespace {

std::string fmt(const char* f, auto... args) {
  char buf[400];
  std::snprintf(buf, sizeof buf, f, args...);
  return buf;
}

std::string pct(double f) { return fmt("%.0f%%", 100 * f); }

// Fewer bytes per gradient element: ZeRO++'s quantized gradients (int8 with error feedback)
// where 16 or 32 bits travel now, int4 where int8 does. What it costs: a quantize / dequantize
// pass over every bucket (compute; on a CPU with gloo it can cost more than it saves) and one
// fp32 residual per parameter (error feedback). "" when nothing narrower is left.
std::string compression_knob(const RunShape& r) {
  if (r.world_size <= 1 || r.comm_bits <= 4) return "";
  const std::string stage =
      r.stage == 0 ? "zero_optimization.stage: 1 or 2 with " : std::string("zero_optimization.");
  if (r.comm_bits <= 8) {
    return fmt(
        "%szero_quantized_gradients_bits: 4 halves the gradient bytes again (int4 codes; "
        "keep zero_quantized_gradients_error_feedback on)",
        stage.c_str());
  }
  const double ratio = r.comm_bits / (8.0 + 32.0 / 2048);
  return fmt(
      "%szero_quantized_gradients: true sends int8 gradients with error feedback: "
      "%.1fx fewer gradient bytes than the %d bits per element now, for a "
      "quantize/dequantize pass per bucket and 4 bytes per parameter of residual memory",
      stage.c_str(), ratio, r.comm_bits);
}

std::string comm_knob(const RunShape& r) {
  std::string k;
  const std::string compress = compression_knob(r);
  if (!compress.empty()) k = compress + "; or ";
  if (r.stage == 2 && r.grad_accum > 1) {
    k += "stage 2 reduce-scatters on every micro-step: stage 1 (if it fits) reduces once per step";
  } else {
    k += fmt("raise gradient_accumulation_steps (now %lld) so one reduction serves more tokens",
             (long long)r.grad_accum);
    if (r.stage == 2) k += " (stages 0-1 reduce once per step; stage 2 on every micro-step)";
  }
  if (r.buckets <= 1) {
    k += "; one gradient bucket starts only when backward ends: a reduce_bucket_size below the "
         "model's size lets buckets overlap backward";
  } else {
    k += fmt("; %lld buckets: a bigger reduce_bucket_size makes fewer, more efficient calls",
             (long long)r.buckets);
  }
  return k;
}

}  // namespace

const char* bottleneck_name(Bottleneck b) {
  static const char* const names[] = {"IO-bound", "communication-bound", "memory-bound",
                                      "compute-bound"};
  return names[static_cast<int>(b)];
}

std::string Verdict::line() const {
  std::string s = fmt(
      "bottleneck: %s (data %s, exposed communication %s, optimizer %s, compute %s, other %s of "
      "the step",
      bottleneck_name(kind), pct(data).c_str(), pct(comm).c_str(), pct(optimizer).c_str(),
      pct(compute).c_str(), pct(other).c_str());
  s += memory_headroom >= 0 ? fmt("; %s of memory free", pct(memory_headroom).c_str())
                            : std::string("; memory headroom unknown");
  s += utilisation >= 0 ? fmt("; utilisation %s)", pct(utilisation).c_str()) : std::string(")");
  return s + ": " + reason + " -> " + knob;
}

Verdict diagnose(const StepTimes& t, const RunShape& r) {
  Verdict v;
  const double step = t.step_s > 0 ? t.step_s : 1;
  v.data = std::max(0.0, t.data_s) / step;
  v.comm = std::max(0.0, t.comm_exposed_s) / step;
  v.optimizer = std::max(0.0, t.optimizer_s) / step;
  v.compute = std::max(0.0, t.forward_s + t.backward_s) / step;
  v.other = std::max(0.0, 1 - v.data - v.comm - v.optimizer - v.compute);
  v.utilisation = t.utilisation;
  if (r.memory_budget > 0) {
    const double used =
        static_cast<double>(std::max<int64_t>(0, r.memory_used - r.memory_baseline));
    v.memory_headroom = std::max(0.0, 1 - used / static_cast<double>(r.memory_budget));
  }

  // The largest time share above its threshold decides.
  struct Share {
    double share, threshold;
    int which;
  };
  const Share shares[] = {
      {v.data, kIoShare, 0}, {v.comm, kCommShare, 1}, {v.optimizer, kOptimizerShare, 2}};
  const Share* worst = nullptr;
  for (const Share& s : shares) {
    if (s.share >= s.threshold && (!worst || s.share > worst->share)) worst = &s;
  }
  const bool tight = v.memory_headroom >= 0 && v.memory_headroom < kMinHeadroom;
  if (worst && worst->which == 0) {
    v.kind = Bottleneck::kIo;
    v.reason = "waiting for data is " + pct(v.data) + " of the step";
    v.knob =
        "more loader workers or a deeper prefetch (or pre-tokenized data on faster storage), so "
        "the next batch is ready when the step ends";
  } else if (worst && worst->which == 1) {
    v.kind = Bottleneck::kCommunication;
    v.reason = "exposed communication is " + pct(v.comm) + " of the step";
    v.knob = comm_knob(r);
  } else if (worst && worst->which == 2) {
    v.kind = Bottleneck::kMemory;
    v.reason =
        "the optimizer step, bound by memory bandwidth, is " + pct(v.optimizer) + " of the step";
    v.knob = r.stage == 0 && r.world_size > 1
                 ? fmt("ZeRO stage 1 or 2 shards the update: each of the %d ranks updates 1/%d "
                       "of the parameters",
                       r.world_size, r.world_size)
                 : fmt("raise gradient_accumulation_steps (now %lld): one update serves more "
                       "tokens",
                       (long long)r.grad_accum);
  } else if (tight) {
    v.kind = Bottleneck::kMemory;
    v.reason = "only " + pct(v.memory_headroom) + " of memory is free";
    v.knob = r.stage < 2
                 ? fmt("ZeRO stage %d frees gradient and optimizer memory", r.stage + 1)
                 : std::string(r.checkpointing ? "activation checkpointing with CPU offload, or "
                                                 "more ranks (stage 2 shards shrink with N)"
                                               : "activation checkpointing "
                                                 "(trainer.activation_checkpointing: true)");
    v.knob += "; then a larger micro-batch fills the device";
  } else {
    v.kind = Bottleneck::kCompute;
    v.reason = "forward and backward are " + pct(v.compute) + " of the step";
    const bool idle = v.utilisation >= 0 && v.utilisation < kMinUtilisation;
    if (idle) {
      // Compute dominates the step, yet the device is often idle: the kernels are too small or
      // the host launches them too slowly, which more work per kernel fixes.
      v.reason += ", yet the device is busy only " + pct(v.utilisation) + " of the time (< " +
                  pct(kMinUtilisation) + ")";
      v.knob = r.cpu ? std::string(
                           "the compute threads wait for cores: other processes share "
                           "them, or ranks x intra-op threads exceed the cores (set "
                           "OMP_NUM_THREADS to cores / ranks)")
                     : fmt("a larger micro-batch (now %lld) so each kernel does more work per "
                           "launch%s",
                           (long long)r.micro_batch,
                           r.checkpointing ? "" : ", or bf16 and fused attention");
      return v;
    }
    v.knob = v.memory_headroom >= 0.5
                 ? fmt("a larger micro-batch (now %lld; %s of memory is free) for fuller "
                       "kernels%s",
                       (long long)r.micro_batch, pct(v.memory_headroom).c_str(),
                       r.checkpointing ? ", or drop activation checkpointing" : "")
                 : std::string(r.checkpointing
                                   ? "drop activation checkpointing if memory allows (it "
                                     "recomputes every block's forward)"
                                   : "faster kernels (bf16, fused attention) or more devices: "
                                     "the engine is not what limits this run");
  }
  return v;
}

}  // namespace zero::examples
