#include "zero/tensor_parallel/cross_entropy.hpp"

#include <ATen/ATen.h>
#include <torch/autograd.h>

#include <sstream>
#include <stdexcept>

#include "comm/agree.hpp"
#include "comm/group.hpp"
#include "zero/tensor_parallel/collectives.hpp"

namespace zero::tensor_parallel {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// The target's shape and id range, agreed over the group: each rank's [length of its shape
// error, min id, max id] gathered (one all_gather and the one host read the check always took),
// so every rank throws the same error when any rank's target is bad, instead of that rank alone
// while its peers wait in the all-gather of the maxima until comm_timeout_s. A bad id would
// otherwise read out of bounds on the device.
void check_target(const at::Tensor& logits, const at::Tensor& target, int64_t vocab,
                  int64_t ignore_index, comm::Group& g) {
  std::string shape_error;
  if (target.sizes() != logits.sizes().slice(0, logits.dim() - 1)) {
    std::ostringstream msg;
    msg << "target shape " << target.sizes() << " must be the logits' shape " << logits.sizes()
        << " without its last (vocabulary) dimension";
    shape_error = msg.str();
  }
  const at::TensorOptions opts = logits.options().dtype(at::kLong);
  at::Tensor status =
      at::tensor({static_cast<int64_t>(shape_error.size()), int64_t{0}, int64_t{0}}).to(opts);
  if (target.numel() > 0) {
    auto [lo, hi] = at::aminmax(target.masked_fill(target == ignore_index, 0));
    status = at::cat({status.narrow(0, 0, 1), at::stack({lo, hi}).to(opts)});
  }
  const at::Tensor all = comm::gather_status(g, status, "the target's shape and id range");
  for (int r = 0; r < g.size(); ++r) {
    if (all[r][0].item<int64_t>() == 0) continue;
    throw std::invalid_argument(
        "zero: vocab_parallel_cross_entropy: on tensor-parallel rank " + std::to_string(r) +
        " of " + std::to_string(g.size()) + " (every rank of the group stops): " +
        comm::broadcast_text(g, shape_error, r, logits.device(), "a target shape error"));
  }
  for (int r = 0; r < g.size(); ++r) {
    const int64_t min_id = all[r][1].item<int64_t>(), max_id = all[r][2].item<int64_t>();
    if (min_id >= 0 && max_id < vocab) continue;
    std::ostringstream msg;
    msg << "zero: vocab_parallel_cross_entropy: target id " << (min_id < 0 ? min_id : max_id)
        << " is outside the vocabulary [0, " << vocab << ") and is not ignore_index "
        << ignore_index << ", on tensor-parallel rank " << r << " of " << g.size()
        << " (every rank of the group stops)";
    throw std::invalid_argument(msg.str());
  }
}

struct VocabParallelCrossEntropy : torch::autograd::Function<VocabParallelCrossEntropy> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& logits,
                            const at::Tensor& target, const GroupPtr& group, int64_t ignore_index,
                            bool check) {
    auto& g = comm::of(*group);
    const int64_t part = logits.size(-1);
    const int64_t start = part * g.rank();
    if (check) {
      check_target(logits, target, part * g.size(), ignore_index, g);
    } else {
      TORCH_CHECK(target.sizes() == logits.sizes().slice(0, logits.dim() - 1),
                  "zero: vocab_parallel_cross_entropy: target shape ", target.sizes(),
                  " must be the logits' shape ", logits.sizes(),
                  " without its last (vocabulary) dimension (on tensor-parallel rank ", g.rank(),
                  " only: the targets are unchecked)");
    }

    const at::Tensor z = logits.to(at::kFloat);
    // The shift only has to be the same on every rank and at least each row's maximum for
    // exp() not to overflow: each rank's maxima gathered (the group has no max all-reduce).
    const at::Tensor maxes =
        all_gather_along(z.amax(-1).unsqueeze(0), 0, g, "vocab-parallel cross-entropy maximum");
    at::Tensor shifted = z - maxes.amax(0).unsqueeze(-1);

    const at::Tensor ignored = target == ignore_index;
    // Tokens whose target lies in another rank's part (or is ignored): no one-hot entry here.
    const at::Tensor elsewhere = (target < start) | (target >= start + part) | ignored;
    const at::Tensor local = (target - start).masked_fill(elsewhere, 0).unsqueeze(-1);
    const at::Tensor predicted = shifted.gather(-1, local).squeeze(-1).masked_fill(elsewhere, 0);

    at::Tensor exp = shifted.exp_();
    // One all-reduce for both sums: the target's logit (non-zero on one rank) and sum exp.
    at::Tensor sums = at::stack({predicted, exp.sum(-1)});
    g.all_reduce_sum(sums, "vocab-parallel cross-entropy sums").wait();
    const at::Tensor sum_exp = sums[1];
    at::Tensor loss = (sum_exp.log() - sums[0]).masked_fill_(ignored, 0);

    at::Tensor softmax = exp.div_(sum_exp.unsqueeze(-1));
    ctx->save_for_backward({softmax, local, elsewhere, ignored});
    ctx->saved_data["dtype"] = logits.scalar_type();
    return loss;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor& softmax = saved[0];
    const at::Tensor& local = saved[1];
    const at::Tensor& elsewhere = saved[2];
    const at::Tensor& ignored = saved[3];
    at::Tensor grad = softmax.clone();
    // d loss / d z = softmax - one_hot(target), the one-hot only on the rank holding the target.
    grad.scatter_add_(-1, local,
                      elsewhere.logical_not().to(grad.scalar_type()).neg().unsqueeze(-1));
    grad.mul_(grads[0].to(at::kFloat).masked_fill(ignored, 0).unsqueeze(-1));
    return {grad.to(ctx->saved_data["dtype"].toScalarType()), at::Tensor(), at::Tensor(),
            at::Tensor(), at::Tensor()};
  }
};

}  // namespace

at::Tensor vocab_parallel_cross_entropy(const at::Tensor& logits_shard, const at::Tensor& target,
                                        const GroupPtr& group, int64_t ignore_index,
                                        int64_t reduction, bool check_targets) {
  TORCH_CHECK(group, "zero: vocab_parallel_cross_entropy needs the tensor-parallel process group");
  TORCH_CHECK(reduction == at::Reduction::None || reduction == at::Reduction::Mean ||
                  reduction == at::Reduction::Sum,
              "zero: vocab_parallel_cross_entropy: reduction ", reduction,
              " is none of at::Reduction::None, Mean, Sum");
  at::Tensor per_token =
      VocabParallelCrossEntropy::apply(logits_shard, target, group, ignore_index, check_targets);
  if (reduction == at::Reduction::None) return per_token;
  at::Tensor sum = per_token.sum();
  if (reduction == at::Reduction::Sum) return sum;
  // The divisor counts the tokens that are not ignored (torch's nll_loss total_weight), on the
  // device: no host read. Every target ignored: 0 / 0 = NaN as in torch, and backward's
  // gradient, infinite per token, meets only ignored tokens, whose gradient is zeroed before it
  // is multiplied in: zero, as torch's.
  return sum / (target != ignore_index).sum().to(sum.scalar_type());
}

}  // namespace zero::tensor_parallel
