// Error feedback for compressed gradients (as in 1-bit Adam and ZeRO++'s qgZ): each rank keeps,
// per flat gradient buffer it sends, the fp32 residual that quantization dropped and adds it to
// the next step's gradient before quantizing again. The quantization error then does not
// accumulate: after T steps, sum of what was sent + the residual == sum of the gradients.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

#include "zero/compress/quantize.hpp"

namespace zero::compress {

class ErrorFeedback {
 public:
  // What a checkpoint carries: the settings (checked on load) and one residual per buffer.
  struct State {
    int bits = 8;
    int64_t block = 0;
    std::vector<at::Tensor> residuals;
  };

  // One zeroed fp32 residual of numels[i] elements per buffer i, allocated with `options`
  // (its device; the dtype is always fp32).
  ErrorFeedback(std::vector<int64_t> numels, int bits, int64_t block,
                const at::TensorOptions& options);

  // Quantizes g + residual[i] and keeps residual[i] = (g + residual[i]) - dequantize(result).
  // g: 1-D fp32 of numels[i] elements.
  Quantized compress(size_t i, const at::Tensor& g);
  // The same for g viewed as [rows, numels[i] / rows], quantized row by row
  // (blockwise_quantize_rows): the compressed reduce-scatter's layout. Non-finite residual
  // elements (a gradient that overflowed under fp16 loss scaling, whose step is skipped) become
  // 0, so one overflow does not poison every later step.
  Quantized compress_rows(size_t i, const at::Tensor& g, int64_t rows);

  // Zeroes every residual: after a step the loss scaler skipped for overflow, whose non-finite
  // gradient left non-finite residuals.
  void reset();

  const at::Tensor& residual(size_t i) const { return residuals_.at(i); }
  size_t buffers() const { return residuals_.size(); }
  int bits() const { return bits_; }
  int64_t block() const { return block_; }
  // Bytes held by the residuals, for the memory report.
  int64_t bytes() const;

  // A copy of the residuals (the caller may write them out while training goes on).
  State state() const;
  // Copies `s` in; throws std::invalid_argument naming the mismatch (bits, block, buffer count or
  // a buffer's size) since a residual for another layout cannot be reused.
  void load_state(const State& s);

 private:
  void check_buffer(size_t i, const at::Tensor& g) const;

  int bits_;
  int64_t block_;
  std::vector<at::Tensor> residuals_;
};

}  // namespace zero::compress
