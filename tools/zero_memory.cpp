// zero-memory: per-rank memory of ZeRO stages 0, 1 and 2 before anything is allocated, the
// cheapest configuration that fits a device, and the predicted step time of each stage.
//
//   zero-memory --model llama-7b --gpus 8 --device-memory 80GB --micro-batch 1 --seq-len 2048
//   zero-memory --model llama-7b --gpus 64 --gpu h100 --link ib400 --time-svg time.svg
//   zero-memory --params 7e9 --layers 32 --hidden 4096 --gpus 8 --device-memory 24GiB
//   zero-memory --model gpt-1.3b --gpus 4 --svg stages.svg
//   zero-memory --model llama-7b --gpus 1 --device-memory 80GB --host-memory 512GB
//   zero-memory --model llama-7b --gpus 16 --tp 4 --pp 2 --sp --schedule 1f1b --grad-accum 8
//   zero-memory --params 68976648192 --layers 80 --hidden 8192 --heads 64 --kv-heads 8 \
//               --ffn 28672 --vocab 32000 --gpus 64 --grad-accum 32 --parallel-search
#include <boost/program_options.hpp>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

#include "zero/memory_plan.hpp"
#include "zero/models/gpt_config.hpp"
#include "zero/time_plan.hpp"
#include "zero_memory_parallel.hpp"

namespace po = boost::program_options;
using namespace zero;

namespace {

// "7e9", "6738415616", "6.7B", "350M".
int64_t parse_count(const std::string& s) {
  size_t used = 0;
  double v = std::stod(s, &used);
  const std::string suffix = s.substr(used);
  if (suffix == "K" || suffix == "k") v *= 1e3;
  if (suffix == "M" || suffix == "m") v *= 1e6;
  if (suffix == "B" || suffix == "b" || suffix == "G") v *= 1e9;
  if (suffix == "T") v *= 1e12;
  if (suffix.size() > 1 ||
      (!suffix.empty() && std::string("KkMmBbGT").find(suffix) == std::string::npos)) {
    throw std::invalid_argument("not a count: '" + s + "'");
  }
  return std::llround(v);
}

std::string grouped(int64_t v) {
  std::string s = std::to_string(v), out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (i > 0 && (s.size() - i) % 3 == 0) out += ',';
    out += s[i];
  }
  return out;
}

constexpr Recompute kModes[] = {Recompute::kNone, Recompute::kCheckpoint,
                                Recompute::kCheckpointOffload};
constexpr const char* kModeIds[] = {"none", "checkpoint", "offload"};  // JSON keys

std::string mb(int64_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f MB", static_cast<double>(bytes) / 1e6);
  return buf;
}

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
  if (error_feedback_bytes(in, 3) > 0)  // stage 3's residual: page-locked host memory per rank
    row("  of which residual in host mem",
        [&](int s) { return s == 3 ? plan_host_states(in, s) : 0; });
  row("= model states", [&](int s) { return st[s].total(); });
  row("start-up peak (initialize, with the model)",
      [&](int s) { return plan_startup_peak(in, s); });
  // Stage 3 also allocates its gradient shard and bucket buffers for backward and the step only.
  row("in a step: gathered units, gradient path",
      [&](int s) { return stage3_transient_bytes(in, s); });
  // Optimizer offload (stages 1 and 2): what stays on the device, and what goes to the host.
  PlanInput off = in;
  off.offload_optimizer = true;
  auto offloaded = [&](int s, bool host) -> int64_t {
    if (s == 0 || s == 3) return 0;  // the engine offloads at stages 1 and 2 only
    const int64_t h = plan_host_states(off, s);
    return host ? h : plan_model_states(off, s).total() - h;
  };
  row("optimizer offload: states on device", [&](int s) { return offloaded(s, false); });
  row("optimizer offload: states in host mem", [&](int s) { return offloaded(s, true); });
  if (m.known()) {
    for (int r = 0; r < 3; ++r) {
      const std::string label = std::string("activations, ") + recompute_name(kModes[r]);
      row(label.c_str(), [&](int) { return act[r].peak(); });
    }
    for (int r = 0; r < 3; ++r) {
      const std::string label = std::string("total, ") + recompute_name(kModes[r]);
      row(label.c_str(),
          [&](int s) { return st[s].total() + act[r].peak() + stage3_transient_bytes(in, s); });
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
      "  optimizer offload keeps the fp32 master, the %d states, the fp32 gradient shard and the "
      "%d-byte copy of the shard in host memory, (%d + %d + 4 + %d)Ψ/N per rank\n",
      in.optimizer_states, in.param_bytes, 4, 4 * in.optimizer_states, in.param_bytes);
  std::printf(
      "\nrecommendation for %d x %s (--device-memory %s), %s of host memory per %d-rank "
      "node (--host-memory, --gpus-per-node):\n",
      in.world_size, format_gb(plan.limits.device_bytes).c_str(), device_arg.c_str(),
      format_gb(plan.limits.host_bytes).c_str(),
      std::min(in.world_size, plan.limits.ranks_per_node));
  for (const std::string& line : plan.reasons) std::printf("  %s\n", line.c_str());
}

