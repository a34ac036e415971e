#include "zero/flat_params.hpp"

#include <ATen/ATen.h>
#include <torch/nn/module.h>

#include <unordered_map>

namespace zero {

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

  // Rank 0's fp32 values, broadcast: the masters must start from the unrounded weights.
  const auto f32 = at::TensorOptions().dtype(at::kFloat).device(device);
  at::Tensor staging = at::zeros({fp.layout.total_numel()}, f32);
  for (size_t li = 0; li < fp.layout.params().size(); ++li) {
    const ParamSlot& slot = fp.layout.params()[li];
    staging.narrow(0, slot.flat_offset, slot.numel)
        .copy_(named[named_of_layout[li]].second.reshape({-1}));
  }
  group.broadcast(staging, 0, "broadcast of the initial parameters").wait();

  const bool whole = opts.shards == 1;
  fp.master_aliases_flat = whole && opts.param_dtype == at::kFloat;
  if (fp.master_aliases_flat) {
    fp.master = staging;
  } else {
    fp.master = at::empty({fp.layout.shard_numel()}, f32);
    const int r = whole ? 0 : group.rank();
    for (const BucketSlot& b : fp.layout.buckets()) {
      const int64_t S = b.shard.shard_numel();
      fp.master.narrow(0, b.shard_offset, S)
          .copy_(staging.narrow(0, b.flat_offset + b.shard.shard(r).begin, S));
    }
  }
  fp.flat = opts.param_dtype == at::kFloat ? staging : staging.to(opts.param_dtype);

  fp.layout_of_named.assign(named.size(), -1);
  for (size_t li = 0; li < fp.layout.params().size(); ++li) {
    const ParamSlot& slot = fp.layout.params()[li];
    at::Tensor& p = named[named_of_layout[li]].second;
    p.set_data(fp.flat.narrow(0, slot.flat_offset, slot.numel).view(p.sizes()));
    fp.params.push_back(p);
    fp.layout_of_named[named_of_layout[li]] = static_cast<int>(li);
  }
  return fp;
}

}  // namespace zero
