#include "zero/compress/error_feedback.hpp"

#include <ATen/ATen.h>

#include <stdexcept>
#include <string>

namespace zero::compress {

ErrorFeedback::ErrorFeedback(std::vector<int64_t> numels, int bits, int64_t block,
                             const at::TensorOptions& options)
    : bits_(bits), block_(block) {
  check_quantize_params(bits, block, "ErrorFeedback");
  residuals_.reserve(numels.size());
  for (int64_t n : numels) residuals_.push_back(at::zeros({n}, options.dtype(at::kFloat)));
}

Quantized ErrorFeedback::compress_rows(size_t i, const at::Tensor& g, int64_t rows) {
  check_buffer(i, g);
  at::Tensor& r = residuals_[i];
  TORCH_CHECK(rows > 0 && g.numel() % rows == 0, "zero: ErrorFeedback::compress_rows: ", g.numel(),
              " elements are not ", rows, " equal rows");
  const int64_t n = g.numel() / rows;
  const at::Tensor corrected = g.reshape({rows, n}).to(at::kFloat).add(r.view({rows, n}));
  Quantized q = blockwise_quantize_rows(corrected, bits_, block_);
  at::Tensor rv = r.view({rows, n});
  at::sub_out(rv, corrected, blockwise_dequantize_rows(q, rows, n));
  r.nan_to_num_(0.0, 0.0, 0.0);
  return q;
}

void ErrorFeedback::check_buffer(size_t i, const at::Tensor& g) const {
  if (i >= residuals_.size()) {
    throw std::invalid_argument("zero: ErrorFeedback::compress: buffer " + std::to_string(i) +
                                " does not exist; there are " + std::to_string(residuals_.size()));
  }
  const at::Tensor& r = residuals_[i];
  if (g.numel() != r.numel()) {
    throw std::invalid_argument("zero: ErrorFeedback::compress: buffer " + std::to_string(i) +
                                " has " + std::to_string(r.numel()) + " elements, gradient has " +
                                std::to_string(g.numel()));
  }
}

Quantized ErrorFeedback::compress(size_t i, const at::Tensor& g) {
  check_buffer(i, g);
  at::Tensor& r = residuals_[i];
  const at::Tensor corrected = g.add(r);
  Quantized q = blockwise_quantize(corrected, bits_, block_);
  at::sub_out(r, corrected, blockwise_dequantize(q));
  return q;
}

void ErrorFeedback::reset() {
  for (at::Tensor& r : residuals_) r.zero_();
}

int64_t ErrorFeedback::bytes() const {
  int64_t total = 0;
  for (const at::Tensor& r : residuals_) total += r.nbytes();
  return total;
}

ErrorFeedback::State ErrorFeedback::state() const {
  State s{bits_, block_, {}};
  for (const at::Tensor& r : residuals_) s.residuals.push_back(r.clone());
  return s;
}

void ErrorFeedback::load_state(const State& s) {
  if (s.bits != bits_ || s.block != block_) {
    throw std::invalid_argument(
        "zero: error-feedback state was saved with bits = " + std::to_string(s.bits) +
        ", block = " + std::to_string(s.block) + " but this run uses bits = " +
        std::to_string(bits_) + ", block = " + std::to_string(block_) +
        "; resume with the same quantization settings or start the residual afresh");
  }
  if (s.residuals.size() != residuals_.size()) {
    throw std::invalid_argument("zero: error-feedback state holds " +
                                std::to_string(s.residuals.size()) + " buffers, this run has " +
                                std::to_string(residuals_.size()));
  }
  for (size_t i = 0; i < residuals_.size(); ++i) {
    if (s.residuals[i].numel() != residuals_[i].numel()) {
      throw std::invalid_argument(
          "zero: error-feedback state buffer " + std::to_string(i) + " has " +
          std::to_string(s.residuals[i].numel()) + " elements, this run's has " +
          std::to_string(residuals_[i].numel()) + " (another world size or model?)");
    }
  }
  for (size_t i = 0; i < residuals_.size(); ++i) residuals_[i].copy_(s.residuals[i].view({-1}));
}

}  // namespace zero::compress
