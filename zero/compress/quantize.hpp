// Symmetric blockwise quantization, the layout of DeepSpeed's ZeRO++ qgZ quantizer: the flat fp32
// input is cut into blocks of `block` elements (the last one zero-padded), each block gets one
// fp32 scale = absmax / (2^(bits-1) - 1) and its elements become integer codes
// round(x / scale) in [-(2^(bits-1) - 1), 2^(bits-1) - 1]. int8 codes take one byte each; int4
// codes are packed two per byte (element 2i in the low nibble, 2i+1 in the high one, both two's
// complement). Dequantizing gives code * scale, so each element is off by at most scale / 2.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>

namespace zero::compress {

// What travels on the wire for one flat tensor.
struct Quantized {
  at::Tensor codes;   // int8: padded_numel bytes (bits 8) or padded_numel / 2 (bits 4)
  at::Tensor scales;  // fp32, one per block
  int64_t numel = 0;  // elements before padding
  int bits = 8;
  int64_t block = 0;
};

// Throws std::invalid_argument naming `what`, the bad value and the fix unless bits is 8 or 4 and
// block is positive (and even for 4 bits, so a block's codes fill whole bytes).
void check_quantize_params(int bits, int64_t block, const std::string& what);

// Number of blocks covering `numel` elements.
int64_t num_blocks(int64_t numel, int64_t block);

// x: a 1-D fp32 tensor on any device. A block of zeros gets scale 0 and codes 0. A non-finite value
// makes its block's scale non-finite, so the dequantized block is non-finite too and an overflow
// check after the reduction still sees it.
Quantized blockwise_quantize(const at::Tensor& x, int bits, int64_t block);

// The fp32 tensor of q.numel elements that q encodes (padding dropped).
at::Tensor blockwise_dequantize(const Quantized& q);

// x: [rows, n] fp32, one row per destination rank. Each row is zero-padded to whole blocks
// (padded_row(n, block) elements) and quantized on its own, so row r's codes and scales are
// contiguous slices of the result: what rank r receives in a compressed reduce-scatter. The
// result encodes rows * padded_row elements.
Quantized blockwise_quantize_rows(const at::Tensor& x, int bits, int64_t block);
// The [rows, n] fp32 tensor that blockwise_quantize_rows encoded into q.
at::Tensor blockwise_dequantize_rows(const Quantized& q, int64_t rows, int64_t n);
// Elements of one row padded to whole blocks.
int64_t padded_row(int64_t n, int64_t block);

// Bytes of q.codes plus q.scales for a tensor of `numel` elements: what one rank sends.
int64_t wire_bytes(int64_t numel, int bits, int64_t block);

// int4 packing, exposed for its test: codes (int8 in [-8, 7], even length) -> n / 2 bytes and back.
at::Tensor pack_int4(const at::Tensor& codes);
at::Tensor unpack_int4(const at::Tensor& packed);

}  // namespace zero::compress
