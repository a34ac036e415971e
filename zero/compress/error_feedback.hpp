// Error feedback for compressed gradients (as in 1-bit Adam and ZeRO++'s qgZ/LoCo): each rank
// keeps, per flat gradient buffer it sends, the residual that quantization dropped and adds it to
// the next step's gradient before quantizing again. The quantization error then does not
// accumulate: after T steps, sum of what was sent + the residual == sum of the gradients (up to
// the rounding of the residual's own storage).
//
// The residual covers every element this rank sends, not only its shard: the error of the chunk
// a peer receives is known only here, where it was quantized (1-bit Adam's worker_error is the
// whole buffer too, its server_error the rank's 1/N; LoCo keeps a whole-gradient intra-node
// buffer and a 1/local_world inter-node one). What can shrink is its storage (`store`): fp32,
// the gradients' own 16-bit dtype (the values are at most half a quantization step, far inside
// bf16/fp16's range and precision needs), or int8 codes with one fp32 scale per `block`
// elements, as DeepSpeed's LoCo keeps it (≈1 byte per element).
//
// Or where it lives (Residence::kHost, what ZeRO stage 3 uses on an accelerator): a whole-model
// residual per GPU would give back the 16/N bytes per parameter stage 3 exists for (review
// 2026-12-07a M2), and no shard-sized residual can replace it (each peer's chunk's error is only
// here). So the residuals stay in page-locked host memory and each reduction stages only its own
// slot to the device: an upload before quantizing and a download of the new residual after, both
// queued on the current stream (no host wait); the device holds one slot's residual while that
// reduction quantizes. The price is 2 x the residual's bytes over the host link per step.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "zero/compress/quantize.hpp"

namespace c10 {
class Event;
}

namespace zero::compress {

// Where the residuals are kept between reductions (see above). kHost on a CPU device is kDevice.
enum class Residence { kDevice, kHost };

// Bytes of one residual of `numel` elements stored as `store` (kFloat, kBFloat16, kHalf, or kChar
// for int8 codes plus one fp32 scale per `block`): what ErrorFeedback allocates, for planners.
int64_t residual_bytes(int64_t numel, at::ScalarType store, int64_t block);
// zero_quantized_gradients_error_feedback_dtype -> the storage: "auto" gives `grad_dtype`
// (the dtype the gradients travel in), "fp32", "bf16", "fp16", "int8". Throws
// std::invalid_argument naming the key for anything else.
at::ScalarType residual_store(const std::string& name, at::ScalarType grad_dtype);

class ErrorFeedback {
 public:
  // What a checkpoint carries: the settings (checked on load) and one residual per buffer
  // (floating point: the stored dtype, fp32 for int8 storage; load_state converts).
  struct State {
    int bits = 8;
    int64_t block = 0;
    std::vector<at::Tensor> residuals;
  };

  // One zeroed residual of numels[i] elements per buffer i, stored as `store` (see
  // residual_bytes), for gradients on `options`' device; kept there, or in page-locked host
  // memory under Residence::kHost.
  ErrorFeedback(std::vector<int64_t> numels, int bits, int64_t block,
                const at::TensorOptions& options, at::ScalarType store = at::kFloat,
                Residence where = Residence::kDevice);
  ~ErrorFeedback();

  // Quantizes g + residual[i] and keeps residual[i] = (g + residual[i]) - dequantize(result).
  // g: 1-D floating of numels[i] elements.
  Quantized compress(size_t i, const at::Tensor& g);
  // The same for g viewed as [rows, numels[i] / rows], quantized row by row
  // (blockwise_quantize_rows): the compressed reduce-scatter's layout. Non-finite residual
  // elements (a gradient that overflowed under fp16 loss scaling, whose step is skipped) become
  // 0, so one overflow does not poison every later step.
  Quantized compress_rows(size_t i, const at::Tensor& g, int64_t rows);

  // Zeroes every residual: after a step the loss scaler skipped for overflow, whose non-finite
  // gradient left non-finite residuals.
  void reset();

  // Residual i as fp32 values (a copy unless stored in fp32), where it is kept (host memory
  // under Residence::kHost, after its last download finished).
  at::Tensor residual(size_t i) const;
  size_t buffers() const { return numels_.size(); }
  int bits() const { return bits_; }
  int64_t block() const { return block_; }
  at::ScalarType store() const { return store_; }
  // Bytes held by the residuals, for the memory report.
  int64_t bytes() const;
  // True when they are held in host memory (Residence::kHost on a device), not on the device.
  bool on_host() const { return host_home_; }

  // A copy of the residuals (the caller may write them out while training goes on).
  State state() const;
  // Copies `s` in, converted to this storage; throws std::invalid_argument naming the mismatch
  // (bits, block, buffer count or a buffer's size) since a residual for another layout cannot be
  // reused.
  void load_state(const State& s);

 private:
  void check_buffer(size_t i, const at::Tensor& g) const;
  // Keeps e (fp32, numels_[i] elements) as residual i.
  void keep(size_t i, const at::Tensor& e);
  // Host residence: residual i as fp32 on the compute device, uploaded after its last download.
  at::Tensor staged(size_t i);
  // Host residence: queues e's download into residual i (stored form, on the compute device).
  void download(size_t i, const at::Tensor& e);
  // Host residence: waits until residual i's (or every) download has finished.
  void settle(size_t i) const;
  void settle_all() const;

  int bits_;
  int64_t block_;
  at::ScalarType store_;
  std::vector<int64_t> numels_;
  std::vector<at::Tensor> values_;  // floating storage
  std::vector<at::Tensor> codes_;   // int8 storage: padded to whole blocks
  std::vector<at::Tensor> scales_;  // int8 storage: fp32, one per block
  bool host_home_ = false;
  c10::Device compute_ = c10::Device(c10::kCPU);
  // Host residence: per buffer, the event after its last download (null: none yet).
  std::vector<std::unique_ptr<c10::Event>> landed_;
};

}  // namespace zero::compress
