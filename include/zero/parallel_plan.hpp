// Planning with tensor (T) and pipeline (P) parallelism beside ZeRO's data parallelism (D):
// per-rank memory and step time of a Megatron-style layout, and a search over (T, P) for what
// fits. No torch here, as for memory_plan.hpp. T = P = 1 gives memory_plan.hpp's and
// time_plan.hpp's figures exactly.
//
// Layout. world = T·P·D (an error names the numbers otherwise). Ranks are ordered as Megatron-LM
// orders them: tensor-parallel innermost, then data-parallel, then pipeline, so a
// tensor-parallel group is T consecutive ranks, a data-parallel group D ranks T apart, and the
// next pipeline stage T·D ranks on.
//
// Parameters of one rank (Megatron's split of this block, examples/gpt.cpp): the matmul weights
// of a block (Q and O: 2h², K and V: 2h·kv_dim, 2h² without grouped-query attention; SwiGLU:
// 3hf) / T, the two RMSNorm weights 2h replicated; the vocabulary-parallel embedding V·h / T on
// the first stage, the head V·h / T and the final norm h
// on the last (a tied table is held by both first and last stage when P > 1, as Megatron's shared
// word embeddings are); L / P blocks per stage (P must divide L). The model states of that rank
// are memory_plan.hpp's over D data-parallel ranks of those parameters. The worst stage is the
// plan.
//
// Activations per rank, Korthikanti et al. 2022 (§4.2.2: tensor parallelism divides the parts
// inside attention and MLP by T; sequence parallelism divides the rest) applied to
// memory_plan.hpp's count of this block:
//   inside (÷ T)               Q, K, V, SDPA output 4p·sbh; SwiGLU 4p·sbf; log-sum-exp 4·a·s·b
//   norm/residual (÷ T with SP) norm outputs 2p·sbh; RMSNorm upcasts and normalised tensors
//                               2(4+p)·sbh; rsqrt 8·s·b
// A checkpointed block keeps its p·sbh input, ÷ T with SP (Megatron keeps the sequence shard).
// The head's input is gathered (p·sbh, full); the final norm's part ÷ T with SP; the
// vocabulary-parallel cross-entropy holds 12·s·b·V / T at its peak.
// Pipeline stage i holds k_i micro-batches of its L/P blocks at once: k_i is
// pipeline::pipeline_figures' peak_activation_micro_batches (1F1B: P - i, at most P; GPipe: all
// m); k = 1 without a pipeline. The last stage holds k micro-batches of head input, and under
// GPipe the log-probabilities (4·s·b·V / T) of all but the one whose backward starts.
//
// ZeRO stage 2 with P > 1 is not offered: it reduce-scatters on every micro-step, and DeepSpeed
// refuses ZeRO-2 and -3 with pipeline parallelism (Megatron's distributed optimizer is stage 1).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "zero/memory_plan.hpp"
#include "zero/time_plan.hpp"

