// Time planning before a run: the predicted step time of ZeRO stages 0-3 for a LLaMA-style
// decoder, from FLOPs, bytes moved and rates. No torch here, as for memory_plan.hpp.
//
// Compute. Model FLOPs per token, as PaLM's appendix B counts them: 6·Ψmm for the matmul
// weights (the head included; an untied embedding table is a lookup, not a matmul) plus
// 12·L·s·h for attention scores and values. Forward is a third, backward two thirds.
// Activation checkpointing runs every block's forward once more in backward: + 2·Ψblocks +
// 4·L·s·h per token. Time = FLOPs / (peak · efficiency): `efficiency` is the stated fraction of
// peak the matmuls reach (0.5 by default on GPUs; 1 with a measured rate).
//
// Communication (NCCL's ring model, nccl-tests' "bus bandwidth" B): for a payload of S bytes
// on N ranks, reduce-scatter and all-gather move (N-1)/N·S per rank, all-reduce 2(N-1)/N·S;
// time = that / B + one latency per call. The engine (zero/grads/accumulated_grads.cpp,
// zero/grads/partitioned_grads.cpp, zero/engine/engine.cpp) does, per optimizer step:
//   stage 0  all-reduce of every gradient bucket, on the last micro-step only
//   stage 1  reduce-scatter of every bucket, on the last micro-step only; all-gather of the
//            updated parameters after the optimizer step
//   stage 2  reduce-scatter of every bucket on every micro-step; the same all-gather
//   stage 3  stage 2's reduce-scatters; the all-gather after the step only for the root unit
//            (embedding, final norm, head, the parameters kept whole); every other unit
//            all-gathered before its forward and again before its backward, every micro-step,
//            prefetched ahead of use as the engine's trace decides (stage3_micro_step). In
//            backward the gathers and each unit's reduce-scatter share the link, one at a time.
//            A tied head runs the embedding's unit again (last in forward, first in backward):
//            gathered again there unless kept for reuse (stage3_pass's TiedHead).
// (reduce_scatter: false turns the reduce-scatters into all-reduces.) zero_quantized_gradients
// replaces a reduce-scatter by an all-to-all of B' = bits/8 + 4/block bytes per element, which
// also sends (N-1)/N·B'; hierarchical (N ranks on n nodes of L, hw.ranks_per_node = L): an
// all-to-all within the node, (L-1)/L·B' at the intra-node bandwidth, then one across nodes
// of the node's partial sums, (n-1)/n·B'/L at the inter-node bandwidth. Buckets are launched as
// backward produces them, in the engine's order, one collective at a time; the part of the
// last bucket's completion that falls after backward's end is exposed, the rest is hidden.
// The parameter all-gather follows the step and is always exposed.
//
// Optimizer step: memory-bound, bytes / memory bandwidth over the E elements a rank updates
// (Ψ at stage 0, Ψ/N at stages 1-2): the gradient norm reads 4E; AdamW reads the gradient and
// reads+writes the fp32 master and its K states, 4E + 8E + 8K·E; the compute-dtype copy for the
// all-gather (or stage 0's parameters) writes p·E when master and parameters differ; zeroing
// the gradient accumulators writes their bytes.
//
// Activation offload (checkpointing + CPU offload, the only offload this engine has): every
// kept block input goes to host memory in forward and back in backward, 2·L·p·s·b·h bytes per
// micro-step over the host link, prefetched on a side stream: exposed only where it exceeds
// the compute it overlaps.
//
// Not modelled: data loading (0 here; the trainer measures it), kernel launch overheads,
// gradient copies into buckets, the gradient-norm all-reduce's latency beyond one call.
#pragma once

#include <string>
#include <vector>

#include "zero/memory_plan.hpp"

