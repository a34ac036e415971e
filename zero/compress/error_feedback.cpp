#include "zero/compress/error_feedback.hpp"

#include "device/event_wait.hpp"
#include "device/pinned_host.hpp"

#include <ATen/ATen.h>
#include <c10/core/Event.h>
#include <c10/core/impl/VirtualGuardImpl.h>

#include <stdexcept>
#include <string>
#include <utility>

namespace zero::compress {

int64_t residual_bytes(int64_t numel, at::ScalarType store, int64_t block) {
  if (store == at::kChar) return num_blocks(numel, block) * (block + 4);
  return numel * static_cast<int64_t>(c10::elementSize(store));
}

at::ScalarType residual_store(const std::string& name, at::ScalarType grad_dtype) {
  if (name == "auto") return grad_dtype;
  if (name == "fp32") return at::kFloat;
  if (name == "bf16") return at::kBFloat16;
  if (name == "fp16") return at::kHalf;
  if (name == "int8") return at::kChar;
  throw std::invalid_argument(
      "zero: zero_optimization.zero_quantized_gradients_error_feedback_dtype is '" + name +
      "'; use auto (the gradients' communication dtype), fp32, bf16, fp16 or int8");
}

ErrorFeedback::ErrorFeedback(std::vector<int64_t> numels, int bits, int64_t block,
                             const at::TensorOptions& options, at::ScalarType store,
                             Residence where)
    : bits_(bits),
      block_(block),
      store_(store),
      numels_(std::move(numels)),
      host_home_(where == Residence::kHost && !options.device().is_cpu()),
      compute_(options.device()) {
  check_quantize_params(bits, block, "ErrorFeedback");
  if (store != at::kFloat && store != at::kBFloat16 && store != at::kHalf && store != at::kChar) {
    throw std::invalid_argument(std::string("zero: ErrorFeedback: residuals are stored as fp32, ") +
                                "bf16, fp16 or int8, not " + c10::toString(store));
  }
  // Page-locked, so that the per-reduction copies are queued, not waited for.
  const auto zeros = [&](int64_t n, at::ScalarType dtype) {
    return host_home_ ? device::host_zeros(n, /*pin=*/true, dtype)
                      : at::zeros({n}, options.dtype(dtype));
  };
  for (int64_t n : numels_) {
    if (store == at::kChar) {
      const int64_t blocks = num_blocks(n, block);
      codes_.push_back(zeros(blocks * block, at::kChar));
      scales_.push_back(zeros(blocks, at::kFloat));
    } else {
      values_.push_back(zeros(n, store));
    }
  }
  landed_.resize(host_home_ ? numels_.size() : 0);
}

ErrorFeedback::~ErrorFeedback() {
  // The pinned buffers may still be written by a queued download.
  try {
    settle_all();
  } catch (...) {
  }
}

at::Tensor ErrorFeedback::staged(size_t i) {
  const c10::impl::VirtualGuardImpl impl(compute_.type());
  // The previous download into this residual may have been queued on another stream.
  if (landed_[i]) landed_[i]->block(impl.getStream(compute_));
  if (store_ != at::kChar) return values_[i].to(compute_, /*non_blocking=*/true).to(at::kFloat);
  Quantized q{codes_[i].to(compute_, /*non_blocking=*/true),
              scales_[i].to(compute_, /*non_blocking=*/true), numels_[i], 8, block_};
  return blockwise_dequantize(q);
}

void ErrorFeedback::download(size_t i, const at::Tensor& e) {
  // Both copies are queued on the current stream after the kernels that made `e`, so the
  // device temporaries go back to that stream's pool only behind them.
  if (store_ != at::kChar) {
    values_[i].copy_(e.to(store_), /*non_blocking=*/true);
  } else {
    const Quantized q = blockwise_quantize(e, 8, block_);
    codes_[i].copy_(q.codes, /*non_blocking=*/true);
    scales_[i].copy_(q.scales, /*non_blocking=*/true);
  }
  const c10::impl::VirtualGuardImpl impl(compute_.type());
  if (!landed_[i]) landed_[i] = std::make_unique<c10::Event>(compute_.type());
  landed_[i]->record(impl.getStream(compute_));
}

void ErrorFeedback::settle(size_t i) const {
  if (host_home_ && landed_.at(i)) device::wait_for_event(*landed_[i]);
}

void ErrorFeedback::settle_all() const {
  for (size_t i = 0; i < landed_.size(); ++i) settle(i);
}

at::Tensor ErrorFeedback::residual(size_t i) const {
  settle(i);
  if (store_ != at::kChar) return values_.at(i).to(at::kFloat);
  Quantized q{codes_.at(i), scales_.at(i), numels_.at(i), 8, block_};
  return blockwise_dequantize(q);
}

void ErrorFeedback::keep(size_t i, const at::Tensor& e) {
  if (host_home_ && !e.device().is_cpu()) {
    download(i, e);
    return;
  }
  settle(i);  // a host write (load_state) after a queued download
  if (store_ != at::kChar) {
    values_[i].copy_(e);
    return;
  }
  // Quantized as LoCo keeps its error buffers; the next step adds what this rounds away to
  // nothing, so the storage's own error (at most 1/254 of the block's largest residual, itself
  // at most half a gradient quantization step) is lost once, not fed back.
  const Quantized q = blockwise_quantize(e, 8, block_);
  codes_[i].copy_(q.codes);
  scales_[i].copy_(q.scales);
}

Quantized ErrorFeedback::compress_rows(size_t i, const at::Tensor& g, int64_t rows) {
  check_buffer(i, g);
  TORCH_CHECK(rows > 0 && g.numel() % rows == 0, "zero: ErrorFeedback::compress_rows: ", g.numel(),
              " elements are not ", rows, " equal rows");
  const int64_t n = g.numel() / rows;
  const at::Tensor r = host_home_ ? staged(i) : residual(i);
  const at::Tensor corrected = g.reshape({rows, n}).to(at::kFloat).add(r.view({rows, n}));
  Quantized q = blockwise_quantize_rows(corrected, bits_, block_);
  if (store_ == at::kFloat && !host_home_) {
    // In place: no second residual-sized temporary.
    at::Tensor rv = values_[i].view({rows, n});
    at::sub_out(rv, corrected, blockwise_dequantize_rows(q, rows, n));
    values_[i].nan_to_num_(0.0, 0.0, 0.0);
  } else {
    at::Tensor e = corrected.sub(blockwise_dequantize_rows(q, rows, n));
    e.nan_to_num_(0.0, 0.0, 0.0);
    keep(i, e.view({-1}));
  }
  return q;
}

void ErrorFeedback::check_buffer(size_t i, const at::Tensor& g) const {
  if (i >= numels_.size()) {
    throw std::invalid_argument("zero: ErrorFeedback::compress: buffer " + std::to_string(i) +
                                " does not exist; there are " + std::to_string(numels_.size()));
  }
  if (g.numel() != numels_[i]) {
    throw std::invalid_argument("zero: ErrorFeedback::compress: buffer " + std::to_string(i) +
                                " has " + std::to_string(numels_[i]) + " elements, gradient has " +
                                std::to_string(g.numel()));
  }
}

Quantized ErrorFeedback::compress(size_t i, const at::Tensor& g) {
  check_buffer(i, g);
  const at::Tensor corrected = g.to(at::kFloat).add(host_home_ ? staged(i) : residual(i));
  Quantized q = blockwise_quantize(corrected, bits_, block_);
  if (store_ == at::kFloat && !host_home_) {
    at::sub_out(values_[i], corrected, blockwise_dequantize(q));
  } else {
    keep(i, corrected.sub(blockwise_dequantize(q)));
  }
  return q;
}

void ErrorFeedback::reset() {
  settle_all();  // host residence: a queued download must not land after the zeroing
  for (at::Tensor& r : values_) r.zero_();
  for (at::Tensor& c : codes_) c.zero_();
  for (at::Tensor& s : scales_) s.zero_();
}

int64_t ErrorFeedback::bytes() const {
  int64_t total = 0;
  for (const at::Tensor& r : values_) total += r.nbytes();
  for (const at::Tensor& c : codes_) total += c.nbytes();
  for (const at::Tensor& s : scales_) total += s.nbytes();
  return total;
}

ErrorFeedback::State ErrorFeedback::state() const {
  settle_all();
  State s{bits_, block_, {}};
  for (size_t i = 0; i < numels_.size(); ++i) {
    s.residuals.push_back(store_ == at::kChar ? residual(i) : values_[i].clone());
  }
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
  if (s.residuals.size() != numels_.size()) {
    throw std::invalid_argument("zero: error-feedback state holds " +
                                std::to_string(s.residuals.size()) + " buffers, this run has " +
                                std::to_string(numels_.size()));
  }
  for (size_t i = 0; i < numels_.size(); ++i) {
    if (s.residuals[i].numel() != numels_[i]) {
      throw std::invalid_argument(
          "zero: error-feedback state buffer " + std::to_string(i) + " has " +
          std::to_string(s.residuals[i].numel()) + " elements, this run's has " +
          std::to_string(numels_[i]) + " (another world size or model?)");
    }
  }
  // Any stored dtype converts: a checkpoint of an fp32-residual run resumes under bf16 or int8
  // residuals (rounded once) and the other way round.
  for (size_t i = 0; i < numels_.size(); ++i) {
    const at::Tensor r = s.residuals[i].view({-1}).to(values_.empty() ? codes_[i].device()
                                                                      : values_[i].device());
    keep(i, r.to(at::kFloat));
  }
}

}  // namespace zero::compress
