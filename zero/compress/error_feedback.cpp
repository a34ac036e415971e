#include "zero/compress/error_feedback.hpp"

#include "device/pinned_host.hpp"

#include <ATen/ATen.h>

#include <algorithm>
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

std::string residual_store_name(at::ScalarType store) {
  return store == at::kFloat      ? "fp32"
         : store == at::kBFloat16 ? "bf16"
         : store == at::kHalf     ? "fp16"
                                  : "int8";
}

int64_t staging_bytes(const std::vector<int64_t>& numels, at::ScalarType store, int64_t block) {
  int64_t largest = 0;
  for (int64_t n : numels) largest = std::max(largest, n);
  return numels.empty() ? 0 : 2 * residual_bytes(largest, store, block);
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
  int64_t largest = 0;
  for (int64_t n : numels_) {
    largest = std::max(largest, n);
    if (store == at::kChar) {
      const int64_t blocks = num_blocks(n, block);
      codes_.push_back(zeros(blocks * block, at::kChar));
      scales_.push_back(zeros(blocks, at::kFloat));
    } else {
      values_.push_back(zeros(n, store));
    }
  }
  if (!host_home_) return;
  copies_ = device::make_copy_engine(compute_);
  landed_.resize(numels_.size());
  next_.assign(numels_.size(), -1);
  // Allocated once, here (counted by device_bytes), not per reduction: the allocator's pool
  // would hold as much, and these never wait for a stream's frees.
  const at::TensorOptions on_device = options.device(compute_);
  for (Staging& s : staging_) {
    if (store == at::kChar) {
      const int64_t blocks = num_blocks(largest, block);
      s.codes = at::empty({blocks * block}, on_device.dtype(at::kChar));
      s.scales = at::empty({blocks}, on_device.dtype(at::kFloat));
    } else {
      s.values = at::empty({largest}, on_device.dtype(store));
    }
  }
}

ErrorFeedback::~ErrorFeedback() {
  // The pinned buffers may still be written by a queued download, or read by an upload.
  try {
    settle_all();
    drop_staged();
  } catch (...) {
  }
}

void ErrorFeedback::upload(int k, size_t i) {
  Staging& s = staging_[k];
  if (store_ != at::kChar) {
    s.uploaded = copies_->copy_to_device(s.values.narrow(0, 0, numels_[i]), values_[i]);
  } else {
    // One copy stream: the scales' ticket fires after the codes' copy too.
    copies_->copy_to_device(s.codes.narrow(0, 0, codes_[i].numel()), codes_[i]);
    s.uploaded = copies_->copy_to_device(s.scales.narrow(0, 0, scales_[i].numel()), scales_[i]);
  }
  s.slot = static_cast<int64_t>(i);
}

int ErrorFeedback::stage_in(size_t i) {
  const auto slot = static_cast<int64_t>(i);
  int k = staging_[0].slot == slot ? 0 : staging_[1].slot == slot ? 1 : -1;
  // Not queued ahead (the first step, or another order than last time): upload it now into the
  // buffer the last reduction did not use. Every copy runs on the one copy stream, in order, so
  // this upload follows any download still queued from either buffer or into this residual.
  if (k < 0) upload(k = 1 - last_, i);
  copies_->wait(staging_[k].uploaded);
  last_ = k;
  if (previous_ >= 0) next_[static_cast<size_t>(previous_)] = slot;
  previous_ = slot;
  // The reductions run in the same order every step (the buckets' order in backward), so the
  // one that followed this slot last time is queued now: its upload overlaps this quantize.
  // copy_to_device orders it after the compute stream's work so far, which includes the last
  // reads of the other buffer.
  const int64_t next = next_[i];
  if (next >= 0 && next != slot && staging_[1 - k].slot != next) {
    upload(1 - k, static_cast<size_t>(next));
  }
  return k;
}