namespace zero {

// Rates of one rank, all overridable. Bandwidths in bytes/s (nccl-tests' bus bandwidth for the
// collectives, one per kind so a backend that emulates one collective by another, as gloo's
// reduce-scatter does, can be described).
struct Hardware {
  std::string name;
  double peak_flops = 0;     // dense bf16 (or the measured rate)
  double efficiency = 0.5;   // fraction of peak the matmuls reach
  double memory_bw = 0;      // achieved device memory bandwidth
  double all_reduce_bw = 0;  // bus bandwidth
  double reduce_scatter_bw = 0;
  double all_gather_bw = 0;
  double latency_s = 0;  // per collective call
  double host_bw = 0;    // device <-> host (PCIe), for activation offload
  // Ranks per node and the bus bandwidth and latency within a node (NVLink), for the
  // hierarchical compressed reduction, whose first all-to-all stays inside the node
  // (0: unknown; the exchange is timed as one flat all-to-all).
  int ranks_per_node = 0;
  double intra_node_bw = 0;
  double intra_node_latency_s = 0;
};

// Devices: "a100", "h100", "h200". Links: "nvlink" (the device's own, within a node),
// "ib100", "ib200", "ib400" (one NIC of that many Gb/s per device). world > per_node ranks
// span nodes and the ring runs at the inter-node link; within a node at NVLink.
// Throws std::invalid_argument naming the known values.
Hardware hardware_preset(const std::string& device, const std::string& inter_link, int world,
                         int per_node = 8);
std::vector<std::string> device_preset_names();
std::vector<std::string> link_preset_names();

struct StepShape {
  int stage = 0;
  Recompute recompute = Recompute::kNone;
  int64_t grad_accum = 1;
  bool overlap_comm = true;
  bool reduce_scatter = true;
};

struct TimeEstimate {
  double model_flops_per_token = 0;                       // without recomputation (for MFU)
  double flops_per_token = 0;                             // with it
  double forward_s = 0, backward_s = 0, recompute_s = 0;  // compute, all micro-steps
  double grad_comm_s = 0;                                 // gradient collectives, all of them
  double grad_comm_exposed_s = 0;                         // of which after backward's end
  double param_gather_s = 0;  // stages 1-2 (stage 3: the root unit), after the step: exposed
  // Stage 3: every unit but the root all-gathered in forward and again in backward (unless
  // kept, stage3_max_reuse_distance), each micro-step, with prefetch (stage3_pass).
  double unit_gather_s = 0, unit_gather_exposed_s = 0;
  int64_t unit_gathers = 0;  // per micro-step
  double optimizer_s = 0;
  double offload_s = 0, offload_exposed_s = 0;
  int64_t buckets = 0;
  double step_s = 0;
  double tokens_per_s = 0;  // all ranks
  double mfu = 0;           // model FLOPs / (N · peak)
  double compute_s() const { return forward_s + backward_s + recompute_s; }
  double exposed_comm_s() const {
    return grad_comm_exposed_s + param_gather_s + unit_gather_exposed_s;
  }
};

// Model FLOPs per token (see above); with `recompute`, what checkpointing adds.
double model_flops_per_token(const PlanInput& in);
double recompute_flops_per_token(const PlanInput& in);
// Seconds of one collective of `bytes` on `world` ranks over `hw` (0 for one rank).
double all_reduce_s(double bytes, int world, const Hardware& hw);
double reduce_scatter_s(double bytes, int world, const Hardware& hw);
double all_gather_s(double bytes, int world, const Hardware& hw);
// Bucket sizes in elements, in the engine's launch order (see max_bucket_elements).
std::vector<int64_t> bucket_sizes(const PlanInput& in);
// Seconds after backward's end until the last bucket's collective is done, for buckets launched
// as backward produces them: bucket i is ready at backward_s · (elements up to it) / Ψ.
double exposed_after_backward(const std::vector<int64_t>& buckets,
                              const std::vector<double>& comm_s, double backward_s);
// Bytes the optimizer step reads and writes on one rank (see above).
double optimizer_bytes(const PlanInput& in, int stage);

// Stage 3's unit gathers in one micro-step whose forward and backward compute take these
// seconds: each unit's share of them is its share of the parameters; its all-gather moves
// p·u·(N-1)/N bytes and its gradients' reduce-scatter c·u·(N-1)/N (c: the communication
// dtype's bytes), on the same link (stage3_pass in memory_plan.hpp for the order, prefetch and
// reuse). `grad_tail_s` (overlap_comm): what of the reduce-scatters ends after backward's
// compute (the root unit's last), the stage's exposed gradient communication; null: the
// reduce-scatters run after backward, off the pass.
Stage3Pass stage3_micro_step(const PlanInput& in, double forward_s, double backward_s, int world,
                             const Hardware& hw, double* grad_tail_s = nullptr);

TimeEstimate predict_step_time(const PlanInput& in, const StepShape& step, const Hardware& hw);

// "step 1.234 s = compute 0.9 + exposed comm 0.2 (0.5 hidden) + optimizer 0.1 ...", one line.
std::string describe_time(const TimeEstimate& t);

// A stacked bar per configuration: where the predicted step time goes.
struct TimeChartBar {
  std::string label;
  TimeEstimate t;
};
std::string time_chart_svg(const std::string& title, const std::string& subtitle,
                           const std::vector<TimeChartBar>& bars);

}  // namespace zero
