#include "zero/tensor_parallel/placement.hpp"

#include <ATen/ATen.h>
#include <torch/nn/module.h>

#include <sstream>
#include <stdexcept>
#include <utility>

#include "comm/group.hpp"
#include "zero/tensor_parallel/collectives.hpp"
#include "zero/tensor_parallel/shard.hpp"

namespace zero::tensor_parallel {

namespace {

struct Walk {
  bool sequence_parallel;
  // The modules enclosing the one being listed, outermost first, with their path prefixes.
  std::vector<std::pair<std::string, const SequenceParallelModule*>> marks;
  std::vector<std::string> unmarked;
  std::vector<NamedPlacement> out;
};

// A replicated parameter's share of the sequence, asked innermost module first.
SequenceShare share_of(const Walk& w, const std::string& name) {
  for (auto it = w.marks.rbegin(); it != w.marks.rend(); ++it) {
    const std::string& prefix = it->first;
    const std::string relative = prefix.empty() ? name : name.substr(prefix.size() + 1);
    const SequenceShare s = it->second->sequence_share(relative);
    if (s != SequenceShare::kUnsaid) return s;
  }
  return SequenceShare::kUnsaid;
}

void add_tree(const torch::nn::Module& m, const std::string& prefix, Walk& w) {
  const auto* mark = dynamic_cast<const SequenceParallelModule*>(&m);
  if (mark) w.marks.emplace_back(prefix, mark);
  const auto* layer = dynamic_cast<const TensorParallelLayer*>(&m);
  for (const auto& p : m.named_parameters(/*recurse=*/false)) {
    const std::string name = prefix.empty() ? p.key() : prefix + "." + p.key();
    Placement where;
    if (layer) {
      where = layer->placement(p.key());
    } else if (w.sequence_parallel) {
      const SequenceShare s = share_of(w, name);
      if (s == SequenceShare::kUnsaid) w.unmarked.push_back(name);
      where.grad_needs_all_reduce = s == SequenceShare::kPartial;
    }
    w.out.push_back({name, p.value(), where});
  }
  for (const auto& c : m.named_children()) {
    add_tree(*c.value(), prefix.empty() ? c.key() : prefix + "." + c.key(), w);
  }
  if (mark) w.marks.pop_back();
}

}  // namespace

std::vector<NamedPlacement> placements(const torch::nn::Module& model, bool sequence_parallel) {
  Walk w{sequence_parallel, {}, {}, {}};
  add_tree(model, "", w);
  if (!w.unmarked.empty()) {
    std::ostringstream msg;
    msg << "zero: tensor_parallel::placements: under sequence parallelism the replicated "
           "parameter"
        << (w.unmarked.size() > 1 ? "s " : " ");
    for (size_t i = 0; i < w.unmarked.size(); ++i) msg << (i ? ", '" : "'") << w.unmarked[i] << "'";
    msg << (w.unmarked.size() > 1 ? " are" : " is")
        << " not marked, and a guess would be wrong for one of the two kinds: a parameter acting "
           "on this rank's part of the sequence (a norm between the parallel regions) holds a "
           "partial gradient that must be summed over the tensor-parallel group, one acting on "
           "the whole sequence would get the group's size times its gradient if summed. Implement "
           "zero::tensor_parallel::SequenceParallelModule on the module holding it (or any "
           "enclosing one, the model itself) and return SequenceShare::kPartial or kWhole for "
           "it from sequence_share(name), as zero::models::TpGpt does for its norms";
    throw std::invalid_argument(msg.str());
  }
  return std::move(w.out);
}

void all_reduce_partial_grads(const std::vector<NamedPlacement>& params, zero::Group& tp) {
  comm::Group& group = comm::of(tp);
  std::vector<at::Tensor> grads;
  std::vector<at::Tensor> targets;
  for (const auto& p : params) {
    if (!p.placement.grad_needs_all_reduce) continue;
    at::Tensor g = p.param.grad();
    grads.push_back(g.defined() ? g.reshape({-1})
                                : at::zeros({p.param.numel()}, p.param.options()));
    targets.push_back(p.param);
  }
  if (grads.empty() || group.size() == 1) return;
  // One buffer, one collective: these are small (norm weights, biases), latency dominates.
  at::Tensor flat = at::cat(grads);
  group.all_reduce_sum(flat, "tensor-parallel all-reduce of sequence-parallel gradients").wait();
  int64_t offset = 0;
  at::NoGradGuard no_grad;
  for (auto& p : targets) {
    at::Tensor summed = flat.narrow(0, offset, p.numel()).view(p.sizes());
    offset += p.numel();
    if (p.grad().defined()) {
      p.mutable_grad().copy_(summed);
    } else {
      p.mutable_grad() = summed.clone();
    }
  }
}

double grad_norm_sq(const std::vector<NamedPlacement>& params, zero::Group& tp) {
  comm::Group& group = comm::of(tp);
  // Both sums stay on the parameters' device (fp64) until the one read at the end: a read per
  // replicated parameter would synchronise the host with the device once per parameter.
  at::Tensor replicated;
  at::Tensor sharded;  // what the group moves
  for (const auto& p : params) {
    const at::Tensor g = p.param.grad();
    if (!g.defined()) continue;
    const at::Tensor sq = g.to(at::kDouble).square().sum();
    at::Tensor& sum = p.placement.sharded ? sharded : replicated;
    sum = sum.defined() ? sum + sq : sq;
  }
  if (!sharded.defined()) {
    // Every rank must join the collective, also one whose parameters have no gradient.
    const auto device =
        params.empty() ? at::Device(group.options().device) : params.front().param.device();
    sharded = at::zeros({}, at::TensorOptions().dtype(at::kDouble).device(device));
  }
  sharded = sharded.reshape({1}).contiguous();
  group.all_reduce_sum(sharded, "tensor-parallel all-reduce of the gradient norm").wait();
  if (replicated.defined()) sharded = sharded + replicated.to(sharded.device());
  return sharded.item<double>();
}

std::vector<std::pair<std::string, at::Tensor>> gather_full(
    const std::vector<NamedPlacement>& params, zero::Group& tp) {
  comm::Group& group = comm::of(tp);
  std::vector<std::pair<std::string, at::Tensor>> out;
  out.reserve(params.size());
  for (const auto& p : params) {
    const at::Tensor v = p.param.detach();
    out.emplace_back(p.name, p.placement.sharded
                                 ? all_gather_along(v, p.placement.partition_dim, group,
                                                    "tensor-parallel gather_full")
                                 : v.clone());
  }
  return out;
}

void load_full(const std::vector<NamedPlacement>& params,
               const std::function<at::Tensor(const std::string& name)>& full,
               const zero::Group& group) {
  at::NoGradGuard no_grad;
  for (const auto& p : params) {
    const at::Tensor whole = full(p.name);
    std::vector<int64_t> want = p.param.sizes().vec();
    if (p.placement.sharded) want[p.placement.partition_dim] *= group.size();
    if (!whole.defined() || whole.sizes() != at::IntArrayRef(want)) {
      std::ostringstream msg;
      msg << "zero: tensor-parallel load_full: parameter " << p.name << " needs a full tensor of "
          << "shape " << at::IntArrayRef(want) << ", got "
          << (whole.defined() ? whole.sizes() : at::IntArrayRef{})
          << (whole.defined() ? "" : " (none)");
      throw std::invalid_argument(msg.str());
    }
    const at::Tensor part = p.placement.sharded
                                ? shard_of(whole, p.placement.partition_dim, group.rank(),
                                           group.size(), "parameter " + p.name)
                                : whole;
    p.param.copy_(part);
  }
}

std::vector<TensorPart> checkpoint_parts(const std::vector<NamedPlacement>& params,
                                         const zero::Group& group) {
  std::vector<TensorPart> out;
  for (const auto& p : params) {
    if (!p.placement.sharded) continue;
    const auto sizes = p.param.sizes();
    TensorPart part{p.name, sizes.vec(), std::vector<int64_t>(sizes.size(), 0)};
    const auto d = static_cast<size_t>(p.placement.partition_dim);
    part.global_shape[d] *= group.size();
    part.offset[d] = sizes[d] * group.rank();  // shard_of's equal blocks, in rank order
    out.push_back(std::move(part));
  }
  return out;
}

}  // namespace zero::tensor_parallel
