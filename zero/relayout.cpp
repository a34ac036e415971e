// Engine::Impl::rebuild_layout: the layout follows the order gradients arrive in (GradOrder).
// Runs once, at the start of the second accumulation window, when no gradient is held anywhere:
// only the fp32 masters and the optimizer states move, one old bucket at a time (each gathered
// whole, then every rank keeps what it owns under the new layout), so the extra memory is one
// bucket per sharded tensor; the compute-dtype parameters are then published from the masters.
#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include "zero/engine_impl.hpp"

namespace zero {
namespace {

// Each tensor of `from` (a shard of `old_layout`) as this rank's shard of `new_layout`, where
// new_of_old maps parameter indices.
std::vector<at::Tensor> reshard(const std::vector<at::Tensor>& from, const FlatLayout& old_layout,
                                const FlatLayout& new_layout, const std::vector<int>& new_of_old,
                                int rank, comm::Group& group) {
  const bool whole = old_layout.world() == 1;
  std::vector<at::Tensor> to;
  for (const at::Tensor& t : from) to.push_back(at::zeros({new_layout.shard_numel()}, t.options()));
  for (size_t b = 0; b < old_layout.buckets().size(); ++b) {
    const BucketSlot& ob = old_layout.buckets()[b];
    const int64_t S = ob.shard.shard_numel();
    for (size_t i = 0; i < from.size(); ++i) {
      at::Tensor bucket;
      if (whole) {
        bucket = from[i].narrow(0, ob.shard_offset, S);
      } else {
        at::Tensor mine = from[i].narrow(0, ob.shard_offset, S);
        bucket = at::empty({ob.shard.padded_numel()}, from[i].options());
        group
            .all_gather(bucket, mine,
                        "all_gather of bucket " + std::to_string(b) + " to rebuild the layout")
            .wait();
      }
      for (int p : ob.params) {
        const ParamSlot& os = old_layout.params()[p];
        const ParamSlot& ns = new_layout.params()[new_of_old[p]];
        const BucketSlot& nb = new_layout.buckets()[ns.bucket];
        const int64_t local = ns.flat_offset - nb.flat_offset;
        const Range r = nb.shard.owned(rank, {local, local + ns.numel});
        if (r.empty()) continue;
        const int64_t src = os.flat_offset - ob.flat_offset + (r.begin - local);
        const int64_t dst = nb.shard_offset + (r.begin - nb.shard.shard(rank).begin);
        to[i].narrow(0, dst, r.size()).copy_(bucket.narrow(0, src, r.size()));
      }
    }
  }
  return to;
}

}  // namespace

void Engine::Impl::apply_arrival_order() {
  const GradOrder::Agreed agreed = order->agreed_order(*group, fp.flat.device());
  // Buckets that fill one after the other release as they fill: keep the layout (and with it
  // the summation order, so a run and its resumed copy stay bitwise equal). Rebuild only when a
  // gradient arrives for a bucket behind one already begun.
  bool in_order = true;
  for (int k = 1; k < agreed.arrived; ++k) {
    in_order = in_order && fp.layout.params()[agreed.order[k - 1]].bucket <=
                               fp.layout.params()[agreed.order[k]].bucket;
  }
  if (in_order) {
    std::vector<int> same(fp.params.size());
    for (size_t k = 0; k < same.size(); ++k) same[k] = static_cast<int>(k);
    order->reordered(same, fp.params);
    return;
  }
  rebuild_layout(agreed.order);
}

void Engine::Impl::rebuild_layout(const std::vector<int>& new_order) {
  at::NoGradGuard no_grad;
  const size_t n = new_order.size();
  TORCH_INTERNAL_ASSERT(n == fp.params.size());
  std::vector<int> new_of_old(n);
  for (size_t k = 0; k < n; ++k) new_of_old[new_order[k]] = static_cast<int>(k);

  const FlatLayout old_layout = fp.layout;
  std::vector<ParamSpec> specs;
  for (int old : new_order)
    specs.push_back({old_layout.params()[old].name, old_layout.params()[old].numel});
  FlatLayout layout =
      FlatLayout::build(specs, flat_opts.bucket_numel, flat_opts.shards, flat_opts.align);

  const int rank = flat_opts.shards == 1 ? 0 : group->rank();
  std::vector<at::Tensor> moved;
  {
    std::vector<at::Tensor> old_shards{fp.master_shard()};
    for (const auto& s : opt.optimizer->state()) old_shards.push_back(s.second);
    // Offloaded shards travel through the device: the collectives run where the group does.
    if (offload) {
      for (auto& t : old_shards) t = t.to(fp.flat.device());
    }
    moved = reshard(old_shards, old_layout, layout, new_of_old, rank, *group);
    if (offload) {
      for (auto& t : moved) t = offload->to_host(t);
    }
  }

  // The gradient path and the optimizer are built for a layout: new ones (between windows they
  // hold nothing but the optimizer's states, copied over). The old optimizer goes first, so
  // that at most two copies of its states exist at any time.
  sync.reset();
  const int64_t steps = opt.optimizer->steps();
  opt.optimizer.reset();
  const int owner = stage == 0 ? 0 : group->rank();
  OptimizerBundle fresh = make_optimizer(cfg, layout, owner, moved[0].options());
  const auto fresh_states = fresh.optimizer->state();
  for (size_t i = 0; i < fresh_states.size(); ++i) {
    fresh_states[i].second.copy_(moved[1 + i]);
    moved[1 + i].reset();
  }
  fresh.optimizer->set_steps(steps);
  opt.optimizer = std::move(fresh.optimizer);

  std::vector<at::Tensor> params(n);
  for (size_t k = 0; k < n; ++k) params[k] = fp.params[new_order[k]];
  fp.layout = std::move(layout);
  if (fp.master_in_flat) {
    fp.flat = at::zeros({fp.layout.total_numel()}, fp.flat.options());
    fp.set_master_shard(moved[0]);
    moved[0].reset();
  } else {
    fp.master = moved[0];
    fp.flat = fp.master_aliases_flat ? fp.master
                                     : at::zeros({fp.layout.total_numel()}, fp.flat.options());
  }
  for (size_t k = 0; k < n; ++k) {
    const ParamSlot& slot = fp.layout.params()[k];
    params[k].set_data(fp.flat.narrow(0, slot.flat_offset, slot.numel).view(params[k].sizes()));
  }
  fp.params = std::move(params);
  for (int& li : fp.layout_of_named) {
    if (li >= 0) li = new_of_old[li];
  }
  publish_parameters();
  make_sync();
  hooks.reordered(new_order);
  order->reordered(new_order, fp.params);
}

}  // namespace zero
