// Training metrics of the example trainer: model FLOPs per token (for MFU), the per-step time
// breakdown, the compact progress line and the JSONL record.
#pragma once

#include <cstdint>
#include <fstream>
#include <string>

#include "zero/models/gpt.hpp"

namespace zero::examples {

// FLOPs of one training token, forward and backward, as in the PaLM paper's appendix B:
// 6N for the matmul weights (the head included, the embedding lookup not) plus 12·L·H·Q·T for
// attention scores and values (L layers, H heads, Q head dim, T sequence length).
double flops_per_token(const models::GptConfig& c, int64_t seq_len);

struct StepRecord {
  int64_t step = 0;  // optimizer steps done
  int64_t total_steps = 0;
  double loss = 0;
  double lr = 0;
  double grad_norm = 0;
  bool skipped = false;  // fp16 overflow: the step was skipped and has no norm of its own
  double loss_scale = 1;
  double tokens_per_s = 0;  // global: all ranks
  double mfu = -1;          // < 0: peak FLOP/s unknown
  double step_s = 0;
  // Where the step's time went (rank 0): forward, backward (autograd, with the communication it
  // overlapped), exposed communication (waiting for reductions after autograd returned),
  // optimizer (clipping, update, parameter all-gather), data (waiting for the loader).
  double forward_s = 0, backward_s = 0, comm_exposed_s = 0, optimizer_s = 0, data_s = 0;
  double allgather_wait_s = 0;  // the parameter all-gather the optimizer update did not hide
  double eta_s = 0;
  int64_t memory_bytes = 0;  // rank 0's model states, or the device's allocated bytes
  double utilisation = -1;   // rank 0's device (or CPU cores') busy fraction; < 0: unknown
};

std::string format_progress(const StepRecord& r);

// One JSON object per line; opened by rank 0 only.
class MetricsLog {
 public:
  explicit MetricsLog(const std::string& path);  // "" = off
  void write(const StepRecord& r);

 private:
  std::ofstream out_;
};

}  // namespace zero::examples
