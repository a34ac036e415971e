// Engine::state_dict: the full parameters by name, gathered from the ranks' master shards.
#include <ATen/ATen.h>
#include <torch/nn/module.h>

#include <algorithm>
#include <exception>
#include <string>
#include <unordered_map>
#include <unordered_set>

#include "comm/agree.hpp"
#include "zero/engine/engine_impl.hpp"
#include "zero/errors.hpp"

namespace zero {

StateDict Engine::state_dict(const StateDictOptions& opts) const {
  const Impl& im = *impl_;
  const FlatParams& fp = im.fp;
  const int rank = im.group->rank(), world = im.group->size();
  TORCH_CHECK(opts.to_rank >= -1 && opts.to_rank < world, "zero: state_dict to_rank ", opts.to_rank,
              " is not a rank of this ", world, "-rank group (use -1 for all)");
  const bool keep = opts.to_rank < 0 || opts.to_rank == rank;
  auto out_of = [&](const at::Tensor& t) {
    at::Tensor c = opts.cpu && !t.device().is_cpu() ? t.cpu() : t.clone();
    return opts.master ? c.to(at::kFloat) : c;
  };

  // The full flat master in fp32, one bucket at a time, when ranks hold only their shards;
  // otherwise the values are right there (master, or the flat buffer it aliases).
  const bool in_flat = fp.master_aliases_flat() || fp.master_in_flat();
  // Stage 3: between steps no rank holds a gathered unit, so the compute-dtype values come from
  // the masters too (rounded as the step rounds them into the shard).
  const bool stage3 = im.sharding.params;
  const bool sharded = (fp.layout.world() > 1 && !in_flat) || stage3;
  std::vector<at::Tensor> gathered;  // per layout parameter
  if ((opts.master || stage3) && sharded) {
    // A collective: a rank that calls it alone (an export on rank 0 only) is told so within
    // seconds, naming the call, instead of waiting in its first all-gather (review 06e M4).
    im.enter("state_dict");
    // Stage 3 on a device: a pending gather-order comparison is read before any state is
    // (units/order_check.hpp); every rank is here, so its failure path's collectives pair.
    if (im.unit_runtime) im.unit_runtime->settle_order(*im.unit_group, fp.device());
    gathered.resize(fp.layout.params().size());
    // Every rank runs every bucket's all-gather whatever happens to its own copies: a rank that
    // failed copying (host memory) and left the loop would pair its next collective with the
    // others' next gather (review 06f M4). The first local error is rethrown after the loop.
    std::exception_ptr failed;
    // The gathers' buffers up front, agreed on: allocated per bucket, a device out of memory on
    // one rank (its allocator's cache differs from its peers') would leave it out of the
    // gathers the others go on issuing (review 2026-12-07a L7). The agreement's own few bytes on
    // the device are taken first, so that a rank out of memory below still takes part in it.
    comm::Agreement agreement(*im.group, fp.device());
    ShardedUnit::GatherScratch scratch;
    {
      int64_t full = 0, shard = 0;
      for (const BucketSlot& b : fp.layout.buckets()) {
        full = std::max(full, b.shard.padded_numel());
        shard = std::max(shard, b.shard.shard_numel());
      }
      const at::TensorOptions f32 = at::TensorOptions().dtype(at::kFloat).device(fp.device());
      std::string error;
      try {
        scratch.full = at::empty({full}, f32);
        if (fp.master.device() != fp.device()) scratch.in = at::empty({shard}, f32);
      } catch (const std::exception& e) {
        // Without c10's backtrace: the text goes to every rank, where it says nothing useful.
        error = std::string("allocating ") + std::to_string(4 * (full + shard) >> 20) + " MiB on " +
                fp.device().str() + ": " + error_message(e);
      }
      const std::string all = agreement.errors(error, "all_gather of state_dict's status");
      TORCH_CHECK(all.empty(),
                  "zero: state_dict: the gather buffer for the largest parameter "
                  "bucket could not be allocated (",
                  all,
                  "); no rank gathered anything. Free "
                  "device memory before the call, or lower reduce_bucket_size");
    }
    for (const auto& u : im.units) {
      u->for_each_gathered_master(
          [&](const BucketSlot& bucket, const at::Tensor& full) {
            if (!keep || failed) return;
            try {
              for (int pi : bucket.params) {
                const ParamSlot& s = fp.layout.params()[pi];
                at::Tensor v = full.narrow(0, s.flat_offset - bucket.flat_offset, s.numel);
                // The compute-dtype values are rounded where the bucket is, before the copy: the
                // kept rank holds the model once in the compute dtype, not in fp32 and then again
                // (review 06f M5: 6 bytes per parameter on rank 0's host for a 16-bit save).
                if (!opts.master) v = v.to(im.param_dtype);
                gathered[pi] = out_of(v);
              }
            } catch (...) {
              failed = std::current_exception();
            }
          },
          &scratch);
    }
    if (failed) std::rethrow_exception(failed);
  }
  StateDict out;
  if (!keep) return out;

  std::unordered_map<const void*, int> layout_of;  // distinct parameter -> layout index
  for (size_t li = 0; li < fp.params.size(); ++li) {
    layout_of[fp.params[li].unsafeGetTensorImpl()] = static_cast<int>(li);
  }
  std::unordered_set<const void*> seen;
  for (const auto& item : im.module->named_parameters(/*recurse=*/true)) {
    const at::Tensor& p = item.value();
    if (!seen.insert(p.unsafeGetTensorImpl()).second) continue;  // tied: first name only
    const auto it = layout_of.find(p.unsafeGetTensorImpl());
    at::Tensor v;
    if (it == layout_of.end() || (!opts.master && !stage3)) {
      v = out_of(p.detach());  // frozen, empty, or the compute-dtype values every rank holds
    } else if (sharded) {
      v = opts.master ? gathered[it->second] : gathered[it->second].to(im.param_dtype);
    } else {
      const ParamSlot& s = fp.layout.params()[it->second];
      // Stage 0 holds the whole master; fp32 parameters are the master (published on every
      // rank after each step), at the same offsets.
      v = out_of(in_flat ? im.unit_of(s.bucket).param_values(s)
                         : fp.master.narrow(0, s.flat_offset, s.numel));
    }
    // The layout's shape: at stage 3 a released parameter is a 0-element tensor.
    out.emplace_back(item.key(), it == layout_of.end() ? v.view(p.sizes())
                                                       : v.view(im.param_shapes[it->second]));
  }
  return out;
}

}  // namespace zero
