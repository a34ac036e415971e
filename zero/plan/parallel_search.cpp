// The search over tensor-parallel and pipeline sizes: rules in include/zero/parallel_plan.hpp.
#include <algorithm>

#include "zero/parallel_plan.hpp"

namespace zero {

ParallelSearch search_parallel(const PlanInput& in, const PlanLimits& limits,
                               const LayoutHardware& hardware) {
  const int per_node = limits.ranks_per_node > 0 ? limits.ranks_per_node : 8;
  ParallelSearch out;
  const ModelShape& m = in.shape;
  constexpr Recompute kModes[] = {Recompute::kNone, Recompute::kCheckpoint,
                                  Recompute::kCheckpointOffload};
  const int64_t max_b = std::max<int64_t>(1, limits.max_micro_batch);
  for (int t : {1, 2, 4, 8}) {
    // Megatron splits the heads: T must divide them and the key/value heads (its
    // num_query_groups), and stays within a node's NVLink.
    if (t > std::max(1, per_node) || in.world_size % t != 0) continue;
    if (m.known() && (m.head_count() % t != 0 || m.kv_head_count() % t != 0)) continue;
    const int64_t layers = m.known() ? m.layers : 1;
    for (int p = 1; p <= layers; ++p) {
      if (layers % p != 0 || in.world_size % (t * p) != 0) continue;
      // The interleaved schedule needs groups of P micro-batches and P·v chunks: equal ones
      // (whole blocks each), or with a runtime partition a layer at least in each of [embedding,
      // blocks, head]'s P·v parts (parallel_layout's rules).
      if (p > 1 && in.schedule == PlanInput::Schedule::kInterleaved) {
        const int64_t chunks = static_cast<int64_t>(p) * in.virtual_stages;
        const bool cut = in.partition == PlanInput::Partition::kEqual || !m.known()
                             ? layers % chunks == 0
                             : layers + 2 >= chunks;
        if (!cut || in.accumulation % p != 0) continue;
      }
      PlanInput x = in;
      x.tensor_parallel = t;
      x.pipeline_stages = p;
      x.offload_optimizer = false;
      const ParallelLayout layout = parallel_layout(x);
      const ParallelHardware hw = hardware(layout);
      // Stage 2 and 3 reduce every micro-step: not with pipelines (DeepSpeed refuses them).
      const int stages = p > 1 ? 2 : 4;
      for (int stage = 0; stage < stages; ++stage) {
        for (Recompute r : kModes) {
          bool fits = false;
          ParallelCandidate c;
          for (int64_t b = 1; b <= (m.known() ? max_b : in.micro_batch); b *= 2) {
            x.micro_batch = m.known() ? b : in.micro_batch;
            const RankPlan rp = plan_parallel_rank(x, stage, r);
            if (rp.total() > limits.budget()) break;
            // Offloaded checkpoints: a node's ranks share its host memory.
            if (limits.host_bytes > 0 && per_node * rp.act.host > limits.host_budget()) break;
            fits = true;
            c = {layout, stage, r, x.micro_batch, rp, {}};
          }
          if (!fits) continue;
          x.micro_batch = c.micro_batch;
          c.time = predict_parallel_step_time(x, stage, r, hw);
          out.fits.push_back(c);
        }
      }
    }
  }
  // Highest MFU first; among equals the fewest model-parallel ranks, then the lower stage.
  std::stable_sort(out.fits.begin(), out.fits.end(), [](const auto& a, const auto& b) {
    if (a.time.mfu != b.time.mfu) return a.time.mfu > b.time.mfu;
    const int ma = a.layout.tp * a.layout.pp, mb = b.layout.tp * b.layout.pp;
    if (ma != mb) return ma < mb;
    return a.stage < b.stage;
  });
  out.found = !out.fits.empty();
  if (out.found) out.best = out.fits.front();
  return out;
}

}  // namespace zero
