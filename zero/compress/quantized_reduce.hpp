// Compressed reduce-scatter of a gradient bucket, after ZeRO++'s qgZ
// (deepspeed/runtime/comm/coalesced_collectives.py, all_to_all_quant_reduce): the bucket
// (world x S elements, chunk r being rank r's shard) is quantized row by row, blockwise with one
// fp32 scale per block (int8, or int4 packed two per byte), and exchanged with one all-to-all, so
// each rank receives only its own shard's blocks from every rank; it dequantizes them and sums
// them in fp32. Error feedback (optional): each rank keeps, per reduction slot, the residual of
// what it sent and adds it to the next step's gradient before quantizing, as DeepSpeed's LoCo
// variant (all_to_all_loco_quant_reduce, its error buffers) and 1-bit Adam do; plain qgZ sends
// int4 without it. The residual spans the whole bucket (every peer's chunk: the error is known
// only where it was made), so its storage dtype is what sets its cost: 4, 2 or ~1 byte per
// gradient element per rank (Settings::feedback_store).
//
// Hierarchical (qgZ's layout, when the group spans several nodes with several ranks on each,
// node_layout.hpp): a first all-to-all within the node hands local rank l the rows of every dp
// rank that is local rank l of its node (one per node), summed over the node's ranks in fp32;
// that partial sum is quantized again and a second all-to-all across nodes, among the ranks
// with the same local index, hands each rank its own row from every node, summed in fp32. Per
// rank, the slow link then carries (nodes-1)/nodes of 1/per_node of the bucket instead of
// (world-per_node)/world of all of it: per_node times fewer bytes across nodes, for a second
// quantization (two errors instead of one) and bytes over the fast link within the node. Error
// feedback then keeps a second residual per slot, of the re-quantized partial sums (as
// DeepSpeed's LoCo keeps an intra- and an inter-node error buffer), so the sum over steps stays
// exact. `zero_quantized_gradients_hierarchical: false` forces the flat exchange.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "comm/group.hpp"
#include "zero/compress/error_feedback.hpp"
#include "zero/compress/node_layout.hpp"

namespace zero::compress {

// zero_optimization.zero_quantized_gradients and its companions (README, config table).
struct Settings {
  bool enabled = false;
  int bits = 8;                // zero_quantized_gradients_bits: 8 or 4
  int64_t block = 2048;        // zero_quantized_gradients_block: elements per fp32 scale
  bool error_feedback = true;  // zero_quantized_gradients_error_feedback
  // zero_quantized_gradients_hierarchical: two stages when the nodes allow (two_level()).
  bool hierarchical = true;
  // zero_quantized_gradients_error_feedback_dtype, resolved (residual_store): how the residuals
  // are kept between steps (error_feedback.hpp).
  at::ScalarType feedback_store = at::kFloat;
  // Where the residuals live between steps: on the gradients' device, or in host memory with
  // each reduction's slot staged (ZeRO stage 3 on an accelerator, error_feedback.hpp).
  Residence feedback_residence = Residence::kDevice;
  // Residence::kHost: host bytes this rank allocates after the residuals (optimizer offload's
  // states, host gradient shard and landing ring), which the host-memory check counts too, and
  // what they are, for its error (host_room.hpp).
  int64_t host_later = 0;
  std::string host_later_what;
  // The mesh's other groups (tensor, pipeline: Groups::norm, in order) that a verdict on the
  // residuals is passed over after the data-parallel group's agreement, so that a refusal or a
  // failed allocation in one dp group fails every rank of the mesh with the same text, and the
  // host-room check is a mesh-wide barrier before any rank allocates (review 2026-12-07d M1).
  std::vector<std::shared_ptr<comm::Group>> agree_also;
};

// Bytes one rank hands the all-to-all for a reduce-scatter of world x n elements: each of the
// `world` rows padded to whole blocks, its codes and its scales.
int64_t all_to_all_bytes(int64_t n, int world, int bits, int64_t block);

// Bytes one rank sends per reduce-scatter of world x n elements (the all-to-all keeps its own
// row): flat, (world-1) rows; hierarchical, (per_node-1) x nodes rows within the node and
// (nodes-1) rows across nodes. `across` is the part that leaves the node.
struct SentBytes {
  int64_t within = 0, across = 0;
  int64_t total() const { return within + across; }
};
// Flat exchange over `node_of` (empty: one node).
SentBytes flat_sent_bytes(int64_t n, const std::vector<int>& node_of, int bits, int64_t block);
SentBytes hierarchical_sent_bytes(int64_t n, int nodes, int per_node, int bits, int64_t block);

class QuantizedReduceScatter {
 public:
  // `slots`: the input elements (world x shard part) of each reduction the caller will run, one
  // error-feedback residual each (s.feedback_store, on `device`), when s.error_feedback
  // (hierarchical: two, the second of nodes x shard part). `node_of`: the node of each rank of
  // `group` (empty: one node); with s.hierarchical and a two-level layout, the constructor
  // splits `group` into the node's group and the group across nodes (a collective: every rank
  // constructs it together). Residence::kHost on a device: before allocating, every rank checks
  // that its node can page-lock the residuals of its ranks (host_room.hpp) and the ranks agree
  // (comm::Agreement), so that when one cannot, every rank throws std::runtime_error naming the
  // keys to change, and none goes on to wait for it. On a device the allocation itself is agreed
  // on too: a rank whose page-locked or device allocation fails makes every rank throw the same
  // error, naming it, the bytes and the keys (review 2026-12-07c L2). Every rank of `group`,
  // and with s.agree_also every rank of those groups too (the tensor-parallel groups: the whole
  // mesh, review 2026-12-07d M1).
  QuantizedReduceScatter(comm::Group& group, const Settings& s, const std::vector<int64_t>& slots,
                         const at::Device& device, const std::vector<int>& node_of = {});

  // `in`: world x out.numel() elements (any floating dtype) of reduction `slot`; returns a Work
  // whose wait() leaves in `out` the sum over ranks of their dequantized chunk of this rank
  // (summed in fp32, then stored in out's dtype). `in` may be reused as soon as this returned.
  comm::Work reduce_scatter(size_t slot, at::Tensor out, const at::Tensor& in,
                            const std::string& what);

  const Settings& settings() const { return settings_; }
  // The two-stage layout in use, or nullopt for the flat exchange.
  const std::optional<TwoLevel>& two_level() const { return two_level_; }
  // The residuals (null without error feedback), for checkpoints.
  ErrorFeedback* feedback() { return feedback_.get(); }
  // Bytes held between steps: the residuals and their staging buffers (the all-to-all buffers
  // are per call).
  int64_t bytes() const { return feedback_ ? feedback_->bytes() + feedback_->device_bytes() : 0; }

 private:
  comm::Work flat(size_t slot, at::Tensor out, const at::Tensor& in, const std::string& what);
  comm::Work hierarchical(size_t slot, at::Tensor out, const at::Tensor& in,
                          const std::string& what);

  comm::Group& group_;
  Settings settings_;
  std::unique_ptr<ErrorFeedback> feedback_;
  size_t slots_ = 0;  // stage-2 residual of slot i: feedback_ buffer slots_ + i
  std::optional<TwoLevel> two_level_;
  std::shared_ptr<comm::Group> intra_, inter_;  // hierarchical only
  at::Tensor order_;  // hierarchical: row k of the permuted bucket is dp rank order_[k]
};

}  // namespace zero::compress
