// Where a run's time went and what to change: the bottleneck verdict zero-train prints at the
// end (and writes to --summary-json). A pure function of the measured times, so it is tested
// with synthetic timings; no torch.
#pragma once

#include <cstdint>
#include <string>

namespace zero::examples {

// Mean seconds per optimizer step (rank 0), as the trainer measures them.
struct StepTimes {
  double step_s = 0;
  double data_s = 0;          // waiting for the loader
  double forward_s = 0;       // compute
  double backward_s = 0;      // compute, with the communication it overlapped
  double comm_exposed_s = 0;  // waiting for gradient reductions after backward
  double optimizer_s = 0;     // clipping, update, parameter all-gather
  double utilisation = -1;    // the device's (or CPU threads') busy fraction; < 0: unknown
};

// What the advice depends on besides the times.
struct RunShape {
  int stage = 0;
  int world_size = 1;
  int64_t grad_accum = 1;
  int64_t micro_batch = 1;
  int64_t buckets = 1;  // gradient buckets per reduction
  // Bits per gradient element on the wire: 32 (fp32), 16 (communication_data_type bf16/fp16),
  // 8 or 4 (zero_quantized_gradients).
  int comm_bits = 32;
  bool checkpointing = false;
  bool cpu = false;             // utilisation is of CPU threads, not of an accelerator
  int64_t memory_used = 0;      // peak bytes (device allocator or RSS)
  int64_t memory_baseline = 0;  // RSS before the model existed (CPU): libraries, not the run
  int64_t memory_budget = 0;    // device memory or the --device-memory budget; 0: unknown
};

enum class Bottleneck { kIo, kCommunication, kMemory, kCompute };
const char* bottleneck_name(Bottleneck b);  // "IO-bound", ...

struct Verdict {
  // Fractions of the step; `other` is what the measured parts do not cover.
  double data = 0, comm = 0, optimizer = 0, compute = 0, other = 0;
  double memory_headroom = -1;  // free fraction of memory_budget; < 0: unknown
  double utilisation = -1;      // StepTimes::utilisation
  Bottleneck kind = Bottleneck::kCompute;
  std::string reason;        // "exposed communication is 41% of the step"
  std::string knob;          // what to change
  std::string line() const;  // "communication-bound: ... -> ..."
};

// Thresholds: a time share at or above these makes the verdict, the largest share winning;
// otherwise less than kMinHeadroom of memory free makes it memory-bound; otherwise compute.
inline constexpr double kIoShare = 0.10, kCommShare = 0.20, kOptimizerShare = 0.20;
inline constexpr double kMinHeadroom = 0.10;
// Below this device utilisation a compute-bound run leaves the device idle between kernels
// (the guide's target is > 85 %).
inline constexpr double kMinUtilisation = 0.85;

Verdict diagnose(const StepTimes& t, const RunShape& run);

}  // namespace zero::examples
