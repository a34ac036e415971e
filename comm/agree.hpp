// Rank-local failures made collective. A check that fails on some ranks of a group only (a bad
// batch, a model on the wrong GPU) must not throw there alone: the other ranks would enter their
// next collective and wait for the failed rank until comm_timeout_s, when the NCCL watchdog
// aborts them with a message that names no cause. Every rank calls these at the same point
// instead, and either every rank goes on or every rank throws the same text (as ckpt::agree does
// for checkpoints; DeepSpeed's and Megatron's checks are rank-local).
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <cstdint>
#include <string>
#include <vector>

namespace zero::comm {

class Group;

// Each rank's `status` (a 1-D int64 tensor of the same length k on every rank, on a device the
// group moves: the bound GPU under NCCL) gathered onto the host, [size, k]: one all_gather and
// one host read. Callers put their verdict and what explains it there, so every rank decides
// alike from the same figures.
at::Tensor gather_status(Group& g, const at::Tensor& status, const std::string& what);

// Rank `root`'s `text` on every rank: its length, then its bytes, broadcast on `device`.
std::string broadcast_text(Group& g, const std::string& text, int root, const c10::Device& device,
                           const std::string& what);

// The device buffers an agreement on errors moves through, taken up front: made before the work
// whose failure it reports, it lets a rank whose device ran out of memory in that work still take
// part. An agreement that allocated the failing rank's text on its device when the text arrived
// (a c10::Error's text carries a backtrace of kilobytes) threw there alone, between two
// broadcasts, and the ranks' next collectives paired across calls until comm_timeout_s (the CI
// hang of test_fake_device_stage3, review 2026-12-07a L7). errors() allocates nothing on the
// device: texts go through one kChunkBytes buffer, cut at kMaxTextBytes.
class Agreement {
 public:
  static constexpr int64_t kChunkBytes = 512;
  static constexpr int64_t kMaxTextBytes = 4096;
  // Texts sent: those of the first kMaxTexts failing ranks; the others are named by rank (the
  // first kMaxNamedRanks), so that a failure on every rank of a large group (an out of memory
  // in the same shapes) costs a few broadcasts, not 8 per rank (review 2026-12-07c L4).
  static constexpr int kMaxTexts = 4;
  static constexpr size_t kMaxNamedRanks = 32;

  Agreement(Group& g, const c10::Device& device);
  // `error`: this rank's verdict ("" = fine). Returns "" on every rank when every rank is fine;
  // else the same text on every rank: each failing rank's error as "rank r: <error>", joined by
  // "; ", for the first kMaxTexts of them, then "and N more ranks failed (r, ...)". One
  // all_gather (+ a broadcast per kChunkBytes of each text sent); a group of size 1 has no
  // collective. `what` names the collectives in errors.
  std::string errors(const std::string& error, const std::string& what);
  // Every rank's `value`, in rank order, through the same buffers (no allocation on the device):
  // for a figure a verdict needs from the peers, gathered between the constructor and errors()
  // without a throw point that would leave the peers waiting (review 2026-12-07d L1).
  std::vector<int64_t> gather(int64_t value, const std::string& what);

 private:
  Group& g_;
  at::Tensor mine_, all_, chunk_;  // on the device: this rank's text length, every rank's, bytes
};

// Agreement(g, device).errors(error, what): for a check whose failure left the device alone.
std::string agree_errors(Group& g, const std::string& error, const c10::Device& device,
                         const std::string& what);

}  // namespace zero::comm
