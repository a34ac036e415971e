// zero-memory: per-rank memory of ZeRO stages 0, 1 and 2 before anything is allocated, and the
// cheapest configuration that fits a device.
//
//   zero-memory --model llama-7b --gpus 8 --device-memory 80GB --micro-batch 1 --seq-len 2048
//   zero-memory --params 7e9 --layers 32 --hidden 4096 --gpus 8 --device-memory 24GiB
//   zero-memory --model gpt-1.3b --gpus 4 --svg stages.svg
#include <boost/program_options.hpp>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <string>

#include "gpt.hpp"
#include "zero/errors.hpp"
#include "zero/memory_plan.hpp"

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
    std::printf("; %lld layers, hidden %lld, %lld heads, ffn %lld, vocab %lld", (long long)m.layers,
                (long long)m.hidden, (long long)m.head_count(), (long long)m.ffn_dim(),
                (long long)m.vocab);
  }
  std::printf("\n  %d ranks, %s parameters and activations, %s gradient accumulation, ",
              in.world_size, dtype, in.grad_accum_bytes == 4 ? "fp32" : "16-bit");
  std::printf("fp32 master weights, %d fp32 optimizer states (AdamW: 2)\n", in.optimizer_states);
  std::printf(
      "  micro-batch %lld x %lld tokens per rank; reduce buckets of %s elements "
      "(largest %s); GB = 10^9 bytes\n\n",
      (long long)in.micro_batch, (long long)in.seq_len, grouped(in.bucket_elements).c_str(),
      grouped(max_bucket_elements(in)).c_str());

  MemoryBreakdown st[3];
  ActivationEstimate act[3];
  for (int s = 0; s < 3; ++s) st[s] = plan_model_states(in, s);
  for (int r = 0; r < 3; ++r) act[r] = predict_activations(in, kModes[r]);
  std::printf("  %-40s %12s %12s %12s\n", "per-rank memory", "stage 0", "stage 1", "stage 2");
  auto row = [&](const char* label, auto value) {
    std::printf("  %-40s", label);
    for (int s = 0; s < 3; ++s) std::printf(" %12s", format_gb(value(s)).c_str());
    std::printf("\n");
  };
  row("parameters", [&](int s) { return st[s].params; });
  row("gradients", [&](int s) { return st[s].grads; });
  row("fp32 master weights", [&](int s) { return st[s].master; });
  row("optimizer states", [&](int s) { return st[s].optimizer; });
  row("bucket buffers", [&](int s) { return st[s].comm_buffers; });
  row("= model states", [&](int s) { return st[s].total(); });
  if (m.known()) {
    for (int r = 0; r < 3; ++r) {
      const std::string label = std::string("activations, ") + recompute_name(kModes[r]);
      row(label.c_str(), [&](int) { return act[r].peak(); });
    }
    for (int r = 0; r < 3; ++r) {
      const std::string label = std::string("total, ") + recompute_name(kModes[r]);
      row(label.c_str(), [&](int s) { return st[s].total() + act[r].peak(); });
    }
  }
  std::printf("\n  model states (memory.hpp's formulas; + bucket buffers):\n");
  for (int s = 0; s < 3; ++s) {
    std::printf("    stage %d: %s = %s\n", s, model_state_formula(in, s).c_str(),
                format_gb(st[s].total() - st[s].comm_buffers).c_str());
  }
  if (in.grad_accum_bytes == 4 && in.param_bytes == 2) {
    std::printf(
        "    (gradients accumulate in fp32 here, 4Ψ: the ZeRO paper's 16Ψ for stage 0 "
        "counts 2Ψ of fp16 gradients; --grad-accum-bytes 2 gives it)\n");
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
  std::printf("\nrecommendation for %d x %s (--device-memory %s):\n", in.world_size,
              format_gb(plan.limits.device_bytes).c_str(), device_arg.c_str());
  for (const std::string& line : plan.reasons) std::printf("  %s\n", line.c_str());
}