// What --gpu/--link and the rate overrides describe, and how the time table is run.
struct TimeSetup {
  Hardware hw;
  StepShape step;  // stage set per column
};

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

void print_json(const PlanInput& in, const MemoryPlan& plan, const TimeSetup& ts) {
  PlanInput off = in;
  off.offload_optimizer = true;
  std::printf(
      "{\"num_params\": %lld, \"world_size\": %d, \"micro_batch\": %lld, \"seq_len\": %lld,"
      "\n \"block_activation_bytes\": %lld,\n \"stages\": [",
      (long long)in.num_params, in.world_size, (long long)in.micro_batch, (long long)in.seq_len,
      (long long)(in.shape.known()
                      ? block_activation_bytes(in.shape, in.micro_batch, in.seq_len, in.param_bytes)
                      : 0));
  for (int s = 0; s < 3; ++s) {
    std::printf(
        "%s\n  {\"stage\": %d, \"model_states\": %s, \"startup_peak\": %lld, "
        "\"offload_optimizer\": {\"device\": %lld, \"host\": %lld}, \"activations\": {",
        s ? "," : "", s, to_json(plan_model_states(in, s)).c_str(),
        (long long)plan_startup_peak(in, s),
        (long long)(s == 0 ? 0 : plan_model_states(off, s).total() - plan_host_states(off, s)),
        (long long)plan_host_states(off, s));
    for (int r = 0; r < 3; ++r) {
      std::printf("%s\"%s\": %lld", r ? ", " : "", kModeIds[r],
                  (long long)predict_activations(in, kModes[r]).peak());
    }
    const TimeEstimate t = time_of(in, ts, s);
    std::printf(
        "},\n   \"time\": {\"forward_s\": %.6g, \"backward_s\": %.6g, \"recompute_s\": %.6g, "
        "\"grad_comm_s\": %.6g, \"grad_comm_exposed_s\": %.6g, \"param_gather_s\": %.6g, "
        "\"optimizer_s\": %.6g, \"offload_exposed_s\": %.6g, \"step_s\": %.6g, "
        "\"tokens_per_s\": %.6g, \"mfu\": %.6g}}",
        t.forward_s, t.backward_s, t.recompute_s, t.grad_comm_s, t.grad_comm_exposed_s,
        t.param_gather_s, t.optimizer_s, t.offload_exposed_s, t.step_s, t.tokens_per_s, t.mfu);
  }
  // Stage 3 beside the stages the recommendation searches.
  const TimeEstimate t3 = time_of(in, ts, 3);
  std::printf(
      "],\n \"stage3\": {\"model_states\": %s, \"root_params\": %lld, \"gathered\": %lld, "
      "\"time\": {\"unit_gather_s\": %.6g, \"unit_gather_exposed_s\": %.6g, \"unit_gathers\": "
      "%lld, \"param_gather_s\": %.6g, \"step_s\": %.6g, \"mfu\": %.6g}},",
      to_json(plan_model_states(in, 3)).c_str(), (long long)stage3_root_params(in),
      (long long)stage3_transient_bytes(in, 3), t3.unit_gather_s, t3.unit_gather_exposed_s,
      (long long)t3.unit_gathers, t3.param_gather_s, t3.step_s, t3.mfu);
  std::printf("\n \"recommendation\": ");
  if (!plan.found) {
    std::printf("null\n}\n");
    return;
  }
  std::printf(
      "{\"stage\": %d, \"recompute\": \"%s\", \"micro_batch\": %lld, \"total\": %lld, "
      "\"offload_optimizer\": %s, \"host_per_rank\": %lld, \"host_per_node\": %lld, "
      "\"host_fits\": %s}\n}\n",
      plan.best.stage, kModeIds[static_cast<int>(plan.best.recompute)],
      (long long)plan.best.micro_batch, (long long)plan.best.total(),
      plan.best.offload ? "true" : "false", (long long)plan.best.host(),
      (long long)plan.host_per_node, plan.host_fits ? "true" : "false");
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

int run(int argc, char** argv) {
  std::string model, params, dtype = "bf16", device = "80GB", reserve = "10%", svg;
  std::string host_memory = "1TB";
  std::string bucket = "5e8";
  std::string persistence = "1e5";
  std::string gpu = "h100", link = "ib400", recompute = "none", time_svg;
  int per_node = 8, top = 10;
  std::string schedule = "1f1b", partition = "equal";
  std::string error_feedback = "auto";
  double peak_tflops = 0, efficiency = 0, memory_bw = 0, bus_bw = 0, ar_bw = 0, rs_bw = 0,
         ag_bw = 0, latency_us = -1, host_bw = 0;
  PlanInput in;
  PlanLimits lim;
  TimeSetup ts;
  po::options_description desc("zero-memory options");
  desc.add_options()("help,h", "show this help")(
      "model", po::value(&model), "example GPT preset: tiny, small, ..., gpt-1.3b, llama-7b")(
      "params", po::value(&params), "parameter count instead of a preset: 7e9, 6.7B")(
      "layers", po::value(&in.shape.layers), "with --params: blocks (for activations)")(
      "hidden", po::value(&in.shape.hidden), "with --params: model width")(
      "heads", po::value(&in.shape.heads), "with --params: attention heads (default hidden/128)")(
      "kv-heads", po::value(&in.shape.kv_heads),
      "with --params: key/value heads, fewer than --heads for grouped-query attention "
      "(LLaMA-2-70B: 8; default --heads)")("ffn", po::value(&in.shape.ffn),
                                           "with --params: MLP width (default LLaMA's rule)")(
      "vocab", po::value(&in.shape.vocab), "with --params: vocabulary, for the logits")(
      "gpus", po::value(&in.world_size)->default_value(1), "data-parallel ranks N")(
      "micro-batch", po::value(&in.micro_batch)->default_value(1), "sequences per rank")(
      "seq-len", po::value(&in.seq_len)->default_value(2048), "tokens per sequence")(
      "dtype", po::value(&dtype), "bf16 (default) or fp32 parameters and activations")(
      "device-memory", po::value(&device), "per-GPU memory: 80GB, 80GiB, 80e9 (default 80GB)")(
      "reserve", po::value(&reserve), "fraction kept free: 10% (default) or 0.1")(
      "host-memory", po::value(&host_memory),
      "host memory per node, for optimizer and activation offload (default 1TB; 0: not checked)")(
      "offload-optimizer", "zero_optimization.offload_optimizer is on: plan with it only")(
      "max-micro-batch", po::value(&lim.max_micro_batch)->default_value(64),
      "largest micro-batch the search tries")("bucket-size", po::value(&bucket),
                                              "reduce_bucket_size in elements (default 5e8)")(
      "persistence-threshold", po::value(&persistence),
      "stage 3: stage3_param_persistence_threshold, block parameters of at most this many "
      "elements stay whole in the root unit (default 1e5, DeepSpeed's)")(
      "prefetch-bucket-size", po::value(&in.prefetch_bucket_size)->default_value(50'000'000),
      "stage 3: stage3_prefetch_bucket_size, elements gathered ahead of use (0: no prefetch)")(
      "max-live-parameters", po::value(&in.max_live_parameters)->default_value(1'000'000'000),
      "stage 3: stage3_max_live_parameters")(
      "max-reuse-distance", po::value(&in.max_reuse_distance)->default_value(1'000'000'000),
      "stage 3: stage3_max_reuse_distance, a unit used again within this many elements stays "
      "gathered")(
      "grad-accum-bytes", po::value(&in.grad_accum_bytes)->default_value(0),
      "gradient accumulator and shard bytes (data_types.grad_accum_dtype): 4 fp32; 2 16-bit, "
      "the ZeRO paper's and DeepSpeed's default for bf16; 0 (default): the --dtype's")(
      "quantized-gradients", po::value(&in.quantized_bits)->default_value(0),
      "zero_quantized_gradients at stages 1 and 2: 8 or 4 bits (0, default: off)")(
      "error-feedback", po::value(&error_feedback),
      "with --quantized-gradients, the residual's storage "
      "(zero_quantized_gradients_error_feedback_dtype): auto (default: the --dtype's), fp32, "
      "bf16, fp16, int8, or off")("optimizer-states",
                                  po::value(&in.optimizer_states)->default_value(2),
                                  "fp32 states per parameter: AdamW 2, SGD with momentum 1")(
      "svg", po::value(&svg), "also write a stacked bar chart of the stages here")(
      "gpu", po::value(&gpu), "device for the time model: a100, h100 (default), h200")(
      "link", po::value(&link),
      "inter-node link per device: ib100, ib200, ib400 (default) or nvlink; used when --gpus "
      "exceeds --gpus-per-node")("gpus-per-node", po::value(&per_node), "default 8")(
      "grad-accum", po::value(&ts.step.grad_accum)->default_value(1),
      "gradient accumulation steps")("recompute", po::value(&recompute),
                                     "none (default), checkpoint or offload, for the time table")(
      "no-overlap", "gradients reduced after backward (overlap_comm: false)")(
      "peak-tflops", po::value(&peak_tflops), "override: peak TFLOP/s per device")(
      "efficiency", po::value(&efficiency), "override: fraction of peak reached (default 0.5)")(
      "memory-bw", po::value(&memory_bw), "override: memory bandwidth, GB/s")(
      "bus-bw", po::value(&bus_bw), "override: bus bandwidth of all collectives, GB/s")(
      "all-reduce-bw", po::value(&ar_bw), "override: all-reduce bus bandwidth, GB/s")(
      "reduce-scatter-bw", po::value(&rs_bw), "override: reduce-scatter bus bandwidth, GB/s")(
      "all-gather-bw", po::value(&ag_bw), "override: all-gather bus bandwidth, GB/s")(
      "latency-us", po::value(&latency_us), "override: latency per collective call, us")(
      "host-bw", po::value(&host_bw), "override: device-host bandwidth for offload, GB/s")(
      "time-svg", po::value(&time_svg), "also write a chart of the predicted step times here")(
      "json",
      "print JSON instead of the report (with --tp/--pp: each ZeRO stage's memory and time)")(
      "tp", po::value(&in.tensor_parallel)->default_value(1),
      "tensor-parallel ranks T (Megatron); the data-parallel size is --gpus / (T x P)")(
      "pp", po::value(&in.pipeline_stages)->default_value(1), "pipeline stages P")(
      "sp", "sequence parallelism (with --tp)")(
      "schedule", po::value(&schedule),
      "pipeline schedule over --grad-accum micro-batches: 1f1b "
      "(default), gpipe or interleaved (with --virtual-stages)")(
      "virtual-stages", po::value(&in.virtual_stages)->default_value(1),
      "interleaved schedule: model chunks per stage v (pipeline.virtual_stages); P x v must "
      "divide the layers and P the micro-batches")(
      "partition", po::value(&partition),
      "how the time model cuts the stages: equal (default: L/P blocks of equal compute), or "
      "the pipeline runtime's cut of [embedding, blocks, head] by pipeline.partition: "
      "parameters, compute or uniform")(
      "parallel-search",
      "also search T and P (done anyway when nothing fits at T = P = 1 "
      "without optimizer offload)")("top", po::value(&top), "layouts the search lists (10)");
  po::variables_map vm;
  // No positional arguments: a stray word is a typo, not something to ignore.
  po::store(po::command_line_parser(argc, argv).options(desc).positional({}).run(), vm);
  if (vm.count("help")) {
    std::cout << desc << "\n";
    return 0;
  }
  po::notify(vm);

  std::string name;
  if (model.empty() == params.empty()) throw std::invalid_argument("give --model or --params");
  if (!model.empty()) {
    if (vm.count("layers") || vm.count("hidden") || vm.count("vocab") || vm.count("ffn") ||
        vm.count("heads") || vm.count("kv-heads")) {
      throw std::invalid_argument(
          "--model sets the shape: drop --layers/--hidden/--heads/--kv-heads/--ffn/--vocab");
    }
    const models::GptConfig c = models::gpt_preset(model);
    in.shape = {c.layers, c.dim, c.heads, c.ffn_dim(), c.vocab, c.tied, c.kv_heads};
    in.num_params = c.num_params();
    name = model;
  } else {
    in.num_params = parse_count(params);
    name = params + " parameters";
  }
  if (in.shape.kv_heads < 0 || (in.shape.known() && in.shape.kv_heads > 0 &&
                                in.shape.head_count() % in.shape.kv_heads != 0)) {
    throw std::invalid_argument("--kv-heads " + std::to_string(in.shape.kv_heads) +
                                " must divide the " + std::to_string(in.shape.head_count()) +
                                " attention heads (--heads): each key/value head serves an equal "
                                "group of query heads");
  }
  if (dtype != "bf16" && dtype != "fp32") throw std::invalid_argument("--dtype: bf16 or fp32");
  in.param_bytes = in.comm_bytes = dtype == "bf16" ? 2 : 4;
  if (in.grad_accum_bytes == 0) in.grad_accum_bytes = in.param_bytes;
  if (in.quantized_bits != 0 && in.quantized_bits != 8 && in.quantized_bits != 4)
    throw std::invalid_argument("--quantized-gradients: 8 or 4 bits (or 0: off)");
  in.error_feedback = error_feedback != "off";
  if (error_feedback == "fp32") {
    in.error_feedback_store_bytes = 4;
  } else if (error_feedback == "bf16" || error_feedback == "fp16") {
    in.error_feedback_store_bytes = 2;
  } else if (error_feedback == "int8") {
    in.error_feedback_store_bytes = 1;
  } else if (error_feedback != "auto" && error_feedback != "off") {
    throw std::invalid_argument("--error-feedback: auto, fp32, bf16, fp16, int8 or off");
  }
  in.bucket_elements = parse_count(bucket);
  in.param_persistence_threshold = parse_count(persistence);
  lim.device_bytes = parse_byte_size(device);
  lim.host_bytes = parse_byte_size(host_memory);
  in.offload_optimizer = vm.count("offload-optimizer") > 0;
  lim.reserve = reserve.back() == '%' ? std::stod(reserve) / 100.0 : std::stod(reserve);
  if (in.world_size < 1 || in.micro_batch < 1 || in.seq_len < 1 || in.num_params < 1 ||
      lim.reserve < 0 || lim.reserve >= 1) {
    throw std::invalid_argument(
        "--gpus, --micro-batch, --seq-len and the parameter count must "
        "be positive, --reserve in [0, 1)");
  }

  if (per_node < 1) throw std::invalid_argument("--gpus-per-node must be positive");
  lim.ranks_per_node = per_node;
  ts.hw = hardware_preset(gpu, link, in.world_size, per_node);
  auto positive = [](double v, const char* flag) {
    if (v < 0) throw std::invalid_argument(std::string(flag) + " must be positive");
    return v > 0;
  };
  if (positive(peak_tflops, "--peak-tflops")) ts.hw.peak_flops = peak_tflops * 1e12;
  if (positive(efficiency, "--efficiency")) ts.hw.efficiency = efficiency;
  if (positive(memory_bw, "--memory-bw")) ts.hw.memory_bw = memory_bw * 1e9;
  if (positive(bus_bw, "--bus-bw")) {
    ts.hw.all_reduce_bw = ts.hw.reduce_scatter_bw = ts.hw.all_gather_bw = bus_bw * 1e9;
  }
  if (positive(ar_bw, "--all-reduce-bw")) ts.hw.all_reduce_bw = ar_bw * 1e9;
  if (positive(rs_bw, "--reduce-scatter-bw")) ts.hw.reduce_scatter_bw = rs_bw * 1e9;
  if (positive(ag_bw, "--all-gather-bw")) ts.hw.all_gather_bw = ag_bw * 1e9;
  if (positive(host_bw, "--host-bw")) ts.hw.host_bw = host_bw * 1e9;
  if (latency_us >= 0) ts.hw.latency_s = latency_us * 1e-6;
  if (peak_tflops > 0 || efficiency > 0 || memory_bw > 0 || bus_bw > 0 || ar_bw > 0 || rs_bw > 0 ||
      ag_bw > 0 || host_bw > 0 || latency_us >= 0) {
    ts.hw.name += " (overridden)";
  }
  if (efficiency > 1) throw std::invalid_argument("--efficiency is a fraction of peak, <= 1");
  if (ts.step.grad_accum < 1) throw std::invalid_argument("--grad-accum must be >= 1");
  if (recompute == "none") {
    ts.step.recompute = Recompute::kNone;
  } else if (recompute == "checkpoint") {
    ts.step.recompute = Recompute::kCheckpoint;
  } else if (recompute == "offload") {
    ts.step.recompute = Recompute::kCheckpointOffload;
  } else {
    throw std::invalid_argument("--recompute: none, checkpoint or offload");
  }
  ts.step.overlap_comm = vm.count("no-overlap") == 0;
  in.accumulation = ts.step.grad_accum;
  in.overlap_comm = ts.step.overlap_comm;

  in.sequence_parallel = vm.count("sp") > 0;
  in.schedule = parse_schedule(schedule);
  in.partition = parse_partition(partition);
  // The links of a layout: the presets for each group's span, the compute overrides above, and
  // the link overrides on every group's link (a measured machine, a CPU with gloo, has one kind
  // of link; the stage boundary's send runs at --all-gather-bw, the rate of moving bytes once).
  const LayoutHardware hardware = [&](const ParallelLayout& l) {
    ParallelHardware h = parallel_hardware(gpu, link, l, per_node);
    for (Hardware* x : {&h.tp, &h.dp, &h.p2p}) {
      x->peak_flops = ts.hw.peak_flops;
      x->efficiency = ts.hw.efficiency;
      x->memory_bw = ts.hw.memory_bw;
      x->host_bw = ts.hw.host_bw;
      if (bus_bw > 0) x->all_reduce_bw = x->reduce_scatter_bw = x->all_gather_bw = bus_bw * 1e9;
      if (ar_bw > 0) x->all_reduce_bw = ar_bw * 1e9;
      if (rs_bw > 0) x->reduce_scatter_bw = rs_bw * 1e9;
      if (ag_bw > 0) x->all_gather_bw = ag_bw * 1e9;
      if (latency_us >= 0) x->latency_s = latency_us * 1e-6;
    }
    return h;
  };
  const ParallelLayout layout = parallel_layout(in);  // checks T·P divides the ranks
  if (layout.tp * layout.pp > 1) {
    if (!svg.empty() || !time_svg.empty()) {
      throw std::invalid_argument(
          "--svg and --time-svg describe T = P = 1: drop them with --tp/--pp");
    }
    if (vm.count("json")) {
      tools::print_parallel_json(in, hardware, ts.step.recompute);
      return 0;
    }
    tools::print_parallel_report(in, name, lim, hardware, ts.step.recompute);
    if (vm.count("parallel-search")) tools::print_parallel_search(in, name, lim, hardware, top);
    return 0;
  }
  const MemoryPlan plan = plan_memory(in, lim);
  const bool search =
      vm.count("parallel-search") > 0 || (in.shape.known() && (!plan.found || plan.best.offload));
  if (vm.count("json")) {
    print_json(in, plan, ts);
  } else {
    print_report(in, name, device, plan);
    print_time(in, ts, plan);
    if (search) tools::print_parallel_search(in, name, lim, hardware, top);
  }
  if (!svg.empty()) write_svg(svg, in, name, plan);
  if (!time_svg.empty()) write_time_svg(time_svg, in, name, ts);
  return 0;
}

}  // namespace

// Not zero::run_main: that lives in the torch-linked engine (it unwraps c10::Error), and nothing
// here throws one.
int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "zero-memory: error: %s\n", e.what());
    return 1;
  }
}
