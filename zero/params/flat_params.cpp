#include "zero/params/flat_params.hpp"

#include <ATen/ATen.h>
#include <torch/nn/module.h>

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
  fp.flat = at::empty({fp.layout.total_numel()}, f32.dtype(opts.param_dtype));
  fp.compute_options = fp.flat.options();
  using Storage = FlatParams::MasterStorage;
  fp.storage = opts.host_master ? Storage::kHost
               : !fp32          ? Storage::kOwnTensor
               : whole          ? Storage::kAliasesFlat
                                : Storage::kInFlat;
  switch (fp.storage) {
    case Storage::kAliasesFlat:
      fp.master = fp.flat;
      break;
    case Storage::kHost:
      fp.master = device::host_zeros(fp.layout.shard_numel(), opts.pin_memory);
      break;
    case Storage::kOwnTensor:
      fp.master = at::empty({fp.layout.shard_numel()}, f32);
      break;
    case Storage::kInFlat:
      break;
  }
  const int r = whole ? 0 : group.rank();
  fp.shard_rank = r;
  const auto& buckets = fp.layout.buckets();
  for (size_t bi = 0; bi < buckets.size(); ++bi) {
    const BucketSlot& b = buckets[bi];
    const int64_t padded = b.shard.padded_numel();
    at::Tensor flat_b = fp.flat.narrow(0, b.flat_offset, padded);
    at::Tensor staging = fp32 ? flat_b : at::empty({padded}, f32);
    staging.zero_();  // padding
    for (int li : b.params) {
      const ParamSlot& slot = fp.layout.params()[li];
      at::Tensor& p = named[named_of_layout[li]].second;
      staging.narrow(0, slot.flat_offset - b.flat_offset, slot.numel).copy_(p.reshape({-1}));
      p.set_data(fp.flat.narrow(0, slot.flat_offset, slot.numel).view(p.sizes()));
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
    if (fp.master.defined() && !fp.master_aliases_flat()) {
      const int64_t S = b.shard.shard_numel();
      fp.master.narrow(0, b.shard_offset, S).copy_(staging.narrow(0, b.shard.shard(r).begin, S));
    }
    if (!fp32) flat_b.copy_(staging);
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
    specs.push_back({named[*it].first, named[*it].second.numel()});
    named_of_layout.push_back(*it);
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
