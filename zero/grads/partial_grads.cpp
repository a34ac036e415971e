#include "zero/grads/partial_grads.hpp"

#include <ATen/ATen.h>

#include <algorithm>

namespace zero {

void PartialGradSum::add(int param, const std::shared_ptr<comm::Group>& group) {
  auto& groups = groups_of_.at(param);
  // Listed twice (by two names of a tied weight): summed once.
  if (std::find(groups.begin(), groups.end(), group) != groups.end()) return;
  groups.push_back(group);
  if (std::find(groups_.begin(), groups_.end(), group) == groups_.end()) groups_.push_back(group);
  empty_ = false;
}

void PartialGradSum::sum_shard(GradSink& shard, const FlatLayout& layout, int owner) const {
  if (empty_) return;
  const std::vector<OwnedPiece> pieces = layout.owned_pieces(owner);
  for (const auto& g : groups_) {
    if (g->size() == 1) continue;
    std::vector<at::Tensor> parts;
    for (const OwnedPiece& p : pieces) {
      const auto& of = groups_of_[p.param];
      if (std::find(of.begin(), of.end(), g) == of.end()) continue;
      parts.push_back(shard.window(p.shard_offset, p.numel));
    }
    // The same on every rank of the group (the same layout and owner): all skip, or none.
    if (parts.empty()) continue;
    // A dense fp32 buffer: the collective needs one, and fp32 keeps the sum exact up to one
    // rounding into the shard's dtype. These are small (norm weights, biases).
    at::Tensor flat = at::cat(parts).to(at::kFloat);
    if (const auto bound = g->bound_device(); bound && flat.device() != *bound) {
      flat = flat.to(*bound);
    }
    g->all_reduce_sum(flat, "all_reduce over group " + g->name() + " of the partial (sequence-" +
                                "parallel) gradients of " + std::to_string(parts.size()) +
                                " parameter pieces")
        .wait();
    int64_t offset = 0;
    for (at::Tensor& part : parts) {
      part.copy_(flat.narrow(0, offset, part.numel()));
      offset += part.numel();
    }
  }
}

}  // namespace zero