Quantized ErrorFeedback::compress_staged(size_t i, const at::Tensor& g, int64_t rows) {
  Staging& s = staging_[stage_in(i)];
  const int64_t n = numels_[i];
  const at::Tensor flat = g.reshape({-1});
  at::Tensor corrected;
  if (store_ != at::kChar) {
    // The residual is upcast inside the sum (fp32 + its dtype computes in fp32): the same
    // values as adding its fp32 copy, without that copy. `flat` may be the caller's fp32
    // buffer, so it is never written.
    const at::Tensor r = s.values.narrow(0, 0, n);
    corrected = flat.scalar_type() == at::kFloat ? at::add(flat, r) : flat.to(at::kFloat).add_(r);
  } else {
    const Quantized staged{s.codes.narrow(0, 0, codes_[i].numel()),
                           s.scales.narrow(0, 0, scales_[i].numel()), n, 8, block_};
    corrected = flat.to(at::kFloat).add(blockwise_dequantize(staged));
  }
  // Rows: [rows, n / rows], the reduce-scatter's layout (the dequantized rows are a view of
  // their padded blocks, so everything stays 2-D rather than copied flat).
  const int64_t m = rows > 0 ? n / rows : n;
  if (rows > 0) corrected = corrected.view({rows, m});
  Quantized q = rows > 0 ? blockwise_quantize_rows(corrected, bits_, block_)
                         : blockwise_quantize(corrected, bits_, block_);
  at::Tensor sent = rows > 0 ? blockwise_dequantize_rows(q, rows, m) : blockwise_dequantize(q);
  // The new residual goes into the staging buffer the old one came from (the compute stream
  // read it above), and from there to the host on the copy stream, after these kernels.
  if (store_ != at::kChar) {
    const at::Tensor out = s.values.narrow(0, 0, n);
    at::Tensor shaped = rows > 0 ? out.view({rows, m}) : out;
    at::sub_out(shaped, corrected, sent);  // computed in fp32, rounded once to the stored dtype
    if (rows > 0) shaped.nan_to_num_(0.0, 0.0, 0.0);
    landed_[i] = copies_->copy_into_host(values_[i], out);
  } else {
    at::Tensor e = corrected.sub(sent);
    corrected.reset();  // not held through the residual's own quantization
    sent.reset();
    if (rows > 0) e.nan_to_num_(0.0, 0.0, 0.0);
    // Kept as int8 codes, as keep() does on the host (see there).
    const Quantized kept = blockwise_quantize(e.view({-1}), 8, block_);
    at::Tensor codes = s.codes.narrow(0, 0, codes_[i].numel());
    at::Tensor scales = s.scales.narrow(0, 0, scales_[i].numel());
    codes.copy_(kept.codes);
    scales.copy_(kept.scales);
    copies_->copy_into_host(codes_[i], codes);
    landed_[i] = copies_->copy_into_host(scales_[i], scales);
  }
  s.slot = -1;  // it now holds the download's source, not a residual to reuse
  return q;
}

void ErrorFeedback::settle(size_t i) const {
  if (host_home_ && landed_.at(i)) copies_->synchronize(landed_[i]);
}

void ErrorFeedback::settle_all() const {
  for (size_t i = 0; i < landed_.size(); ++i) settle(i);
}

void ErrorFeedback::drop_staged() {
  if (!host_home_) return;
  for (Staging& s : staging_) {
    copies_->synchronize(s.uploaded);
    s.slot = -1;
  }
}

at::Tensor ErrorFeedback::residual(size_t i) const {
  settle(i);
  if (store_ != at::kChar) return values_.at(i).to(at::kFloat);
  Quantized q{codes_.at(i), scales_.at(i), numels_.at(i), 8, block_};
  return blockwise_dequantize(q);
}

void ErrorFeedback::keep(size_t i, const at::Tensor& e) {
  // A host write (load_state) after a queued download, or while an upload reads it.
  settle(i);
  drop_staged();
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
  if (host_home_) return compress_staged(i, g, rows);
  const int64_t n = g.numel() / rows;
  const at::Tensor r = residual(i);
  const at::Tensor corrected = g.reshape({rows, n}).to(at::kFloat).add(r.view({rows, n}));
  Quantized q = blockwise_quantize_rows(corrected, bits_, block_);
  if (store_ == at::kFloat) {
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
  if (host_home_) return compress_staged(i, g, 0);
  const at::Tensor corrected = g.to(at::kFloat).add(residual(i));
  Quantized q = blockwise_quantize(corrected, bits_, block_);
  if (store_ == at::kFloat) {
    at::sub_out(values_[i], corrected, blockwise_dequantize(q));
  } else {
    keep(i, corrected.sub(blockwise_dequantize(q)));
  }
  return q;
}

void ErrorFeedback::reset() {
  // Host residence: a queued download must not land after the zeroing, and an upload queued
  // ahead holds the old values.
  settle_all();
  drop_staged();
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

int64_t ErrorFeedback::device_bytes() const {
  int64_t total = 0;
  for (const Staging& s : staging_) {
    for (const at::Tensor* t : {&s.values, &s.codes, &s.scales}) {
      if (t->defined()) total += static_cast<int64_t>(t->nbytes());
    }
  }
  return total;
}

int64_t ErrorFeedback::planned_bytes() const {
  int64_t total = 0;
  for (int64_t n : numels_) total += residual_bytes(n, store_, block_);
  return total;
}

int64_t ErrorFeedback::planned_device_bytes() const {
  return host_home_ ? staging_bytes(numels_, store_, block_) : 0;
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
