#include "zero/compress/quantized_reduce.hpp"

#include <ATen/ATen.h>

#include <utility>

namespace zero::compress {

int64_t all_to_all_bytes(int64_t n, int world, int bits, int64_t block) {
  return world * wire_bytes(padded_row(n, block), bits, block);
}

QuantizedReduceScatter::QuantizedReduceScatter(comm::Group& group, const Settings& s,
                                               const std::vector<int64_t>& slots,
                                               const at::Device& device)
    : group_(group), settings_(s) {
  check_quantize_params(s.bits, s.block, "zero_quantized_gradients");
  if (s.error_feedback) {
    feedback_ =
        std::make_unique<ErrorFeedback>(slots, s.bits, s.block, at::TensorOptions().device(device));
  }
}

comm::Work QuantizedReduceScatter::reduce_scatter(size_t slot, at::Tensor out, const at::Tensor& in,
                                                  const std::string& what) {
  const int64_t world = group_.size(), n = out.numel();
  TORCH_CHECK(in.numel() == world * n, "zero: ", what, ": input has ", in.numel(),
              " elements, expected ", n, " x ", world);
  const int bits = settings_.bits;
  const int64_t block = settings_.block;
  const Quantized q =
      feedback_ ? feedback_->compress_rows(slot, in, world)
                : blockwise_quantize_rows(in.reshape({world, n}).to(at::kFloat), bits, block);
  // One row per destination: its codes, then its scales' bytes, so a single all-to-all carries
  // both (one latency, not two).
  const int64_t np = padded_row(n, block);
  const int64_t code_bytes = np * bits / 8, scale_bytes = num_blocks(np, block) * 4;
  at::Tensor send = at::empty({world, code_bytes + scale_bytes}, q.codes.options());
  send.narrow(1, 0, code_bytes).copy_(q.codes.view({world, code_bytes}));
  send.narrow(1, code_bytes, scale_bytes).copy_(q.scales.view({world, -1}).view(at::kChar));
  at::Tensor recv = at::empty_like(send);
  comm::Work w = group_.all_to_all(recv, send, what + " (" + std::to_string(bits) + "-bit)");
  // The send buffer stays alive until the exchange finished (the lambda holds it).
  return comm::Work(
      [w = std::move(w), send, recv, out, world, n, np, code_bytes, bits, block]() mutable {
        w.wait();
        Quantized got;
        got.codes = recv.narrow(1, 0, code_bytes).contiguous().view({-1});
        got.scales = recv.narrow(1, code_bytes, recv.size(1) - code_bytes)
                         .contiguous()
                         .view(at::kFloat)
                         .view({-1});
        got.numel = world * np;
        got.bits = bits;
        got.block = block;
        out.copy_(blockwise_dequantize_rows(got, world, n).sum(0));
      });
}

}  // namespace zero::compress
