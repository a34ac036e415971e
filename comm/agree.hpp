// Rank-local failures made collective. A check that fails on some ranks of a group only (a bad
// batch, a model on the wrong GPU) must not throw there alone: the other ranks would enter their
// next collective and wait for the failed rank until comm_timeout_s, when the NCCL watchdog
// aborts them with a message that names no cause. Every rank calls these at the same point
// instead, and either every rank goes on or every rank throws the same text (as ckpt::agree does
// for checkpoints; DeepSpeed's and Megatron's checks are rank-local).
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <string>

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

// `error`: this rank's verdict ("" = fine). Returns "" on every rank when every rank is fine;
// else the same text on every rank: each failing rank's error as "rank r: <error>", joined by
// "; ". One all_gather (+ one broadcast per failing rank); a group of size 1 has no collective.
std::string agree_errors(Group& g, const std::string& error, const c10::Device& device,
                         const std::string& what);

}  // namespace zero::comm
