// zero-memory: per-rank memory of ZeRO stages 0 to 3 before anything is allocated, the
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
#include <iostream>
#include <string>

#include "zero/memory_plan.hpp"
#include "zero/models/gpt_config.hpp"
#include "zero/time_plan.hpp"
#include "zero_memory_parallel.hpp"
#include "zero_memory_report.hpp"

namespace po = boost::program_options;
using namespace zero;
using namespace zero::tools;

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

int run(int argc, char** argv) {
  std::string model, params, dtype = "bf16", device = "80GB", reserve = "10%", svg;
  std::string host_memory = "1TB";
  std::string bucket = "5e8";
  std::string persistence = "1e5";
  std::string gpu = "h100", link = "ib400", recompute = "none", time_svg;
  int per_node = 8, top = 10;
  std::string schedule = "1f1b", partition = "equal";
  std::string error_feedback = "auto";
  std::string startup = "deferred";
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
      "startup", po::value(&startup),
      "how the model reaches zero::initialize, for the start-up peak: deferred (default, as "
      "zero-train builds it: each rank fills only its part) or eager (built whole in fp32 and "
      "moved to the device, as zero-train's tensor-parallel model from HF files is)")(
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
      "interleaved schedule: model chunks per stage v (pipeline.virtual_stages); P must "
      "divide the micro-batches, and P x v the layers with --partition equal")(
      "partition", po::value(&partition),
      "how the time model cuts the stages (interleaved: the P x v chunks): equal (default: "
      "blocks of equal compute), or the pipeline runtime's cut of [embedding, blocks, head] by "
      "pipeline.partition: parameters, compute or uniform")(
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
  if (startup != "deferred" && startup != "eager")
    throw std::invalid_argument("--startup '" + startup + "': deferred or eager");
  in.deferred_start = startup == "deferred";
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
