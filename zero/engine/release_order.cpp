// Engine::Impl::apply_arrival_order: buckets are reduced in the order the first pass completed
// them (GradOrder), while the layout, and with it the parameters, the masters, the optimizer
// states and every shard, stays as initialize built it. Keeping the layout of the states apart
// from the order of communication is what DDP's Reducer::rebuild_buckets does (it rebuilds
// gradient buckets only) and what DeepSpeed and FSDP do (optimizer state never moves after
// start-up): the switch costs no memory and no copy, under optimizer offload nothing crosses to
// the device, and checkpoints see one layout for the whole run.
#include <algorithm>
#include <numeric>

#include "zero/engine/engine_impl.hpp"

namespace zero {

void Engine::Impl::apply_arrival_order() {
  const GradOrder::Agreed agreed = order->agreed_order(*group, fp.device());
  const FlatLayout& L = fp.layout;
  // A bucket can be reduced once its last gradient is in: its place in the first pass is the
  // latest arrival among its parameters (one that never arrived counts as after all others, as
  // the flush after backward handles it). Every rank sorts rank 0's order the same way.
  std::vector<int> done_at(L.buckets().size(), -1);
  for (int k = 0; k < static_cast<int>(agreed.order.size()); ++k) {
    const int when = k < agreed.arrived ? k : static_cast<int>(agreed.order.size());
    int& d = done_at[L.params()[agreed.order[k]].bucket];
    d = std::max(d, when);
  }
  std::vector<int> release(L.buckets().size());
  std::iota(release.begin(), release.end(), 0);
  std::stable_sort(release.begin(), release.end(),
                   [&](int a, int b) { return done_at[a] < done_at[b]; });
  bucket_order = release;
  sync->set_release_order(bucket_order);
  order->applied();
}

}  // namespace zero
