#include "zero/grads/partial_grads.hpp"

#include <ATen/ATen.h>

#include <algorithm>

namespace zero {

void PartialGradSum::add(int param, const std::shared_ptr<comm::Group>& group) {
  auto& groups = groups_of_.at(param);
  // Listed twice (by two names of a tied weight): summed once.
  if (std::find(groups.begin(), groups.end(), group) != groups.end()) return;
  groups.push_back(group);
  empty_ = false;
}

void PartialGradSum::on_grad(int param, const std::string& name, at::Tensor& grad) const {
  const auto& groups = groups_of_[param];
  if (groups.empty() || !grad.defined()) return;
  // A contiguous fp32 copy: the collective needs a dense buffer, and fp32 keeps the sum exact
  // up to one rounding into the gradient's own dtype. These are small (norm weights, biases).
  at::Tensor sum = grad.to(at::kFloat, /*non_blocking=*/false, /*copy=*/true).contiguous();
  for (const auto& g : groups) {
    if (g->size() == 1) continue;
    g->all_reduce_sum(sum, "all_reduce over group " + g->name() +
                               " of the partial (sequence-parallel) gradient of '" + name + "'")
        .wait();
  }
  grad.copy_(sum);
}

}  // namespace zero
