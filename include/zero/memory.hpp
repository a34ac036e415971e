// Per-rank memory of model states: what the engine holds, next to what the ZeRO formulas predict.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace zero {

struct MemoryBreakdown {
  int64_t params = 0;        // the model's (compute dtype) parameters: full on every rank
  int64_t grads = 0;         // gradient storage kept between micro-steps, and the reduced shard
                             // (stage 3: none between steps unless offloaded)
  int64_t master = 0;        // fp32 master weights (0 when the fp32 model itself is the master)
  int64_t optimizer = 0;     // optimizer states
  int64_t comm_buffers = 0;  // declared bucket buffers
  int64_t total() const { return params + grads + master + optimizer + comm_buffers; }
};

// What a memory prediction needs to know; sizes in bytes per element.
struct MemoryModelInput {
  int64_t num_params = 0;  // Ψ, trainable elements
  int world_size = 1;
  int stage = 0;
  int param_bytes = 4;  // 2 under bf16/fp16
  // The accumulator and the reduced shard (data_types.grad_accum_dtype): 4 fp32, 2 bf16/fp16.
  // Under optimizer offload the shard is fp32 in host memory whatever this is.
  int grad_accum_bytes = 4;
  int optimizer_states = 2;  // fp32 tensors of Ψ/N elements per rank: AdamW 2, SGD momentum 1
  int64_t comm_buffer_bytes = 0;
  int64_t accumulation = 1;  // gradient_accumulation_steps
  bool overlap_comm = true;
  bool offload = false;  // optimizer offload: a separate (host) master even at N = 1 with p = 4
  // Stage 3: the elements of the root unit, whole on every rank (the rest is held as the 1/N
  // fp32 master shard alone; under optimizer offload also a compute-dtype shard on the device).
  int64_t root_params = 0;
};

// Whether `stage` keeps a full gradient accumulator between micro-steps: stage 0 always, stage 1
// under gradient accumulation or without overlap_comm (it then reduces once per window, after
// the last backward), stage 2 never. Otherwise stage 1 reduces during backward as stage 2 does.
bool keeps_full_gradient(int stage, int64_t accumulation, bool overlap_comm);

// The ZeRO paper's per-rank formulas, adjusted to this engine's buffers (p: parameter bytes;
// g: gradient bytes, grad_accum_bytes: 2 for a bf16 model by default, as in DeepSpeed; an fp32
// model is its own master at every stage: its flat buffer's shard is what the optimizer steps,
// so the master term is 0 when p = 4):
//   stage 0: params Ψp + grads gΨ + master (4Ψ unless p = 4) + states 4KΨ
//   stage 1: params Ψp + grads gΨ/N + master (4Ψ/N unless p = 4) + states 4KΨ/N,
//            plus a full gΨ accumulator under gradient accumulation (keeps_full_gradient)
//   stage 2: params Ψp + grads gΨ/N + master (4Ψ/N unless p = 4) + states 4KΨ/N
//   stage 3: params pΨ_root (+ pΨ/N of compute shard under offload only) + master 4Ψ/N + states
//            4KΨ/N, held between steps; the gradient shard gΨ/N and the bucket buffers are
//            allocated by the window's first reduction and freed after the step, so they are
//            not model states here (the planner counts them in stage3_transient_bytes)
// (optimizer offload: the gradient shard is 4Ψ/N, fp32 in host memory, kept at every stage).
MemoryBreakdown predict_model_states(const MemoryModelInput& in);

struct MemoryReport {
  int rank = 0;
  int world_size = 1;
  int stage = 0;
  int64_t num_params = 0;     // real trainable elements
  int64_t padded_params = 0;  // flat buffer elements with padding
  MemoryBreakdown measured;   // bytes of the tensors the engine holds (aliases counted once)
  MemoryBreakdown predicted;  // predict_model_states for this run
  // The same model under plain data parallel (stage 0, predicted): what the sharding saved.
  MemoryBreakdown stage0;
  // Independent of the tensors listed in `measured`: what the allocator itself counted over
  // zero::initialize (zero::allocated_bytes: the CUDA caching allocator, or mallinfo2 on CPU,
  // where it is process-wide), and the bytes of the model's own trainable parameters that
  // initialize replaced by views of the flat buffer (freed unless the caller holds another
  // reference). Expected: allocator_delta == measured.total() - replaced_param_bytes.
  int64_t allocator_delta = 0;
  int64_t replaced_param_bytes = 0;
  std::string allocator;
  // Optimizer offload: the part of measured / predicted total in host memory (fp32 master,
  // optimizer states, fp32 gradient shard, the compute-dtype copy of the shard); the rest is on
  // the device. Stage 3 on a device adds its error-feedback residuals. 0 without either.
  int64_t host_measured = 0;
  int64_t host_predicted = 0;
  // What those host buffers really hold: page-locked ones (pin_memory on a CUDA build) of 1 MiB
  // and more are exact-size blocks rounded to a page (device/pinned_host.hpp); smaller ones take a
  // block of the caching host allocator, which rounds each request up to a power of two.
  // Equal to host_measured when nothing is pinned (CPU-only builds, pin_memory: false).
  int64_t host_pinned = 0;
  // zero_quantized_gradients' error-feedback residuals, part of measured.comm_buffers: a
  // residual of the whole gradient per rank (not its shard), in its storage dtype
  // (zero_quantized_gradients_error_feedback_dtype). 0 without error feedback.
  int64_t error_feedback = 0;
  // Stage 3 on a device: they are held in page-locked host memory (part of host_measured), each
  // reduction's slot staged on the device in one of two staging buffers of the largest slot:
  // their bytes (also part of measured.comm_buffers, on the device), 0 otherwise.
  bool error_feedback_on_host = false;
  int64_t error_feedback_staging = 0;
};

// A fixed-width table, one row per category, measured vs predicted.
std::string format_memory_report(const MemoryReport& r);
// Rank 0's table, then one line per rank with its measured and predicted totals.
std::string format_memory_reports(const std::vector<MemoryReport>& reports);
std::string format_bytes(int64_t bytes);
// {"params": ..., "grads": ..., "master": ..., "optimizer": ..., "comm_buffers": ..., "total": ...}
std::string to_json(const MemoryBreakdown& b);

}  // namespace zero
