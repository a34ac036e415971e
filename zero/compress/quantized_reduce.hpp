// Compressed reduce-scatter of a gradient bucket, after ZeRO++'s qgZ
// (deepspeed/runtime/comm/coalesced_collectives.py, all_to_all_quant_reduce): the bucket
// (world x S elements, chunk r being rank r's shard) is quantized row by row, blockwise with one
// fp32 scale per block (int8, or int4 packed two per byte), and exchanged with one all-to-all, so
// each rank receives only its own shard's blocks from every rank; it dequantizes them and sums
// them in fp32. Error feedback (optional): each rank keeps, per reduction slot, the residual of
// what it sent and adds it to the next step's gradient before quantizing, as DeepSpeed's LoCo
// variant (all_to_all_loco_quant_reduce, its error buffers) and 1-bit Adam do; plain qgZ sends
// int4 without it.
//
// qgZ runs the all-to-all hierarchically (within a node, then across nodes, re-quantizing in
// between) when a node holds several ranks; here it is one flat all-to-all over the
// data-parallel group, so each value is quantized once.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "comm/group.hpp"
#include "zero/compress/error_feedback.hpp"

namespace zero::compress {

// zero_optimization.zero_quantized_gradients and its companions (README, config table).
struct Settings {
  bool enabled = false;
  int bits = 8;                // zero_quantized_gradients_bits: 8 or 4
  int64_t block = 2048;        // zero_quantized_gradients_block: elements per fp32 scale
  bool error_feedback = true;  // zero_quantized_gradients_error_feedback
};

// Bytes one rank hands the all-to-all for a reduce-scatter of world x n elements: each of the
// `world` rows padded to whole blocks, its codes and its scales.
int64_t all_to_all_bytes(int64_t n, int world, int bits, int64_t block);

class QuantizedReduceScatter {
 public:
  // `slots`: the input elements (world x shard part) of each reduction the caller will run, one
  // error-feedback residual each (fp32, on `device`), when s.error_feedback.
  QuantizedReduceScatter(comm::Group& group, const Settings& s, const std::vector<int64_t>& slots,
                         const at::Device& device);

  // `in`: world x out.numel() elements (any floating dtype) of reduction `slot`; returns a Work
  // whose wait() leaves in `out` the sum over ranks of their dequantized chunk of this rank
  // (summed in fp32, then stored in out's dtype). `in` may be reused as soon as this returned.
  comm::Work reduce_scatter(size_t slot, at::Tensor out, const at::Tensor& in,
                            const std::string& what);

  const Settings& settings() const { return settings_; }
  // The residuals (null without error feedback), for checkpoints.
  ErrorFeedback* feedback() { return feedback_.get(); }
  // Bytes held between steps: the residuals (the all-to-all buffers are per call).
  int64_t bytes() const { return feedback_ ? feedback_->bytes() : 0; }

 private:
  comm::Group& group_;
  Settings settings_;
  std::unique_ptr<ErrorFeedback> feedback_;
};

}  // namespace zero::compress
