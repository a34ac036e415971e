// Memory planning before a run: per-rank bytes of ZeRO stages 0-3 for a LLaMA-style decoder
// (model states and activations), and the cheapest configuration that fits a device (searched
// over stages 0-2, stage 3 when nothing else fits; stage 3 adds its gathered units,
// stage3_transient_bytes).
// No torch here: the planner runs on a laptop for a model that only fits on a cluster.
//
// Model states come from predict_model_states (memory.hpp) plus the engine's bucket buffers.
//
// Activations: the bytes autograd keeps for backward, counted tensor by tensor the way
// Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large Transformer Models")
// count a GPT layer, s·b·h·(34 + 5·a·s/h) bytes in fp16 with dropout. The example block
// (examples/gpt.cpp) differs, so the count is redone for it, with p = bytes of the compute dtype:
//   attention  norm output h, Q, K (after RoPE), V, SDPA output      5·p·sbh
//              scaled_dot_product_attention is flash / memory-efficient: no a·s² scores are
//              kept, only the fp32 log-sum-exp                     + 4·a·s·b
//              (the out-projection's input is a view of the SDPA output: not counted twice)
//   MLP        norm output m                                        1·p·sbh
//              SwiGLU: gate input, silu output, up output, product  4·p·sbf    (f = d_ff)
//   RMSNorm    x2, each: its fp32 upcast of the input (4 bytes, the input itself when p = 4),
//              the normalised p-byte tensor, fp32 rsqrt per token   2·(4 + p)·sbh + 8·s·b
//   no dropout: Korthikanti's masks are absent.
//   block = s·b·h·(8p + 8) + 4p·s·b·f + 4·a·s·b + 8·s·b
// bf16: 24·sbh + 8·sbf; a GPT block with a 4h GeLU MLP and fp16 LayerNorms would be 34·sbh.
// The count was checked against torch.autograd.graph.saved_tensors_hooks on a replica of the
// block (bench/memory_compare.py --activations): equal to the byte.
// Outside the blocks: the final norm and the head's input, s·b·h·(4 + 2p) + 4·s·b, the token
// ids 8·s·b, and the loss: cross-entropy in fp32 keeps the log-probabilities (4 bytes per logit)
// and at the start of backward also holds the gradient from NLL and log-softmax's input gradient:
// 12·s·b·V bytes at the peak.
//
// Full checkpointing (every block) keeps only each block's p·sbh input, and rebuilds one block's
// activations at a time in backward; by then the loss tensors are freed, so the peak is
//   L·p·sbh + max(head + loss, block).
// With CPU offload the kept inputs live in host memory; the device holds two (the one in use
// and the next, prefetched): 2·p·sbh + max(head + loss, block).
//
// Optimizer offload (zero_optimization.offload_optimizer, stages 1 and 2; in.offload_optimizer):
// per rank the fp32 master shard 4Ψ/N, the K optimizer states 4KΨ/N, the fp32 gradient shard
// 4Ψ/N and the compute-dtype copy of the shard the CPU step writes pΨ/N live in host memory,
// (8 + 4K + p)Ψ/N as the engine's memory report counts them (zero/engine/engine.cpp); the device
// keeps the compute-dtype parameters pΨ, stage 1's full fp32 accumulator where it keeps one, and
// two pairs of bucket buffers (the gradients always go through them, to be copied to the host). The
// planner recommends it only when nothing fits without: it adds a CPU step and two PCIe copies
// of the shard per step. A node's host memory holds ranks_per_node times the host part (with
// the offloaded activation checkpoints): the plan says when it does not.
//
// Not counted, left to the reserve: the CUDA context, allocator fragmentation, backward's
// transient gradients (a block's activation gradients, autograd's per-parameter gradient before
// it is copied into its bucket) and the optimizer step's temporaries.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "zero/memory.hpp"