namespace zero {

struct ParallelLayout {
  int tp = 1, pp = 1, dp = 1;
};
// world / (T·P), checked: T, P >= 1, T·P divides world_size, P divides the layers (with a shape).
ParallelLayout parallel_layout(const PlanInput& in);
const char* schedule_name(PlanInput::Schedule s);
// "1f1b", "gpipe" or "interleaved"; std::invalid_argument names the choices.
PlanInput::Schedule parse_schedule(const std::string& name);
const char* partition_name(PlanInput::Partition p);
// "equal", "uniform", "parameters" or "compute"; std::invalid_argument names the choices.
PlanInput::Partition parse_partition(const std::string& name);

// Parameters one rank of pipeline stage `stage` holds (see above). Without a shape: Ψ / (T·P).
int64_t rank_params(const PlanInput& in, int stage);
// Micro-batches whose activations pipeline stage `stage` holds at its peak (1 without a pipeline).
int in_flight_micro_batches(const PlanInput& in, int stage);
// One block's saved bytes on one tensor-parallel rank (the formula above).
int64_t block_activation_bytes_per_rank(const PlanInput& in);
ActivationEstimate predict_stage_activations(const PlanInput& in, Recompute r, int stage);

// The model-state view of one rank of pipeline stage `stage`: its own parameters (rank_params)
// sharded over the D data-parallel ranks, everything else of `in` as it is (optimizer offload
// included). memory_plan.hpp's functions of it (plan_model_states, plan_host_states,
// plan_startup_peak) give that rank's figures; at T = P = 1 it is `in`.
PlanInput rank_states_input(const PlanInput& in, int stage);
// One rank's device bytes at its peak: rank_states_input's model states less what is offloaded
// to the host, plus predict_stage_activations (and at stage 3 its gathered units,
// stage3_transient_bytes); the worst of the first and last stage. What
// "auto" plans with (auto_strategy.hpp).
int64_t rank_device_peak(const PlanInput& in, int stage, Recompute r);

struct RankPlan {
  int pipeline_stage = 0;  // the worst stage
  int64_t params = 0;      // rank_params of it
  MemoryBreakdown states;  // over D ranks
  ActivationEstimate act;
  int64_t gathered = 0;  // ZeRO 3: units gathered at once, one unit's gradients, gradient path
  int64_t total() const { return states.total() + act.peak() + gathered; }
};
// The most any rank needs: every pipeline stage planned, the largest kept. ZeRO `stage` 0-3
// (no optimizer offload here; stage 3 with one pipeline stage).
RankPlan plan_parallel_rank(const PlanInput& in, int stage, Recompute r);

// Tensor-parallel communication: every collective one rank of pipeline stage `stage` runs over
// its tensor-parallel group per micro-batch (and the one per step), Megatron-LM's accounting of
// its GPT with this runtime's layers (examples/tp_gpt.cpp). B = b·s·h·p bytes, one activation.
// Without sequence parallelism:
//   embedding  forward: all-reduce B
//   per block  forward: 2 all-reduces B (the row-parallel outputs of attention and MLP);
//              backward: 2 all-reduces B (the gradients of the attention and MLP inputs: each
//              enters its region once, q/k/v and gate/up together, as Megatron's fused
//              linear_qkv and linear_fc1)
//   head       backward: all-reduce B (its input's gradient; tied or not)
// With sequence parallelism (SP):
//   embedding  forward: reduce-scatter B; backward: all-gather B/T
//   per block  forward: 2 all-gathers B/T (entering attention and MLP) + 2 reduce-scatters B
//              (leaving them); backward the conjugates: 2 reduce-scatters B + 2 all-gathers B/T,
//              and 2 all-gathers B/T more: the column products keep only the sequence shard of
//              their input and gather it again for their weight gradients (as Megatron does)
//   head       forward: all-gather B/T; backward: reduce-scatter B (untied, a column layer:
//              one all-gather B/T more, as the blocks')
//   per step   the replicated parameters' gradients (2 RMSNorms per block, the final norm),
//              p bytes each, all-reduced in one call (tensor_parallel::all_reduce_partial_grads;
//              the engine's too, after its dp reduction, zero/grads/partial_grads.hpp: under
//              ZeRO 1/2 each dp rank sends the pieces in its gradient shard, 1/D of it)
// Both:
//   recompute  a checkpointed block re-runs its forward in backward: its forward collectives
//   loss       vocab_parallel_cross_entropy in fp32: an all-gather of each rank's maximum per
//              token (4·b·s bytes) and one all-reduce of the target logit and the sum of
//              exponentials (8·b·s); Megatron all-reduces the three (12·b·s): equal at T = 2
//   checks     the embedding's token ids and the loss's targets are checked on every rank
//              alike (comm/agree.hpp): an all-gather of 2 and of 3 int64 per rank (not in
//              Megatron, whose checks are rank-local). Counted as the layers' default; zero-train
//              turns them off (its datasets check every token when they open): 2 calls fewer
//              per micro-batch, and no host read
// The first stage has the embedding, the last the head and the loss. None at T = 1. `bytes` is
// what a rank hands each call (comm::CountingGroup's payload); sent_bytes() the ring volume
// it puts on the wire, as CountingGroup counts it: all-reduce 2B(T-1)/T, reduce-scatter
// B(T-1)/T, all-gather B_in(T-1). Per block and micro-batch that is Megatron's 4 all-reduces
// of B (8B(T-1)/T; with SP 4 all-gathers and 4 reduce-scatters, the same volume, and the 2
// re-gathers, 2B(T-1)/T more).
struct TpCollective {
  enum class Op { kAllReduce, kAllGather, kReduceScatter } op = Op::kAllReduce;
  enum class Phase { kForward, kBackward, kRecompute, kStep } phase = Phase::kForward;
  int64_t bytes = 0;  // input of one call on one rank
  int64_t calls = 0;  // per micro-batch (kStep: per step)
  const char* what = "";
};
std::vector<TpCollective> tp_collectives(const PlanInput& in, Recompute r, int stage);
// Bytes one call of `c` puts on the wire from one rank of a group of `tp`.
int64_t sent_bytes(const TpCollective& c, int tp);
// Per step: m = in.accumulation micro-batches and the per-step collectives, summed over
// tp_collectives (calls, input bytes and sent bytes per operation).
struct TpCommVolume {
  int64_t calls = 0, payload = 0, sent = 0;
};
struct TpCommStep {
  TpCommVolume all_reduce, all_gather, reduce_scatter;
  int64_t sent() const { return all_reduce.sent + all_gather.sent + reduce_scatter.sent; }
};
TpCommStep tp_comm_per_step(const PlanInput& in, Recompute r, int stage);

// Time. Per micro-batch and pipeline stage, compute is the model's FLOPs / (T·P) (the embedding
// and head's imbalance between stages ignored). Tensor parallelism adds tp_collectives: per block
// and micro-batch Megatron's 2 all-reduces of s·b·h·p bytes in forward and 2 in backward (with
// checkpointing 2 more for the re-run forward; under sequence parallelism each is an all-gather
// plus a reduce-scatter of the same bytes), the embedding's, the head's and the loss's on the
// first and last stage, and under SP the norms' gradients once per step. None of it overlaps
// compute; each call pays the link's latency. Each stage boundary sends
// s·b·h·p bytes (÷ T with SP) forward and the same gradient back per micro-batch, also on the
// critical path. The pipeline step is m·(t_f + t_b) / (1 - bubble) with pipeline_figures' bubble.
// The data-parallel gradient collectives run over D ranks on the parameters of the stage holding
// the most, bucket by bucket behind the last micro-batch's backward as time_plan.hpp models it
// (ZeRO 2: every micro-batch's), then the optimizer step and (ZeRO 1-2) the parameter all-gather.
// MFU = model FLOPs per token x tokens/s / (world · peak). ZeRO 2 with P > 1 is an error.
//
// Unequal stages (in.partition kUniform, kParameters or kCompute, with a shape and P > 1): the
// layers [embedding, L blocks, head] are cut as the pipeline runtime cuts them (zero/pipeline/
// partition.hpp over each layer's parameter count: V·h, 4h² + 3hf + 2h, V·h + h, the head
// holding the tied table too; or, kCompute, over their FLOPs per token below), and each stage's
// compute is its layers' FLOPs per token on one rank as the example GPT's layers declare them
// (include/zero/pipeline_flops.hpp): a block 6·((4h² + 3hf) / T + 2h) + 12·s·h / T, the head
// 6·(V·h / T + h) + 8·V / T (its loss), the embedding h (its lookup's scatter-add). The
// schedule is simulated with those stage times (zero/pipeline/simulate.hpp, stage_scale): the
// slowest stage paces the step, which is the simulated makespan. The compute, tensor-parallel
// and bubble terms are then the slowest stage's (its idle time is bubble_s), and the data-
// parallel terms use the stage holding the most parameters under that cut. Interleaved (v > 1):
// the layers are cut into P·v chunks as StageLayers cuts them (chunk c on stage c % P), each
// chunk timed by its own layers (the block collectives scaled to its blocks, the embedding's on
// chunk 0, the head's and the loss's on the last; one send each way per chunk), and the
// schedule simulated with those chunk times (OpTimes::chunk_forward / chunk_backward); a stage's
// figures are its chunks' sums. P·v then needs not divide L (the runtime's rule: every chunk a
// layer). Memory is still planned for L/P blocks per stage.
struct ParallelHardware {
  Hardware tp;   // the tensor-parallel group's link
  Hardware dp;   // the data-parallel group's
  Hardware p2p;  // between pipeline stages (all_gather_bw as the link's rate)
};
// NVLink within a node, `inter_link` where the group spans nodes: the tensor-parallel group when
// T > per_node, the data-parallel group when T·D > per_node, the stage boundary when T·D >=
// per_node.
ParallelHardware parallel_hardware(const std::string& device, const std::string& inter_link,
                                   const ParallelLayout& layout, int per_node = 8);

// Per-token FLOPs of each stage's layers under in.partition (see above; interleaved, the sum
// of its v chunks); empty with kEqual, without a shape or with P = 1. One tensor-parallel
// rank's.
std::vector<double> stage_flops_per_token(const PlanInput& in);
// The cut itself: virtual stage c holds layers bounds[c] .. bounds[c + 1] - 1 of [embedding, L
// blocks, head] (P·v + 1 entries; v = 1 but for the interleaved schedule, so stage s is c = s),
// as PipelineEngine cuts the example GPT's layers (StageLayers::bounds()); empty when
// stage_flops_per_token is.
std::vector<int> pipeline_stage_bounds(const PlanInput& in);

struct ParallelTime {
  // One rank, per step (m micro-batches), seconds; every stage computes the same (kEqual), or
  // the slowest stage's figures (see above).
  double forward_s = 0, backward_s = 0, recompute_s = 0;  // compute
  double tp_comm_s = 0;                                   // tensor-parallel collectives
  double p2p_s = 0;                                       // stage-boundary sends
  double bubble_fraction = 0, bubble_s = 0;               // pipeline idle time
  double grad_comm_s = 0, grad_comm_exposed_s = 0;        // data-parallel gradients
  double param_gather_s = 0;                              // ZeRO 1-3, after the step
  double unit_gather_s = 0, unit_gather_exposed_s = 0;    // ZeRO 3 (P = 1), time_plan.hpp
  double optimizer_s = 0;
  double offload_exposed_s = 0;  // offloaded checkpoints' copies beyond the compute
  double step_s = 0;
  double tokens_per_s = 0;  // all ranks
  double mfu = 0;
  double model_flops_per_token = 0;
  // Each stage's compute per step (forward + backward + recompute) and the slowest stage:
  // filled for unequal stages only.
  std::vector<double> stage_compute_s;
  int slowest_stage = 0;
};
ParallelTime predict_parallel_step_time(const PlanInput& in, int stage, Recompute r,
                                        const ParallelHardware& hw);

// The search: T ∈ {1, 2, 4, 8} (T <= ranks per node, T divides the heads and the world), P
// dividing the layers with T·P dividing the world, ZeRO stage 0-3 (0-1 with P > 1), each
// recompute, the largest power-of-two micro-batch that fits; the highest predicted MFU wins
// (then the fewest model-parallel ranks). m = in.accumulation micro-batches per step. With
// limits.host_bytes, offloaded checkpoints of a node's ranks must fit its host memory. Optimizer
// offload is not searched. The micro-batch, and so the global batch, differs between layouts:
// MFU compares them, the step time does not.
struct ParallelCandidate {
  ParallelLayout layout;
  int stage = 0;
  Recompute recompute = Recompute::kNone;
  int64_t micro_batch = 1;
  RankPlan memory;
  ParallelTime time;
};
struct ParallelSearch {
  std::vector<ParallelCandidate> fits;  // the best micro-batch per (T, P, stage, recompute),
                                        // highest MFU first
  bool found = false;
  ParallelCandidate best;
};
// `hardware` gives the links of a layout (parallel_hardware, with any overrides); T stops at
// limits.ranks_per_node (8 when 0).
using LayoutHardware = std::function<ParallelHardware(const ParallelLayout&)>;
ParallelSearch search_parallel(const PlanInput& in, const PlanLimits& limits,
                               const LayoutHardware& hardware);

}  // namespace zero