void print_json(const PlanInput& in, const MemoryPlan& plan) {
  std::printf(
      "{\"num_params\": %lld, \"world_size\": %d, \"micro_batch\": %lld, \"seq_len\": %lld,"
      "\n \"block_activation_bytes\": %lld,\n \"stages\": [",
      (long long)in.num_params, in.world_size, (long long)in.micro_batch, (long long)in.seq_len,
      (long long)(in.shape.known()
                      ? block_activation_bytes(in.shape, in.micro_batch, in.seq_len, in.param_bytes)
                      : 0));
  for (int s = 0; s < 3; ++s) {
    std::printf("%s\n  {\"stage\": %d, \"model_states\": %s, \"activations\": {", s ? "," : "", s,
                to_json(plan_model_states(in, s)).c_str());
    for (int r = 0; r < 3; ++r) {
      std::printf("%s\"%s\": %lld", r ? ", " : "", kModeIds[r],
                  (long long)predict_activations(in, kModes[r]).peak());
    }
    std::printf("}}");
  }
  std::printf("],\n \"recommendation\": ");
  if (!plan.found) {
    std::printf("null\n}\n");
    return;
  }
  std::printf("{\"stage\": %d, \"recompute\": \"%s\", \"micro_batch\": %lld, \"total\": %lld}\n}\n",
              plan.best.stage, kModeIds[static_cast<int>(plan.best.recompute)],
              (long long)plan.best.micro_batch, (long long)plan.best.total());
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

int run(int argc, char** argv) {
  std::string model, params, dtype = "bf16", device = "80GB", reserve = "10%", svg;
  std::string bucket = "5e8";
  PlanInput in;
  PlanLimits lim;
  po::options_description desc("zero-memory options");
  desc.add_options()("help,h", "show this help")(
      "model", po::value(&model), "example GPT preset: tiny, small, ..., gpt-1.3b, llama-7b")(
      "params", po::value(&params), "parameter count instead of a preset: 7e9, 6.7B")(
      "layers", po::value(&in.shape.layers), "with --params: blocks (for activations)")(
      "hidden", po::value(&in.shape.hidden), "with --params: model width")(
      "heads", po::value(&in.shape.heads), "with --params: attention heads (default hidden/128)")(
      "ffn", po::value(&in.shape.ffn), "with --params: MLP width (default LLaMA's rule)")(
      "vocab", po::value(&in.shape.vocab), "with --params: vocabulary, for the logits")(
      "gpus", po::value(&in.world_size)->default_value(1), "data-parallel ranks N")(
      "micro-batch", po::value(&in.micro_batch)->default_value(1), "sequences per rank")(
      "seq-len", po::value(&in.seq_len)->default_value(2048), "tokens per sequence")(
      "dtype", po::value(&dtype), "bf16 (default) or fp32 parameters and activations")(
      "device-memory", po::value(&device), "per-GPU memory: 80GB, 80GiB, 80e9 (default 80GB)")(
      "reserve", po::value(&reserve), "fraction kept free: 10% (default) or 0.1")(
      "max-micro-batch", po::value(&lim.max_micro_batch)->default_value(64),
      "largest micro-batch the search tries")("bucket-size", po::value(&bucket),
                                              "reduce_bucket_size in elements (default 5e8)")(
      "grad-accum-bytes", po::value(&in.grad_accum_bytes)->default_value(4),
      "4: this engine's fp32 accumulation; 2: the ZeRO paper's 16-bit gradients")(
      "optimizer-states", po::value(&in.optimizer_states)->default_value(2),
      "fp32 states per parameter: AdamW 2, SGD with momentum 1")(
      "svg", po::value(&svg), "also write a stacked bar chart of the stages here")(
      "json", "print JSON instead of the report");
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
    if (vm.count("layers") || vm.count("hidden") || vm.count("vocab") || vm.count("ffn")) {
      throw std::invalid_argument("--model sets the shape: drop --layers/--hidden/--ffn/--vocab");
    }
    const examples::GptConfig c = examples::gpt_preset(model);
    in.shape = {c.layers, c.dim, c.heads, c.ffn_dim(), c.vocab, c.tied};
    in.num_params = c.num_params();
    name = model;
  } else {
    in.num_params = parse_count(params);
    name = params + " parameters";
  }
  if (dtype != "bf16" && dtype != "fp32") throw std::invalid_argument("--dtype: bf16 or fp32");
  in.param_bytes = in.comm_bytes = dtype == "bf16" ? 2 : 4;
  in.bucket_elements = parse_count(bucket);
  lim.device_bytes = parse_byte_size(device);
  lim.reserve = reserve.back() == '%' ? std::stod(reserve) / 100.0 : std::stod(reserve);
  if (in.world_size < 1 || in.micro_batch < 1 || in.seq_len < 1 || in.num_params < 1 ||
      lim.reserve < 0 || lim.reserve >= 1) {
    throw std::invalid_argument(
        "--gpus, --micro-batch, --seq-len and the parameter count must "
        "be positive, --reserve in [0, 1)");
  }

  const MemoryPlan plan = plan_memory(in, lim);
  if (vm.count("json")) {
    print_json(in, plan);
  } else {
    print_report(in, name, device, plan);
  }
  if (!svg.empty()) write_svg(svg, in, name, plan);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return zero::run_main("zero-memory", [&] { return run(argc, argv); });
}
