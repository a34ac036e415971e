#include "zero/params/flat_params.hpp"

#include <ATen/ATen.h>
#include <torch/nn/module.h>

#include <algorithm>
#include <unordered_map>

#include "comm/unowned_view.hpp"
#include "optim/cpu_adamw.hpp"

namespace zero {

namespace {

// Builds the flat buffer and the master shard one bucket at a time, so start-up never holds
// more than one bucket beyond the final buffers: each bucket's parameters are copied into an
// fp32 staging bucket (the flat buffer itself when it is fp32) and re-pointed at their slot of
// the flat buffer, which frees the user's tensors as we go; rank 0's values are broadcast
// (the masters must start from the unrounded weights), this rank's shard of the bucket goes
// to the master, and the bucket is cast into the flat buffer. The flat buffer and the master
// are allocated up front but their pages are touched bucket by bucket too.
void fill_flat_and_master(FlatParams& fp, std::vector<std::pair<std::string, at::Tensor>>& named,
                          const std::vector<int>& named_of_layout, comm::Group& group,
                          const FlattenOptions& opts) {
  const at::Device device = named.front().second.device();
  const auto f32 = at::TensorOptions().dtype(at::kFloat).device(device);
  const bool fp32 = opts.param_dtype == at::kFloat;
  const bool whole = opts.shards == 1;
  const auto compute = f32.dtype(opts.param_dtype);
  // The buffer each bucket lives in, and the bucket's offset there: `flat`, or at stage 3 its
  // unit's own buffer.
  std::vector<int> unit_of_bucket;
  if (opts.unit_buffers) {
    for (const UnitSlot& u : fp.layout.units()) {
      fp.unit_buffers.push_back(at::empty({u.flat_end - u.flat_begin}, compute));
      for (int b = u.first_bucket; b < u.end_bucket; ++b) {
        unit_of_bucket.push_back(static_cast<int>(fp.unit_buffers.size()) - 1);
      }
    }
  } else {
    fp.flat = at::empty({fp.layout.total_numel()}, compute);
  }
  fp.compute_options = opts.unit_buffers ? fp.unit_buffers.front().options() : fp.flat.options();
  auto bucket_buffer = [&](const BucketSlot& b, int bi) {
    if (!opts.unit_buffers) return fp.flat.narrow(0, b.flat_offset, b.shard.padded_numel());
    const int u = unit_of_bucket[bi];
    return fp.unit_buffers[u].narrow(0, b.flat_offset - fp.layout.units()[u].flat_begin,
                                     b.shard.padded_numel());
  };
  using Storage = FlatParams::MasterStorage;
  fp.storage = opts.host_master    ? Storage::kHost
               : !fp32             ? Storage::kOwnTensor
               : opts.unit_buffers ? Storage::kShard
               : whole             ? Storage::kAliasesFlat
                                   : Storage::kInFlat;
  switch (fp.storage) {
    case Storage::kAliasesFlat:
      fp.master = fp.flat;
      break;
    case Storage::kHost:
      fp.master = device::host_zeros(fp.layout.shard_numel(), opts.pin_memory);
      break;
    case Storage::kOwnTensor:
    case Storage::kShard:
      fp.master = at::empty({fp.layout.shard_numel()}, f32);
      break;
    case Storage::kInFlat:
      break;
  }
  if (opts.unit_buffers) {
    // Under optimizer offload the master is in host memory, and the gather source stays on the
    // device: a compute-dtype shard of its own, fp32 included (DeepSpeed's stage 3 keeps the
    // fp16 partition on the device and the fp32 one on the host alike).
    fp.shard =
        fp.storage == Storage::kShard ? fp.master : at::empty({fp.layout.shard_numel()}, compute);
  }
  const int r = whole ? 0 : group.rank();
  fp.shard_rank = r;
  const auto& buckets = fp.layout.buckets();
  for (size_t bi = 0; bi < buckets.size(); ++bi) {
    const BucketSlot& b = buckets[bi];
    const int64_t padded = b.shard.padded_numel();
    at::Tensor flat_b = bucket_buffer(b, static_cast<int>(bi));
    at::Tensor staging = fp32 ? flat_b : at::empty({padded}, f32);
    staging.zero_();  // padding
    for (int li : b.params) {
      const ParamSlot& slot = fp.layout.params()[li];
      at::Tensor& p = named[named_of_layout[li]].second;
      staging.narrow(0, slot.flat_offset - b.flat_offset, slot.numel).copy_(p.reshape({-1}));
      p.set_data(flat_b.narrow(0, slot.flat_offset - b.flat_offset, slot.numel).view(p.sizes()));
    }
    const std::string what =
        "broadcast of the initial parameters (bucket " + std::to_string(bi) + ")";
    if (fp32) {
      group.broadcast(staging, 0, what).wait();
    } else {
      // The temporary staging goes to the backend as a view that does not own it, so that it
      // is freed at the end of this iteration, not whenever c10d lets go of the work
      // (comm/unowned_view.hpp).
      at::Tensor lent = comm::unowned_view(staging);
      group.broadcast(lent, 0, what).hold(staging).wait();
    }
    // fp32 (not offloaded): the broadcast wrote the master into the flat buffer already.
    const int64_t S = b.shard.shard_numel();
    if (fp.master.defined() && !fp.master_aliases_flat()) {
      fp.master.narrow(0, b.shard_offset, S).copy_(staging.narrow(0, b.shard.shard(r).begin, S));
    }
    if (!fp32) flat_b.copy_(staging);
    // bf16/fp16 at stage 3: the gather source is the master rounded, as the step will round it.
    if (fp.shard.defined() && !fp.shard.is_same(fp.master)) {
      fp.shard.narrow(0, b.shard_offset, S).copy_(fp.master.narrow(0, b.shard_offset, S));
    }
  }
}

}  // namespace

at::Tensor FlatParams::bucket_master(const BucketSlot& b) const {
  const int64_t S = b.shard.shard_numel();
  return master_in_flat() ? flat.narrow(0, b.flat_offset + shard_rank * S, S)
                          : master.narrow(0, b.shard_offset, S);
}

at::Tensor FlatParams::master_window(const BucketSlot& b) const {
  if (!master_in_flat()) return master;
  // Element i of the view is flat[start + i], with start chosen so that the window's elements
  // land on this rank's slot of bucket b. It stays inside `flat`: shard_offset <= flat_offset
  // (every earlier bucket is N shards long in `flat`, one in the master), and what follows the
  // window in the view is at most the later buckets' shards, which `flat` holds N times over.
  const int64_t start =
      b.flat_offset + shard_rank * b.shard.shard_numel() - b.shard_offset + flat.storage_offset();
  return flat.as_strided({layout.shard_numel()}, {1}, start);
}

at::Tensor FlatParams::master_shard() const {
  if (!master_in_flat()) return master;
  std::vector<at::Tensor> parts;
  for (const BucketSlot& b : layout.buckets()) parts.push_back(bucket_master(b));
  return at::cat(parts);
}

void FlatParams::set_master_shard(const at::Tensor& shard) {
  if (!master_in_flat()) {
    master.copy_(shard);
    return;
  }
  for (const BucketSlot& b : layout.buckets()) {
    bucket_master(b).copy_(shard.narrow(0, b.shard_offset, b.shard.shard_numel()));
  }
}

int64_t FlatParams::master_bytes() const {
  return master_aliases_flat() || master_in_flat() ? 0 : static_cast<int64_t>(master.nbytes());
}

FlatParams flatten_parameters(torch::nn::Module& module, comm::Group& group,
                              const FlattenOptions& opts) {
  at::NoGradGuard no_grad;
  FlatParams fp;

  // Tied weights appear under several names but are one tensor: keep the first name.
  std::vector<std::pair<std::string, at::Tensor>> named;
  std::unordered_map<const void*, int> seen;
  for (const auto& item : module.named_parameters(/*recurse=*/true)) {
    const at::Tensor& t = item.value();
    if (seen.count(t.unsafeGetTensorImpl())) continue;
    seen[t.unsafeGetTensorImpl()] = static_cast<int>(named.size());
    named.emplace_back(item.key(), t);
  }
  TORCH_CHECK(!named.empty(), "zero: the model has no parameters to train");
  const at::Device device = named.front().second.device();

  // Frozen parameters and buffers are not sharded, but every rank must start from rank 0's, in
  // the compute dtype as DeepSpeed casts the whole module (a bf16 forward must not mix dtypes).
  auto to_compute_dtype = [&](at::Tensor& t) {
    if (at::isFloatingType(t.scalar_type()) && t.scalar_type() != opts.param_dtype) {
      t.set_data(t.to(opts.param_dtype));
    }
  };
  for (auto& [name, t] : named) {
    TORCH_CHECK(t.device() == device, "zero: parameter '", name, "' is on ", t.device(), " but '",
                named.front().first, "' is on ", device,
                "; move the whole model to one device before zero::initialize");
    TORCH_CHECK(at::isFloatingType(t.scalar_type()), "zero: parameter '", name, "' has dtype ",
                t.scalar_type(), "; only floating-point parameters can train");
    if (!t.requires_grad()) {
      auto c = t.contiguous();
      group.broadcast(c, 0, "broadcast of frozen parameter '" + name + "'").wait();
      if (!c.is_same(t)) t.copy_(c);
      to_compute_dtype(t);
    }
  }
  for (auto& item : module.named_buffers(/*recurse=*/true)) {
    at::Tensor t = item.value();
    if (!t.defined()) continue;
    TORCH_CHECK(t.device() == device, "zero: buffer '", item.key(), "' is on ", t.device(),
                " but parameter '", named.front().first, "' is on ", device,
                "; move the whole model (parameters and buffers) to one device before "
                "zero::initialize");
    auto c = t.contiguous();
    group.broadcast(c, 0, "broadcast of buffer '" + item.key() + "'").wait();
    if (!c.is_same(t)) t.copy_(c);
    to_compute_dtype(t);
  }

  std::vector<int> trainable;  // indices into `named`, registration order
  for (int i = 0; i < static_cast<int>(named.size()); ++i) {
    if (named[i].second.requires_grad()) trainable.push_back(i);
  }
  TORCH_CHECK(!trainable.empty(), "zero: no parameter of the model requires grad");
  std::vector<ParamSpec> specs;
  std::vector<int> named_of_layout;
  for (auto it = trainable.rbegin(); it != trainable.rend(); ++it) {
    if (named[*it].second.numel() == 0) continue;
    const at::Tensor& t = named[*it].second;
    const auto u = opts.unit_of.find(t.unsafeGetTensorImpl());
    specs.push_back({named[*it].first, t.numel(), u == opts.unit_of.end() ? 0 : u->second});
    named_of_layout.push_back(*it);
  }
  if (!opts.unit_of.empty()) {
    // Unit by unit, units ordered by their first parameter, reverse registration order inside
    // each (a stable sort keeps it).
    std::unordered_map<int, int> rank_of_unit;
    for (const ParamSpec& s : specs)
      rank_of_unit.emplace(s.unit, static_cast<int>(rank_of_unit.size()));
    std::vector<size_t> idx(specs.size());
    for (size_t i = 0; i < idx.size(); ++i) idx[i] = i;
    std::stable_sort(idx.begin(), idx.end(), [&](size_t a, size_t b) {
      return rank_of_unit[specs[a].unit] < rank_of_unit[specs[b].unit];
    });
    std::vector<ParamSpec> sorted_specs;
    std::vector<int> sorted_named;
    for (size_t i : idx) {
      sorted_specs.push_back(specs[i]);
      sorted_named.push_back(named_of_layout[i]);
    }
    specs = std::move(sorted_specs);
    named_of_layout = std::move(sorted_named);
  }
  fp.layout = FlatLayout::build(specs, opts.bucket_numel, opts.shards, opts.align);

  fill_flat_and_master(fp, named, named_of_layout, group, opts);
  fp.layout_of_named.assign(named.size(), -1);
  for (size_t li = 0; li < fp.layout.params().size(); ++li) {
    fp.params.push_back(named[named_of_layout[li]].second);
    fp.layout_of_named[named_of_layout[li]] = static_cast<int>(li);
  }
  return fp;
}

}  // namespace zero
