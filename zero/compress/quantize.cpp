#include "zero/compress/quantize.hpp"

#include <ATen/ATen.h>

#include <stdexcept>

namespace zero::compress {
namespace {

int64_t max_code(int bits) { return (int64_t{1} << (bits - 1)) - 1; }

}  // namespace

void check_quantize_params(int bits, int64_t block, const std::string& what) {
  if (bits != 8 && bits != 4) {
    throw std::invalid_argument("zero: " + what + ": bits = " + std::to_string(bits) +
                                " is not supported; use 8 (int8) or 4 (int4)");
  }
  if (block <= 0) {
    throw std::invalid_argument("zero: " + what + ": block = " + std::to_string(block) +
                                " must be a positive number of elements per scale (e.g. 2048)");
  }
  if (bits == 4 && block % 2 != 0) {
    throw std::invalid_argument("zero: " + what + ": block = " + std::to_string(block) +
                                " is odd but int4 packs two codes per byte; use an even block (" +
                                std::to_string(block + 1) + ")");
  }
}

int64_t num_blocks(int64_t numel, int64_t block) { return (numel + block - 1) / block; }

int64_t wire_bytes(int64_t numel, int bits, int64_t block) {
  check_quantize_params(bits, block, "wire_bytes");
  const int64_t blocks = num_blocks(numel, block);
  return blocks * block * bits / 8 + blocks * static_cast<int64_t>(sizeof(float));
}

at::Tensor pack_int4(const at::Tensor& codes) {
  TORCH_CHECK(codes.scalar_type() == at::kChar && codes.dim() == 1 && codes.numel() % 2 == 0,
              "zero: pack_int4 needs a 1-D int8 tensor of even length, got ", codes.scalar_type(),
              " of shape ", codes.sizes());
  // Through uint8 so the shift and mask act on the two's complement bits, not on signed values.
  const at::Tensor u = codes.contiguous().view(at::kByte).view({-1, 2});
  const at::Tensor low = u.select(1, 0).bitwise_and(0x0F);
  const at::Tensor high = u.select(1, 1).bitwise_and(0x0F).bitwise_left_shift(4);
  return low.bitwise_or(high).view(at::kChar);
}

at::Tensor unpack_int4(const at::Tensor& packed) {
  TORCH_CHECK(packed.scalar_type() == at::kChar && packed.dim() == 1,
              "zero: unpack_int4 needs a 1-D int8 tensor, got ", packed.scalar_type(), " of shape ",
              packed.sizes());
  const at::Tensor u = packed.contiguous().view(at::kByte);
  // Sign-extend a nibble n: (n ^ 8) - 8 maps 0..7 to 0..7 and 8..15 to -8..-1.
  auto extend = [](const at::Tensor& nibble) {
    return nibble.to(at::kShort).bitwise_xor(8).sub(8).to(at::kChar);
  };
  const at::Tensor low = extend(u.bitwise_and(0x0F));
  const at::Tensor high = extend(u.bitwise_right_shift(4));
  return at::stack({low, high}, 1).view({-1});
}

Quantized blockwise_quantize(const at::Tensor& x, int bits, int64_t block) {
  check_quantize_params(bits, block, "blockwise_quantize");
  if (x.scalar_type() != at::kFloat || x.dim() != 1) {
    throw std::invalid_argument(
        "zero: blockwise_quantize needs a 1-D fp32 tensor (a flat gradient buffer), got " +
        std::string(c10::toString(x.scalar_type())) + " with " + std::to_string(x.dim()) +
        " dimensions; flatten it and convert with .to(at::kFloat)");
  }
  const int64_t numel = x.numel();
  const int64_t blocks = num_blocks(numel, block);
  at::Tensor padded = x.contiguous();  // a strided view (every other element) is fine too
  if (blocks * block != numel) {
    padded = at::zeros({blocks * block}, x.options());
    padded.narrow(0, 0, numel).copy_(x);
  }
  const at::Tensor view = padded.view({blocks, block});
  const double qmax = static_cast<double>(max_code(bits));
  at::Tensor scales = view.abs().amax(1).div_(qmax);
  // A zero block keeps scale 0 and codes 0; dividing by 1 there avoids 0/0.
  const at::Tensor divisor = at::where(scales > 0, scales, at::ones_like(scales)).unsqueeze(1);
  // nan_to_num: a non-finite block's codes are meaningless (its scale carries the overflow), and
  // casting NaN to int8 is undefined.
  at::Tensor codes = view.div(divisor).round_().nan_to_num_(0.0, 0.0, 0.0).clamp_(-qmax, qmax);
  codes = codes.to(at::kChar).view({-1});
  if (bits == 4) codes = pack_int4(codes);
  return Quantized{codes, scales, numel, bits, block};
}

at::Tensor blockwise_dequantize(const Quantized& q) {
  check_quantize_params(q.bits, q.block, "blockwise_dequantize");
  const int64_t blocks = num_blocks(q.numel, q.block);
  const int64_t code_bytes = blocks * q.block * q.bits / 8;
  TORCH_CHECK(q.codes.numel() == code_bytes && q.scales.numel() == blocks,
              "zero: blockwise_dequantize: ", q.numel, " elements in blocks of ", q.block, " at ",
              q.bits, " bits need ", code_bytes, " code bytes and ", blocks, " scales, got ",
              q.codes.numel(), " and ", q.scales.numel());
  const at::Tensor codes = q.bits == 4 ? unpack_int4(q.codes) : q.codes;
  const at::Tensor out =
      codes.to(at::kFloat).view({blocks, q.block}).mul_(q.scales.to(at::kFloat).unsqueeze(1));
  return out.view({-1}).narrow(0, 0, q.numel);
}

int64_t padded_row(int64_t n, int64_t block) { return num_blocks(n, block) * block; }

Quantized blockwise_quantize_rows(const at::Tensor& x, int bits, int64_t block) {
  check_quantize_params(bits, block, "blockwise_quantize_rows");
  TORCH_CHECK(x.dim() == 2, "zero: blockwise_quantize_rows needs [rows, n], got ", x.sizes());
  const int64_t rows = x.size(0), n = x.size(1), np = padded_row(n, block);
  if (np == n) return blockwise_quantize(x.contiguous().view({-1}), bits, block);
  at::Tensor padded = at::zeros({rows, np}, x.options());
  padded.narrow(1, 0, n).copy_(x);
  return blockwise_quantize(padded.view({-1}), bits, block);
}

at::Tensor blockwise_dequantize_rows(const Quantized& q, int64_t rows, int64_t n) {
  const int64_t np = padded_row(n, q.block);
  TORCH_CHECK(q.numel == rows * np, "zero: blockwise_dequantize_rows: ", q.numel,
              " elements do not hold ", rows, " rows of ", n, " padded to ", np);
  return blockwise_dequantize(q).view({rows, np}).narrow(1, 0, n);
}

}  // namespace zero::compress
