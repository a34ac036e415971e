#include "zero/compress/quantized_reduce.hpp"

#include <ATen/ATen.h>

#include <c10/util/Exception.h>
#include <unistd.h>

#include <algorithm>
#include <functional>
#include <stdexcept>
#include <utility>

#include "comm/agree.hpp"
#include "zero/compress/host_room.hpp"
#include "zero/memory.hpp"

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

// This host's name as a number, so that ranks can count their peers on it with one gather.
int64_t host_id() {
  char name[256] = {};
  if (gethostname(name, sizeof name - 1) != 0) return 0;
  return static_cast<int64_t>(std::hash<std::string>{}(name)&INT64_MAX);
}

std::string without_backtrace(const std::exception& e) {
  if (const auto* c = dynamic_cast<const c10::Error*>(&e)) return c->what_without_backtrace();
  return e.what();
}

// This rank's verdict on its node's room for the page-locked residuals ("" when they fit). Every
// rank runs its gather whatever its environment says, so the collectives pair; and every rank
// reads the host's room before the gather, so before any rank of the node allocates. Nothing
// here throws or allocates on the device (review 2026-12-07d L1): the host ids go through the
// agreement's buffers, and a failed read becomes this rank's verdict, so that a rank that fails
// here still reaches the agreement's errors() with its peers.
std::string host_room_refusal(comm::Agreement& agreement, comm::Group& group,
                              const std::vector<int64_t>& residuals, const Settings& s) {
  HostRoom room;
  int64_t int8 = 0;
  int64_t mine = 0;
  std::string failed;
  try {
    for (int64_t n : residuals) {
      room.per_rank += residual_bytes(n, s.feedback_store, s.block);
      int8 += residual_bytes(n, at::kChar, s.block);
    }
    room.later = s.host_later;
    room.later_what = s.host_later_what;
    room.host = host_memory();
    mine = host_id();
  } catch (const std::exception& e) {
    failed = "reading this host's memory: " + without_backtrace(e);
  }
  const std::vector<int64_t> ids =
      agreement.gather(mine, "the error-feedback host-memory check's host names");
  if (!failed.empty()) return failed;
  try {
    const NodeRanks said = ranks_on_this_node();
    if (said.count > 0) {
      room.local_ranks = said.count;
      room.local_from = said.source;
    } else {
      // Not a silent 1: the ranks of this group that share the host name, which misses only
      // ranks of other groups on the node (tensor or pipeline peers), as the error says.
      room.local_ranks = static_cast<int>(std::count(ids.begin(), ids.end(), mine));
      room.local_from = "ranks of " + group.name() +
                        " on this host: no LOCAL_WORLD_SIZE, OMPI_COMM_WORLD_LOCAL_SIZE or "
                        "SLURM_NTASKS_PER_NODE says more, ranks of other groups here are not "
                        "counted";
    }
    return host_room_error(room, residual_store_name(s.feedback_store), int8);
  } catch (const std::exception& e) {
    return "counting the ranks on this node: " + without_backtrace(e);
  }
}

// The residuals, allocated by every rank or by none. On a device the allocation can fail on one
// rank alone (its host's page cache or pinning limit, its allocator's cache), and a rank that
// threw here alone would leave its peers waiting in their next collective until comm_timeout_s
// (review 2026-12-07c L2): the ranks agree first on the host's room (Residence::kHost), then on
// the allocation, and either all go on or all throw the same error. The agreement's few device
// bytes are taken before, so that a rank whose device is full still takes part in it.
std::unique_ptr<ErrorFeedback> make_feedback(comm::Group& group,
                                             const std::vector<int64_t>& residuals,
                                             const Settings& s, const at::Device& device) {
  const auto make = [&] {
    return std::make_unique<ErrorFeedback>(residuals, s.bits, s.block,
                                           at::TensorOptions().device(device), s.feedback_store,
                                           s.feedback_residence);
  };
  if (device.is_cpu()) return make();
  const bool on_host = s.feedback_residence == Residence::kHost;
  const std::string ranks = " (group " + group.name() + ": ";
  comm::Agreement agreement(group, device);
  // The other groups of the mesh, their buffers taken up front too. A dp group's message ("" =
  // fine) is passed over each in turn: after dp then tp every rank of a dp x tp mesh holds the
  // same text, and one more group per further dimension (review 2026-12-07d M1).
  std::vector<std::unique_ptr<comm::Agreement>> relays;
  for (const auto& g : s.agree_also) {
    relays.push_back(std::make_unique<comm::Agreement>(*g, device));
  }
  const auto over_mesh = [&](std::string message, const std::string& what) {
    for (size_t i = 0; i < relays.size(); ++i) {
      const std::string& by = s.agree_also[i]->name();
      const std::string all = relays[i]->errors(message, what + " over " + by);
      message = all.empty() ? ""
                            : "zero: " + what + " failed in the mesh (by rank of " + by +
                                  ", after each data-parallel group agreed): " + all;
    }
    return message;
  };
  if (on_host) {
    const std::string all = agreement.errors(host_room_refusal(agreement, group, residuals, s),
                                             "the error-feedback host-memory check");
    const std::string message = over_mesh(
        all.empty() ? ""
                    : "zero: the error-feedback residuals of ZeRO stage 3 do not fit in the "
                      "page-locked host memory of every node; no rank allocated them" +
                          ranks + all + ")",
        "the error-feedback host-memory check");
    if (!message.empty()) throw std::runtime_error(message);
  }
  int64_t host = 0;
  for (int64_t n : residuals) host += residual_bytes(n, s.feedback_store, s.block);
  const int64_t staging = on_host ? staging_bytes(residuals, s.feedback_store, s.block) : 0;
  std::unique_ptr<ErrorFeedback> made;
  std::string error;
  try {
    made = make();
  } catch (const std::exception& e) {
    error = on_host ? "allocating " + format_bytes(host) + " of page-locked host memory and " +
                          format_bytes(staging) + " on " + device.str() + " (staging buffers): "
                    : "allocating " + format_bytes(host) + " on " + device.str() + ": ";
    error += without_backtrace(e);
  }
  const std::string all = agreement.errors(error, "the error-feedback allocation");
  std::string message;
  if (!all.empty()) {
    message =
        "zero: the error-feedback residuals (" + residual_store_name(s.feedback_store) +
        ", zero_quantized_gradients_error_feedback_dtype) could not be allocated on every rank; "
        "every rank let go of its own" +
        ranks + all +
        "). Fix: set zero_optimization.zero_quantized_gradients_error_feedback_dtype: int8 (about "
        "1 byte per element), or a smaller zero_optimization.reduce_bucket_size (" +
        (on_host ? "each of the two device staging buffers holds the largest bucket's slot"
                 : "less for the bucket buffers beside the residuals") +
        "), or zero_quantized_gradients_error_feedback: false" +
        (on_host ? ", or free host memory on that node, or fewer ranks per node" : "");
  }
  message = over_mesh(message, "the error-feedback allocation");
  if (message.empty()) return made;
  made.reset();
  throw std::runtime_error(message);
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
  if (s.error_feedback) feedback_ = make_feedback(group, residuals, s, device);
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