namespace zero {

// What activations depend on; 0 = unknown. The layout follows examples/gpt.hpp.
struct ModelShape {
  int64_t layers = 0;
  int64_t hidden = 0;
  int64_t heads = 0;  // 0: hidden / 128
  int64_t ffn = 0;    // 0: LLaMA's rule, 2/3 · 4h rounded up to a multiple of 256
  int64_t vocab = 0;  // 0: no logits counted
  bool tied = false;
  // Key/value heads: 0 as many as the query heads (multi-head attention); fewer, grouped-query
  // attention (LLaMA-2-70B: 64 heads, 8 kv heads): K and V project to kv_dim() = kv heads x
  // head size, so their weights are h·kv_dim() each instead of h². The example block repeats
  // each K/V head for its query heads before attention (examples/gpt.cpp), so the activations it
  // keeps for backward are those of full multi-head attention: only parameters (and through them
  // model states, matmul FLOPs and gradient buckets) depend on kv_heads.
  int64_t kv_heads = 0;
  bool known() const { return layers > 0 && hidden > 0; }
  int64_t ffn_dim() const;
  int64_t head_count() const;
  int64_t kv_head_count() const;
  int64_t kv_dim() const;
  // Q, K, V, O of one block: 2h² + 2h·kv_dim().
  int64_t attention_params() const;
  int64_t num_params() const;  // the example GPT's count for this shape
  // Its parameters' sizes in registration (named_parameters) order; the engine lays out and
  // buckets them in reverse (bucket_sizes, max_bucket_elements).
  std::vector<int64_t> parameter_sizes() const;
};

enum class Recompute { kNone, kCheckpoint, kCheckpointOffload };
const char* recompute_name(Recompute r);

struct PlanInput {
  int64_t num_params = 0;  // Ψ
  ModelShape shape;
  int world_size = 1;
  int64_t micro_batch = 1;
  int64_t seq_len = 2048;
  int param_bytes = 2;       // compute dtype of parameters and activations: bf16 2, fp32 4
  int grad_accum_bytes = 4;  // accumulator and reduced shard (grad_accum_dtype): fp32 4, bf16 2
  int optimizer_states = 2;  // AdamW
  int comm_bytes = 2;        // gradients travel in the compute dtype (communication_data_type)
  // zero_quantized_gradients (stages 1 and 2): gradients travel as `quantized_bits`-bit codes
  // plus one fp32 scale per `quantized_block` elements (0: off, comm_bytes per element), and
  // error feedback keeps a residual per gradient element (the whole gradient, not the shard)
  // beside the bucket buffers, of `error_feedback_store_bytes` each (error_feedback_bytes).
  int quantized_bits = 0;
  int64_t quantized_block = 2048;
  bool error_feedback = true;
  // zero_quantized_gradients_error_feedback_dtype: 0 "auto" (comm_bytes), 4 fp32, 2 bf16/fp16,
  // 1 int8 (plus one fp32 scale per quantized_block elements).
  int error_feedback_store_bytes = 0;
  bool quantized_hierarchical = true;     // zero_quantized_gradients_hierarchical (time_plan.hpp)
  int64_t bucket_elements = 500'000'000;  // zero_optimization.reduce_bucket_size
  int64_t accumulation = 1;               // gradient_accumulation_steps (stage 1's accumulator)
  bool overlap_comm = true;               // zero_optimization.overlap_comm (likewise)
  // Stage 3 (zero_optimization.stage3_param_persistence_threshold, _model_persistence_threshold,
  // DeepSpeed's defaults): which block parameters stay whole in the root unit (stage3_units).
  int64_t param_persistence_threshold = 100'000;
  int64_t model_persistence_threshold = INT64_MAX;
  // stage3_prefetch_bucket_size (0: no prefetch), stage3_max_live_parameters and
  // stage3_max_reuse_distance, DeepSpeed's defaults: what stage 3 gathers ahead and keeps
  // (stage3_pass below).
  int64_t prefetch_bucket_size = 50'000'000;
  int64_t max_live_parameters = 1'000'000'000;
  int64_t max_reuse_distance = 1'000'000'000;
  // zero_optimization.offload_optimizer is on (stages 1 to 3): the optimizer's part of the
  // model states is in host memory. plan_memory considers offload either way; set, it only
  // considers offload.
  bool offload_optimizer = false;
  // The model reaches zero::initialize deferred (deferred_init.hpp: zero-train builds it so at
  // tensor-parallel size 1): no copy of it on the device, each rank fills only what it keeps.
  // Read by plan_startup_peak alone; false: an eager model, built whole and moved to the device.
  bool deferred_start = false;
  // Megatron-style model parallelism, planned by parallel_plan.hpp: T tensor-parallel ranks, P
  // pipeline stages, sequence parallelism, and the pipeline schedule over `accumulation`
  // micro-batches; the data-parallel size is world_size / (T·P). The functions of this header
  // plan T = P = 1 and read none of these.
  int tensor_parallel = 1;
  int pipeline_stages = 1;
  bool sequence_parallel = false;
  enum class Schedule { kOneFOneB, kGPipe, kInterleaved } schedule = Schedule::kOneFOneB;
  // kInterleaved: v model chunks per stage (pipeline.virtual_stages, Megatron's interleaved
  // 1F1B): P must divide the micro-batches, and P·v the layers with kEqual (with another
  // partition every one of the P·v chunks needs a layer of [embedding, L blocks, head]).
  int virtual_stages = 1;
  // How the time model cuts the model into stages (parallel_plan.hpp): kEqual, L/P blocks of
  // equal compute (the embedding and head ignored); kUniform, kParameters and kCompute, the
  // runtime's cut of [embedding, L blocks, head] by that pipeline.partition method, each stage
  // (interleaved: each of its chunks) timed by its own layers.
  enum class Partition { kEqual, kUniform, kParameters, kCompute } partition = Partition::kEqual;
};

struct ActivationEstimate {
  int64_t blocks = 0;     // kept on the device by the blocks (or their checkpointed inputs)
  int64_t recompute = 0;  // one block rebuilt in backward (checkpointing only)
  int64_t head = 0;       // final norm, head input, token ids
  int64_t loss = 0;       // logits at their peak
  int64_t host = 0;       // offloaded block inputs, in host memory
  bool checkpointed = false;
  int64_t peak() const;  // device bytes at the worst moment
};

// Saved bytes of one block for micro-batch b and sequence s (the formula above).
int64_t block_activation_bytes(const ModelShape& m, int64_t b, int64_t s, int p);
ActivationEstimate predict_activations(const PlanInput& in, Recompute r);

// Elements of the largest gradient bucket: the example GPT's parameters in the engine's order
// (reverse registration), a bucket closing at the first parameter that reaches the size.
int64_t max_bucket_elements(const PlanInput& in);
// Stage 3's units of the example GPT (models/gpt.cpp marks the embedding, each block, the final
// norm and an untied head, zero::shard), each the sizes of its parameters in the engine's order
// (reverse registration), in forward order after units[0], the root: every parameter that stays
// whole by DeepSpeed's persistence rule (zero/units/unit_plan.hpp: numel <=
// param_persistence_threshold in registration order, while the total kept whole stays within
// model_persistence_threshold), possibly none. A unit left with no parameter is dropped (the root
// never). A tied head is the embedding's unit run again (not a unit of its own). Empty when the
// shape is not the model.
std::vector<std::vector<int64_t>> stage3_units(const PlanInput& in);
// The root unit's elements (units[0] above), gathered all the time at stage 3; 0 without a
// shape (every parameter counted as sharded).
int64_t stage3_root_params(const PlanInput& in);
// Stage 3's units that are gathered on use (every unit but the root), in forward order, their
// elements each. Without a shape: the parameters outside the root in buckets of
// reduce_bucket_size, as equal units.
std::vector<int64_t> stage3_gathered_units(const PlanInput& in);

// One forward and one backward pass of stage 3 over units u_0..u_{k-1} (elements), as the
// engine's trace decides (zero/units/unit_trace.hpp): at each unit's entry the following units
// in pass order are prefetched while the elements chosen stay below
// min(prefetch_bucket_size, max_live_parameters - live), so the last one chosen may cross it;
// a unit is released after its forward unless it is used again within max_reuse_distance
// elements (its backward: 2·(u_{i+1} + ... + u_{k-1}) elements later), and released after its
// backward. Collectives run one at a time on the link: the gathers, and with `reduce_s` each
// unit's gradient reduce-scatter, launched when its backward is done (so backward's gathers
// wait behind earlier reduce-scatters). A unit computes once its gather is done and the unit
// before it has computed. Given each unit's gather seconds and its forward and backward compute
// seconds, the pass's times and the most elements gathered at once.
struct Stage3Pass {
  double forward_s = 0, backward_s = 0;                // makespans, gathers included
  double forward_gather_s = 0, backward_gather_s = 0;  // gathers issued (all of them)
  double exposed_s = 0;    // makespans minus compute: the gathers' time not hidden
  double link_free_s = 0;  // when the last collective ends (the pass starts at 0)
  int64_t gathers = 0;     // all-gathers per micro-step (units gathered twice count twice)
  int64_t peak_live = 0;   // elements gathered at once, at the worst moment
};
// A tied head (the example GPT with tied embeddings, models/gpt.cpp): units[0], the
// embedding's unit, runs again last in forward and first in backward, computing these seconds
// there (the head's matmul; forward_s[0] / backward_s[0] are then the lookup's). Those runs are
// trace entries like any other: released after the forward run unless reused within
// max_reuse_distance, gathered again where not gathered (so twice per forward and again in
// backward when nothing is kept), and after the head's backward kept gathered until the
// embedding's, the last use, where its reduce-scatter starts (the weight's two gradients meet
// in one accumulator).
struct TiedHead {
  double forward_s = 0, backward_s = 0;
};
Stage3Pass stage3_pass(const std::vector<int64_t>& units, const std::vector<double>& gather_s,
                       const std::vector<double>& forward_s, const std::vector<double>& backward_s,
                       const PlanInput& limits, const std::vector<double>& reduce_s = {},
                       const TiedHead* tied = nullptr);
// Whether `in` is the example GPT with a tied head whose embedding is a gathered unit of its
// own: stage3_gathered_units(in)[0] then runs again as the head.
bool stage3_tied_head(const PlanInput& in);
// Device bytes stage 3 holds beyond its model states at the worst moment of a pass: the units
// gathered at once (stage3_pass's peak_live) in the compute dtype, the gradients of the
// largest unit in the compute dtype before they are copied into their bucket, and the gradient
// path, which stage 3 holds only from the window's first reduction to the step
// (stage3_gradient_path_bytes). 0 below stage 3.
int64_t stage3_transient_bytes(const PlanInput& in, int stage);
// Stage 3's gradient path, allocated by the window's first reduction and freed after the step
// (the engine's GradSyncOptions::release_between_steps): the gradient shard gΨ/N (kept between
// steps under optimizer offload, fp32 in host memory: then not here) and the two bucket buffers
// with their 1/N shards. 0 below stage 3.
int64_t stage3_gradient_path_bytes(const PlanInput& in, int stage);
// Elements of one bucket buffer for `stage` (FlatLayout::buffer_numel: the largest bucket, but at
// most reduce_bucket_size, larger buckets being reduced in chunks); its 1/N shard buffer is
// this divided by N at stages 1 to 3. At stage 3 a bucket never spans two units
// (FlatLayout::build), so the largest bucket is the largest within one unit.
int64_t bucket_buffer_elements(const PlanInput& in, int stage);
// predict_model_states plus the bucket buffers the engine declares for this stage (with
// offload: plus the host compute-dtype copy, which the engine's report counts as a buffer).
// What is held between steps: at stage 3 no bucket buffer (stage3_gradient_path_bytes).
MemoryBreakdown plan_model_states(const PlanInput& in, int stage);
// The part of plan_model_states in host memory: (8 + 4K + p)Ψ/N plus a pinned ring with
// in.offload_optimizer at stages 1 to 3, else 0; at stage 3 plus the error-feedback residuals.
// The device holds the rest.
int64_t plan_host_states(const PlanInput& in, int stage);
// The most device bytes zero::initialize holds at once per rank: the larger of the flattening
// phase and the final model states on the device (plan_model_states less plan_host_states:
// stage 3's error-feedback residual and the offloaded master and states are host memory).
// Flattening allocates the compute-dtype parameters (stage 3: the root unit and the shard) and
// the master (on the device unless offloaded) up front (flat_params.cpp), and then:
//   eager (in.deferred_start false): the user's fp32 model 4Ψ is still there, freed bucket by
//     bucket, and for 16-bit parameters one fp32 staging bucket; at stage 3 every unit's buffer
//     is allocated whole, pΨ, until the engine releases the units gathered on use;
//   deferred: nothing of the model is on the device; a parameter held whole (stages 0-2: every
//     one; stage 3: the root's) goes up through a 16 MiB page-locked slot, which for 16-bit
//     parameters is cast on the device, one fp32 slot there for the moment
//     (deferred_cast_bytes).
// In allocator terms (a caching allocator reserves at::empty at once); bench/startup_step.py
// measures RSS. Host transients of a deferred start-up (one parameter drawn in fp32, a block
// while it is built, the two 16 MiB slots) are not device bytes and not counted.
int64_t plan_startup_peak(const PlanInput& in, int stage);
// The deferred start-up's device transient above: 4 bytes per element of the largest piece
// uploaded whole into 16-bit parameters (the largest parameter at stages 0-2, the root's largest
// at stage 3, and under optimizer offload a stage-3 shard piece), at most one 16 MiB slot; 0 for
// fp32 parameters (no cast). Without a shape: one slot, or the whole model if smaller.
int64_t deferred_cast_bytes(const PlanInput& in, int stage);
// The error-feedback residuals of zero_quantized_gradients per rank (0 when off or at stage 0):
// Ψ elements of error_feedback_store_bytes (int8: plus 4 bytes per quantized_block). Part of
// plan_model_states' comm_buffers; at stage 3 in host memory (plan_host_states), not on the
// device. The engine pads each bucket to a multiple of the world size
// and keeps a second residual of Ψ·nodes/N under the hierarchical exchange; neither is counted.
int64_t error_feedback_bytes(const PlanInput& in, int stage);
// Stage 3 (residuals in host memory): the two device staging buffers each reduction's slot goes
// through (compress/error_feedback.hpp), each one bucket buffer (bucket_buffer_elements) in the
// residual's storage. Part of plan_model_states' comm_buffers, on the device. 0 otherwise.
int64_t error_feedback_staging_bytes(const PlanInput& in, int stage);
// "2Ψ + 4Ψ + 4Ψ + 8Ψ = 18Ψ": the terms of predict_model_states, buffers left out. Stage 3:
// "4Ψ_root + 4Ψ/N + 4Ψ/N + 8Ψ/N" with Ψ_root = stage3_root_params as a fraction of Ψ.
std::string model_state_formula(const PlanInput& in, int stage);

struct PlanLimits {
  int64_t device_bytes = 0;
  double reserve = 0.10;  // fraction kept free: context, fragmentation, transients
  int64_t max_micro_batch = 64;
  int64_t budget() const;
  // Host memory of one node (0: not checked) and the ranks sharing it (0: all of world_size),
  // with the same reserve fraction kept free (the OS, data loading, the page cache).
  int64_t host_bytes = 0;
  int ranks_per_node = 0;
  int64_t host_budget() const;
};

struct PlanCandidate {
  int stage = 0;
  Recompute recompute = Recompute::kNone;
  int64_t micro_batch = 1;
  MemoryBreakdown states;  // all model states, host part included
  ActivationEstimate act;
  bool offload = false;                                                        // optimizer offload
  int64_t host_states = 0;                                                     // plan_host_states
  int64_t total() const { return states.total() - host_states + act.peak(); }  // device bytes
  int64_t host() const { return host_states + act.host; }  // host bytes per rank
};

// For one (stage, recompute): the largest power-of-two micro-batch that fits, if any.
struct StageOption {
  bool fits = false;
  PlanCandidate best;     // valid when fits
  PlanCandidate refused;  // the next micro-batch up (or b = 1 when nothing fits); micro_batch 0
                          // when the search stopped at max_micro_batch
};

struct MemoryPlan {
  PlanLimits limits;
  StageOption options[3][3];  // [stage][recompute], without optimizer offload
  StageOption offload[3][3];  // with it; stage 0 never fits (the engine refuses it)
  bool found = false;
  PlanCandidate best;
  int ranks_per_node = 1;
  int64_t host_per_node = 0;         // ranks_per_node x best.host()
  bool host_fits = true;             // host_per_node within limits.host_budget() (or not checked)
  std::vector<std::string> reasons;  // why, line by line, for people
};

// Search stage ∈ {0,1,2} × recompute × micro-batch ∈ {1,2,4,...,max}. Ranking: least
// recompute first, then the largest micro-batch, then the lowest stage (the header of
// memory_plan.cpp says why). Optimizer offload only when nothing fits without it (or when
// in.offload_optimizer says it is on), ranked the same way among its own options.
MemoryPlan plan_memory(const PlanInput& in, const PlanLimits& limits);

// "80GB" = 80e9, "80GiB" = 80·2^30, "80e9", "85899345920"; throws std::invalid_argument.
int64_t parse_byte_size(const std::string& text);
// Decimal gigabytes, "107.81 GB": device sizes are sold in them.
std::string format_gb(int64_t bytes);

// A stacked bar chart in the style of Figure 1 of the ZeRO paper: one bar per configuration,
// one <rect> per nonzero category, a dashed line at the device's memory. Colours follow the
// order in which categories first appear; the legend uses circles, so rects are segments only.
struct ChartSegment {
  std::string category;
  int64_t bytes = 0;
};
struct ChartBar {
  std::string label;
  std::vector<ChartSegment> segments;
};
struct MemoryChart {
  std::string title;
  std::string subtitle;
  std::vector<ChartBar> bars;
  int64_t limit_bytes = 0;  // 0: no line
  std::string limit_label;
};
std::string memory_chart_svg(const MemoryChart& chart);

}  // namespace zero
