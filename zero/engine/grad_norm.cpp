// The global gradient norm: this rank's sum of squares, summed over the data-parallel group and
// then over each norm group (Groups::norm), with parameters replicated across a norm group
// counted on its rank 0 only.
#include <ATen/ATen.h>
#include <torch/nn/module.h>

#include <limits>
#include <unordered_map>

#include "optim/cpu_adamw.hpp"
#include "zero/engine/engine_impl.hpp"
#include "zero/step/deepspeed_norm.hpp"

namespace zero {

namespace {

// The squared L2 norm of the gradient shard over `pieces`, in fp32, as a one-element tensor on
// its device, summed piece by piece: a narrower shard is converted inside the reduction (CUDA)
// or through one bucket's fp32 temporary (CPU), not a whole-shard copy. An fp32 shard is summed
// in the same pieces, so that on a CPU run a bf16 run's norm and its offloaded twin's (whose host
// shard is fp32) are the same sums in the same order: bit-identical clip coefficients. (On a GPU
// the offloaded norm is summed on the device piece by piece as the pieces leave: close, not
// equal.)
// `pieces`: the shard's windows (GradSink::window), non-empty; `options`: the result's device.
at::Tensor squared_norm(const std::vector<at::Tensor>& pieces, const at::TensorOptions& options) {
  if (options.device().is_cpu()) {
    // ATen's CPU vector_norm accumulates a whole tensor in float lanes (1.3e-3 relative error at
    // 2^24 fp32 elements, 7e-4 in bf16): pieces of 2^16 (~3e-7), summed in double.
    constexpr int64_t kPiece = int64_t{1} << 16;
    double total = 0;
    for (const at::Tensor& p : pieces) {
      for (int64_t b = 0; b < p.numel(); b += kPiece) {
        const int64_t n = std::min(p.numel(), b + kPiece) - b;
        const double norm =
            at::linalg_vector_norm(p.narrow(0, b, n), 2, {}, false, at::kFloat).item<double>();
        total += norm * norm;
      }
    }
    return at::full({1}, static_cast<float>(total), options.dtype(at::kFloat));
  }
  at::Tensor sq = at::zeros({1}, options.dtype(at::kFloat));
  for (const at::Tensor& p : pieces) {
    sq.add_(at::linalg_vector_norm(p, 2, {}, false, at::kFloat).square());
  }
  return sq;
}

}  // namespace

void Engine::Impl::set_norm_groups() {
  if (groups.norm.empty()) return;
  std::unordered_map<const void*, int> layout_index;  // TensorImpl -> layout index
  for (size_t li = 0; li < fp.params.size(); ++li) {
    layout_index[fp.params[li].unsafeGetTensorImpl()] = static_cast<int>(li);
  }
  std::unordered_map<std::string, const void*> by_name;  // every name, tied ones included
  for (const auto& item : module->named_parameters(/*recurse=*/true)) {
    by_name[item.key()] = item.value().unsafeGetTensorImpl();
  }
  norm_counted.assign(fp.params.size(), 1);
  // Every rank of dp must sit at the same rank of each norm group (a mesh's dimensions do): the
  // ranks that sum their shards over dp must leave out the same replicated parameters.
  const int n = static_cast<int>(groups.norm.size());
  at::Tensor mine = at::empty({n}, at::TensorOptions().dtype(at::kLong));
  for (int i = 0; i < n; ++i) {
    TORCH_CHECK(groups.norm[i].group != groups.dp, "zero::initialize: groups.norm[", i,
                "] is groups.dp; the norm always sums over dp, "
                "list only the further groups (tensor, pipeline parallel) in groups.norm");
    mine[i] = groups.norm[i].group->rank();
  }
  mine = mine.to(fp.device());
  at::Tensor all = at::empty({n * group->size()}, mine.options());
  group->all_gather(all, mine, "all_gather of the norm groups' ranks").wait();
  all = all.cpu().reshape({group->size(), n});
  for (int i = 0; i < n; ++i) {
    TORCH_CHECK(all.select(1, i).eq(all[0][i]).all().item<bool>(),
                "zero::initialize: the ranks "
                "of groups.dp are at different ranks of groups.norm[",
                i, "] ('", groups.norm[i].group->name(),
                "'); take dp and the norm groups from one mesh, "
                "so that a dp group's ranks share their tensor/pipeline coordinates");
  }
  partial_sum = PartialGradSum(static_cast<int>(fp.params.size()));
  for (int i = 0; i < n; ++i) {
    const NormGroup& ng = groups.norm[i];
    norm_groups.push_back(comm::of(ng.group));
    // Both lists are replicated parameters: counted on the group's rank 0 only. The partial ones
    // are summed over the group first (on_grad), which makes them replicated.
    for (const bool partial : {false, true}) {
      for (const std::string& name : partial ? ng.partial : ng.replicated) {
        const auto it = by_name.find(name);
        TORCH_CHECK(it != by_name.end(), "zero::initialize: groups.norm[", i, "].",
                    partial ? "partial" : "replicated", " names '", name,
                    "', which the model does not have; use the names of ",
                    "model->named_parameters()");
        const auto li = layout_index.find(it->second);
        // Frozen or empty parameters have no gradient to count or sum.
        if (li == layout_index.end()) continue;
        if (ng.group->rank() != 0) norm_counted[li->second] = 0;
        if (partial) partial_sum.add(li->second, norm_groups.back());
      }
    }
  }
}

at::Tensor Engine::Impl::uncounted_overflow() {
  if (!scaler.active() || norm_counted.empty()) return {};
  std::vector<char> uncounted(norm_counted.size());
  bool any = false;
  for (size_t i = 0; i < norm_counted.size(); ++i) {
    uncounted[i] = !norm_counted[i];
    any = any || uncounted[i];
  }
  if (!any) return {};
  std::vector<optim::Range> ranges;
  for (const auto& u : units) {
    for (const optim::Range& r : u->norm_pieces(uncounted)) ranges.push_back(r);
  }
  const std::vector<at::Tensor> parts = grad_windows(ranges);
  if (parts.empty()) return at::zeros({1}, grad_options().dtype(at::kFloat));
  // max |g| is finite for finite pieces (times 0: 0) and inf or NaN otherwise (times 0: NaN).
  const at::Tensor peak = at::linalg_vector_norm(
      parts.size() == 1 ? parts[0] : at::cat(parts), std::numeric_limits<double>::infinity(), {},
      false, at::kFloat);
  return (peak * 0).reshape({1});
}

std::vector<at::Tensor> Engine::Impl::grad_windows(const std::vector<optim::Range>& ranges) {
  std::vector<at::Tensor> out;
  for (const optim::Range& r : ranges) {
    if (r.end > r.begin) out.push_back(sync->sink().window(r.begin, r.end - r.begin));
  }
  return out;
}

at::TensorOptions Engine::Impl::grad_options() {
  GradSink& sink = sync->sink();
  if (sink.whole()) return sink.shard().options();
  return at::TensorOptions().dtype(sync_opts.accum_dtype).device(fp.device());
}

at::Tensor Engine::Impl::squared_grad_norm() {
  // Stage 3 on the device keeps a piece per unit (grad_sink.hpp): only its windows are read.
  GradSink& sink = sync->sink();
  const at::Tensor g = sink.whole() ? sink.shard() : at::Tensor();
  // fp16's overflow verdict is the norm's: an inf or NaN in a piece this rank leaves out of the
  // norm (a replicated norm weight on tensor-parallel rank 1, counted on rank 0) would pass
  // unseen, the step applied with it on this rank only. Megatron and DeepSpeed check every
  // gradient on every rank (found_inf all-reduced over the model-parallel group); so does this,
  // by adding 0, or NaN when the left-out pieces hold a non-finite value, to the square sum
  // before it is reduced.
  at::Tensor bad = uncounted_overflow();
  // In fp32 (no fp64 copy); the reduction accumulates in a tree.
  // The pieces of the shard the norm sums: each bucket's, or with norm groups the pieces of the
  // parameters this rank counts.
  const auto counted_pieces = [&] {
    std::vector<optim::Range> pieces;
    for (const auto& u : units) {
      for (const optim::Range& r : u->norm_pieces(norm_counted)) pieces.push_back(r);
    }
    return pieces;
  };
  at::Tensor sq;
  if (deepspeed_clip && sharding.stage() == 3) {
    // DeepSpeed's ZeRO-3 norm is fp64 to the end (deepspeed_norm.hpp); the clip takes it so.
    sq = deepspeed3_squared_norm(grad_windows(counted_pieces()), grad_options());
    if (bad.defined()) sq = sq + bad.to(sq.options());
    group->all_reduce_sum(sq, "all_reduce of the gradient norm").wait();
  } else if (deepspeed_clip) {
    sq = deepspeed_squared_norm(g, fp, sharding, *group, norm_counted);  // all of dp's already
    if (bad.defined()) {
      // The owner of a poisoned piece may be another dp rank, whose norm groups are not ours.
      bad = bad.to(sq.device());
      if (sharding.optimizer) group->all_reduce_sum(bad, "all_reduce of the fp16 overflow flag").wait();
      sq = sq + bad;
    }
  } else {
    // Offloaded: the shard is on the host, and its norm was summed on the device as the pieces
    // left (grad_to_host.hpp) where it could be; otherwise it is the host's, and travels (the
    // verdict stays on the device). From page-locked memory the upload is queued, not waited
    // for (a pageable one would synchronise the stream).
    if (offload && norm_counted.empty()) sq = sync->sink().device_squared_norm();
    if (!sq.defined()) {
      const std::vector<optim::Range> pieces = counted_pieces();
      // Beside a device, the host shard's norm runs on the host optimizer's threads (torchrun's
      // OMP_NUM_THREADS=1 would leave it on one core: ~0.3 s a step for 7B's shard at world 8).
      // A CPU run keeps the engine's own reduction, bit for bit the one without offload.
      auto* host = offload && !fp.device().is_cpu()
                       ? dynamic_cast<optim::HostShardOptimizer*>(store.optimizer.get())
                       : nullptr;
      TORCH_INTERNAL_ASSERT(host || !offload || fp.device().is_cpu(),
                            "zero: optimizer offload without a host optimizer");
      sq =
          host ? host->squared_norm(g, pieces) : squared_norm(grad_windows(pieces), grad_options());
      if (offload && fp.device().is_cuda()) {
        sq = sq.pin_memory().to(fp.device(), /*non_blocking=*/true);
      } else if (offload) {
        sq = sq.to(fp.device());
      }
    }
    if (bad.defined()) sq = sq + bad.to(sq.device());
    // Unsharded, every rank holds the all-reduced gradient: its sum is dp's already.
    if (sharding.optimizer) group->all_reduce_sum(sq, "all_reduce of the gradient norm").wait();
  }
  // As DeepSpeed's get_grad_norm_direct: the fp32 total over dp, then over the model-parallel
  // groups.
  for (const auto& ng : norm_groups) {
    ng->all_reduce_sum(sq, "all_reduce of the gradient norm over group " + ng->name()).wait();
  }
  return sq;
}

}  // namespace zero
