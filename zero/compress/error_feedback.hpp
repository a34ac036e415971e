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
// here). So the residuals stay in page-locked host memory, the whole gradient's worth per rank
// (7B parameters: 28 GB in fp32, 14 GB in bf16, ~7 GB as int8, per rank; QuantizedReduceScatter
// refuses before allocating when the node cannot hold them). Each reduction stages only its own
// slot on the device, in one of two reusable staging buffers of the largest slot (in the stored
// dtype): the upload, and the download of the new residual after the quantize, run on a side
// copy stream (device/copy_engine.hpp) joined to the compute stream by events, never by a host
// wait; and the upload of the slot that followed this one last time is queued at once into the
// other buffer, so it overlaps this slot's quantize. The residual is upcast inside the
// corrected gradient's own fp32 sum, not through an fp32 copy of the slot (review 07b L3). The
// price is 2 x the residual's bytes over the host link per step, and the two staging buffers on
// the device (staging_bytes).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "device/copy_engine.hpp"
#include "zero/compress/quantize.hpp"

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
// The config's name of a storage: "fp32", "bf16", "fp16" or "int8".
std::string residual_store_name(at::ScalarType store);
// Residence::kHost on a device: the device bytes of the two staging buffers for residuals of
// these sizes (each as large as the largest, in the stored form), what ErrorFeedback adds there.
int64_t staging_bytes(const std::vector<int64_t>& numels, at::ScalarType store, int64_t block);

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
  // Residence::kHost on a device: the bytes of the two staging buffers on the device (else 0).
  int64_t device_bytes() const;
  // What the two above should be from the sizes and the storage alone (residual_bytes,
  // staging_bytes): the memory report's prediction.
  int64_t planned_bytes() const;
  int64_t planned_device_bytes() const;
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
  // Keeps e (fp32, numels_[i] elements, in the residuals' own memory) as residual i.
  void keep(size_t i, const at::Tensor& e);
  // Host residence: compress / compress_rows (rows 0: flat) through a staging buffer.
  Quantized compress_staged(size_t i, const at::Tensor& g, int64_t rows);
  // Host residence: the staging buffer holding residual i with the current stream ordered after
  // its upload; then queues the upload of the slot predicted next into the other buffer.
  int stage_in(size_t i);
  // Host residence: queues residual i's upload into staging buffer k on the copy stream.
  void upload(int k, size_t i);
  // Host residence: waits until residual i's (or every) download has finished.
  void settle(size_t i) const;
  void settle_all() const;
  // Host residence: before the host writes a residual (reset, load_state), waits for the
  // uploads reading them and forgets what the staging buffers hold.
  void drop_staged();

  int bits_;
  int64_t block_;
  at::ScalarType store_;
  std::vector<int64_t> numels_;
  std::vector<at::Tensor> values_;  // floating storage
  std::vector<at::Tensor> codes_;   // int8 storage: padded to whole blocks
  std::vector<at::Tensor> scales_;  // int8 storage: fp32, one per block
  bool host_home_ = false;
  c10::Device compute_ = c10::Device(c10::kCPU);

  // Host residence only.
  struct Staging {
    at::Tensor values, codes, scales;  // the stored form, as large as the largest residual
    int64_t slot = -1;                 // the residual uploaded into it, -1: none
    device::Ticket uploaded;           // fires when that upload is done
  };
  std::unique_ptr<device::CopyEngine> copies_;
  Staging staging_[2];
  int last_ = 1;                        // the staging buffer the last reduction used
  std::vector<device::Ticket> landed_;  // per buffer: its last download (null: none yet)
  // Per buffer: the one compressed after it last time (-1: not seen), the upload to queue ahead.
  std::vector<int64_t> next_;
  int64_t previous_ = -1;
};

}  // namespace zero::compress
