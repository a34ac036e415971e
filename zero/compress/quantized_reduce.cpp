#include "zero/compress/quantized_reduce.hpp"

#include <ATen/ATen.h>

#include <algorithm>
#include <stdexcept>
#include <utility>

#include "zero/compress/host_room.hpp"

namespace zero::compress {

int64_t all_to_all_bytes(int64_t n, int world, int bits, int64_t block) {
  return world * wire_bytes(padded_row(n, block), bits, block);
}

SentBytes flat_sent_bytes(int64_t n, const std::vector<int>& node_of, int bits, int64_t block) {
  const int64_t row = wire_bytes(padded_row(n, block), bits, block);
  SentBytes s;
  // Rank 0's rows to every other rank (every rank's count is the same when nodes are even).
  for (size_t other = 1; other < node_of.size(); ++other)
    (node_of[other] == node_of[0] ? s.within : s.across) += row;
  return s;
}

SentBytes hierarchical_sent_bytes(int64_t n, int nodes, int per_node, int bits, int64_t block) {
  const int64_t row = wire_bytes(padded_row(n, block), bits, block);
  return {int64_t{per_node - 1} * nodes * row, int64_t{nodes - 1} * row};
}

namespace {

// Row r of `q` (rows x padded row, quantized row by row) as one byte row: its codes, then its
// scales' bytes, so a single all-to-all carries both (one latency, not two).
at::Tensor pack_rows(const Quantized& q, int64_t rows, int64_t np, int bits, int64_t block) {
  const int64_t code_bytes = np * bits / 8, scale_bytes = num_blocks(np, block) * 4;
  at::Tensor send = at::empty({rows, code_bytes + scale_bytes}, q.codes.options());
  send.narrow(1, 0, code_bytes).copy_(q.codes.view({rows, code_bytes}));
  send.narrow(1, code_bytes, scale_bytes).copy_(q.scales.view({rows, -1}).view(at::kChar));
  return send;
}

// The [rows, n] fp32 values that pack_rows packed into `recv`.
at::Tensor unpack_rows(const at::Tensor& recv, int64_t rows, int64_t n, int64_t np, int bits,
                       int64_t block) {
  const int64_t code_bytes = np * bits / 8;
  const at::Tensor r = recv.view({rows, -1});
  Quantized got;
  got.codes = r.narrow(1, 0, code_bytes).contiguous().view({-1});
  got.scales =
      r.narrow(1, code_bytes, r.size(1) - code_bytes).contiguous().view(at::kFloat).view({-1});
  got.numel = rows * np;
  got.bits = bits;
  got.block = block;
  return blockwise_dequantize_rows(got, rows, n);
}

// Every rank checks its node's room for the page-locked residuals, then the ranks agree: one
// that cannot allocate must not leave the others waiting in their first collective.
void check_host_room(comm::Group& group, const std::vector<int64_t>& residuals, const Settings& s,
                     const at::Device& device) {
  HostRoom room;
  int64_t int8 = 0;
  for (int64_t n : residuals) {
    room.per_rank += residual_bytes(n, s.feedback_store, s.block);
    int8 += residual_bytes(n, at::kChar, s.block);
  }
  room.local_ranks = std::max(1, local_world_size_from_env());
  room.available = host_available_bytes();
  const std::string mine = host_room_error(room, residual_store_name(s.feedback_store), int8);
  at::Tensor refused =
      at::full({1}, mine.empty() ? 0.0 : 1.0, at::TensorOptions().dtype(at::kFloat).device(device));
  group.all_reduce_sum(refused, "all_reduce of the error-feedback host-memory check").wait();
  const auto count = static_cast<int64_t>(refused.cpu().item<float>());
  if (count == 0) return;
  if (!mine.empty()) throw std::runtime_error(mine);
  throw std::runtime_error(
      "zero: " + std::to_string(count) + " of " + std::to_string(group.size()) + " ranks of " +
      group.name() +
      " cannot page-lock their error-feedback residuals of ZeRO stage 3 (their error says how "
      "much; this rank's node could): set zero_optimization."
      "zero_quantized_gradients_error_feedback_dtype: int8, or "
      "zero_quantized_gradients_error_feedback: false, or zero_optimization.stage: 2");
}

}  // namespace

QuantizedReduceScatter::QuantizedReduceScatter(comm::Group& group, const Settings& s,
                                               const std::vector<int64_t>& slots,
                                               const at::Device& device,
                                               const std::vector<int>& node_of)
    : group_(group), settings_(s), slots_(slots.size()) {
  check_quantize_params(s.bits, s.block, "zero_quantized_gradients");
  TORCH_CHECK(node_of.empty() || static_cast<int>(node_of.size()) == group.size(),
              "zero: quantized reduction: ", node_of.size(), " node entries for a group of ",
              group.size());
  if (s.hierarchical && !node_of.empty()) two_level_ = compress::two_level(node_of);
  std::vector<int64_t> residuals = slots;
  if (two_level_) {
    const int nodes = two_level_->nodes(), per_node = two_level_->per_node();
    int node = 0, local = 0;
    std::vector<int64_t> order;
    // Row l * nodes + k of the permuted bucket goes to local rank l of this node and is the
    // shard of the rank that is local rank l on node k: what qgZ's swizzled quantization lays
    // out, so each destination's rows are contiguous.
    for (int l = 0; l < per_node; ++l) {
      for (int k = 0; k < nodes; ++k) {
        const int r = two_level_->ranks[k][l];
        order.push_back(r);
        if (r == group.rank()) node = k, local = l;
      }
    }
    order_ = at::tensor(order, at::TensorOptions().dtype(at::kLong).device(device));
    const std::string base = group.name();
    intra_ = group.split(node, local, base + "/within node " + std::to_string(node));
    inter_ = group.split(local, node, base + "/across nodes, local rank " + std::to_string(local));
    for (int64_t n : slots) residuals.push_back(n / group.size() * nodes);
  }
  if (s.error_feedback) {
    if (s.feedback_residence == Residence::kHost && !device.is_cpu()) {
      check_host_room(group, residuals, s, device);
    }
    feedback_ = std::make_unique<ErrorFeedback>(residuals, s.bits, s.block,
                                                at::TensorOptions().device(device),
                                                s.feedback_store, s.feedback_residence);
  }
}

comm::Work QuantizedReduceScatter::reduce_scatter(size_t slot, at::Tensor out, const at::Tensor& in,
                                                  const std::string& what) {
  const int64_t world = group_.size(), n = out.numel();
  TORCH_CHECK(in.numel() == world * n, "zero: ", what, ": input has ", in.numel(),
              " elements, expected ", n, " x ", world);
  return two_level_ ? hierarchical(slot, std::move(out), in, what)
                    : flat(slot, std::move(out), in, what);
}

comm::Work QuantizedReduceScatter::flat(size_t slot, at::Tensor out, const at::Tensor& in,
                                        const std::string& what) {
  const int64_t world = group_.size(), n = out.numel();
  const int bits = settings_.bits;
  const int64_t block = settings_.block;
  const Quantized q =
      feedback_ ? feedback_->compress_rows(slot, in, world)
                : blockwise_quantize_rows(in.reshape({world, n}).to(at::kFloat), bits, block);
  const int64_t np = padded_row(n, block);
  at::Tensor send = pack_rows(q, world, np, bits, block);
  at::Tensor recv = at::empty_like(send);
  comm::Work w = group_.all_to_all(recv, send, what + " (" + std::to_string(bits) + "-bit)");
  // The send buffer stays alive until the exchange finished (the lambda holds it).
  return comm::Work([w = std::move(w), send, recv, out, world, n, np, bits, block]() mutable {
    w.wait();
    out.copy_(unpack_rows(recv, world, n, np, bits, block).sum(0));
  });
}

comm::Work QuantizedReduceScatter::hierarchical(size_t slot, at::Tensor out, const at::Tensor& in,
                                                const std::string& what) {
  const int64_t world = group_.size(), n = out.numel();
  const int64_t nodes = two_level_->nodes(), per_node = two_level_->per_node();
  const int bits = settings_.bits;
  const int64_t block = settings_.block;
  const int64_t np = padded_row(n, block);
  const at::Tensor rows = in.reshape({world, n}).index_select(0, order_).to(at::kFloat);
  const Quantized q = feedback_ ? feedback_->compress_rows(slot, rows.view({-1}), world)
                                : blockwise_quantize_rows(rows, bits, block);
  at::Tensor send = pack_rows(q, world, np, bits, block);
  at::Tensor recv = at::empty_like(send);
  const std::string tag = what + " (" + std::to_string(bits) + "-bit, ";
  comm::Work w = intra_->all_to_all(recv, send, tag + "within node)");
  // The exchange across nodes needs the node's sum, so it starts when the caller waits.
  return comm::Work([this, w = std::move(w), send, recv, out, slot, nodes, per_node, n, np, bits,
                     block, tag]() mutable {
    w.wait();
    // From each local peer: `nodes` rows, one per node, all of ranks with this local index.
    const at::Tensor partial =
        unpack_rows(recv, per_node * nodes, n, np, bits, block).view({per_node, nodes, n}).sum(0);
    const Quantized q2 = feedback_
                             ? feedback_->compress_rows(slots_ + slot, partial.view({-1}), nodes)
                             : blockwise_quantize_rows(partial, bits, block);
    at::Tensor send2 = pack_rows(q2, nodes, np, bits, block);
    at::Tensor recv2 = at::empty_like(send2);
    inter_->all_to_all(recv2, send2, tag + "across nodes)").wait();
    out.copy_(unpack_rows(recv2, nodes, n, np, bits, block).sum(0));
  });
}

}  // namespace zero::compress
