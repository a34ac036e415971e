#include "zero/params/flat_params.hpp"

#include <ATen/ATen.h>
#include <torch/nn/module.h>

#include <c10/core/StorageImpl.h>
#include <malloc.h>

#include <algorithm>
#include <memory>
#include <unordered_map>

#include <c10/core/Event.h>
#include <c10/core/impl/VirtualGuardImpl.h>

#include "comm/unowned_view.hpp"
#include "device/event_wait.hpp"
#include "device/pinned_host.hpp"
#include "optim/cpu_adamw.hpp"
#include "zero/deferred_init.hpp"
#include "zero/units/unit_plan.hpp"

namespace zero {

namespace {

// The unit stage 3 keeps whole on every rank (units::UnitPlan::kRoot).
constexpr int kResidentUnit = units::UnitPlan::kRoot;

// A buffer of n elements whose bytes are already given back: its storage keeps the allocator
// (units::UnitStorage refills it when the unit is gathered) and reports 0 bytes. Made from an
// empty tensor, so that start-up never allocates (and frees) a whole unit on the device for it
// (review 2026-12-07a L6).
at::Tensor released_buffer(int64_t n, const at::TensorOptions& o) {
  at::Tensor t = at::empty({0}, o);
  c10::StorageImpl* s = t.storage().unsafeGetStorageImpl();
  s->set_data_ptr_noswap(at::DataPtr(nullptr, t.device()));
  s->set_nbytes(0);
  t.unsafeGetTensorImpl()->set_sizes_contiguous({n});
  return t;
}

// Host -> device copies of deferred start-up through two page-locked slots, so that they are
// queued on the current stream instead of each waiting for a pageable copy (review 2026-12-07a
// L6): a slot is refilled only after the event recorded behind its last copy. A copy that
// changes the dtype goes up in the source's dtype and is cast on the device (from pageable
// memory ATen would cast on the host and wait). On a CPU device: plain copies.
class StagingRing {
 public:
  static constexpr int64_t kSlotBytes = int64_t{16} << 20;

  explicit StagingRing(const at::Device& device) : device_(device) {
    if (device.is_cpu()) return;
    for (auto& slot : slots_) slot.host = device::host_zeros(kSlotBytes, /*pin=*/true, at::kByte);
  }
  ~StagingRing() {
    for (auto& slot : slots_) {
      if (slot.done) device::wait_for_event(*slot.done);
    }
  }
  StagingRing(const StagingRing&) = delete;
  StagingRing& operator=(const StagingRing&) = delete;

  // dst (on the device, contiguous) = src (host, contiguous, same numel).
  void upload(const at::Tensor& dst, const at::Tensor& src) {
    const at::Device to = dst.device();
    if (device_.is_cpu() || to.is_cpu()) {  // a host master (optimizer offload)
      dst.copy_(src);
      return;
    }
    const int64_t step = kSlotBytes / static_cast<int64_t>(src.element_size());
    const c10::impl::VirtualGuardImpl impl(to.type());
    for (int64_t at = 0; at < src.numel(); at += step) {
      const int64_t n = std::min(step, src.numel() - at);
      Slot& slot = slots_[next_];
      next_ = 1 - next_;
      if (slot.done) device::wait_for_event(*slot.done);
      at::Tensor staged = slot.host.narrow(0, 0, n * src.element_size()).view(src.scalar_type());
      staged.copy_(src.narrow(0, at, n));
      at::Tensor out = dst.narrow(0, at, n);
      if (out.scalar_type() == staged.scalar_type()) {
        out.copy_(staged, /*non_blocking=*/true);
      } else {
        out.copy_(staged.to(to, /*non_blocking=*/true));
      }
      if (!slot.done) slot.done = std::make_unique<c10::Event>(to.type());
      slot.done->record(impl.getStream(to));
    }
  }

 private:
  struct Slot {
    at::Tensor host;
    std::unique_ptr<c10::Event> done;
  };
  at::Device device_;
  Slot slots_[2];
  int next_ = 0;
};

at::Tensor bucket_buffer(const FlatParams& fp, const std::vector<int>& unit_of_bucket,
                         int bi) {
  const BucketSlot& b = fp.layout.buckets()[bi];
  if (fp.flat.defined()) return fp.flat.narrow(0, b.flat_offset, b.shard.padded_numel());
  const int u = unit_of_bucket[bi];
  return fp.unit_buffers[u].narrow(0, b.flat_offset - fp.layout.units()[u].flat_begin,
                                   b.shard.padded_numel());
}

// The buffers the fills write: `flat` or, at stage 3, one buffer per unit; the master shard; the
// stage-3 compute shard. Returns each bucket's unit (stage 3). `from_values`: everything zeroed
// (a rank writes only what it keeps; padding stays 0), and a unit gathered on use starts with
// its bytes freed, so that start-up holds its shard and no whole unit beyond the root.
std::vector<int> allocate_flat_and_master(FlatParams& fp, const at::Device& device,
                                          const FlattenOptions& opts, bool from_values) {
  const auto f32 = at::TensorOptions().dtype(at::kFloat).device(device);
  const bool fp32 = opts.param_dtype == at::kFloat;
  const bool whole = opts.shards == 1;
  const auto compute = f32.dtype(opts.param_dtype);
  const auto make = [&](int64_t n, const at::TensorOptions& o) {
    return from_values ? at::zeros({n}, o) : at::empty({n}, o);
  };
  std::vector<int> unit_of_bucket;
  if (opts.unit_buffers) {
    for (const UnitSlot& u : fp.layout.units()) {
      const int64_t n = u.flat_end - u.flat_begin;
      fp.unit_buffers.push_back(from_values && u.unit != kResidentUnit ? released_buffer(n, compute)
                                                                       : make(n, compute));
      for (int b = u.first_bucket; b < u.end_bucket; ++b) {
        unit_of_bucket.push_back(static_cast<int>(fp.unit_buffers.size()) - 1);
      }
    }
  } else {
    fp.flat = make(fp.layout.total_numel(), compute);
  }
  fp.compute_options = opts.unit_buffers ? fp.unit_buffers.front().options() : fp.flat.options();
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
      fp.master = make(fp.layout.shard_numel(), f32);
      break;
    case Storage::kInFlat:
      break;
  }
  if (opts.unit_buffers) {
    // Under optimizer offload the master is in host memory, and the gather source stays on the
    // device: a compute-dtype shard of its own, fp32 included (DeepSpeed's stage 3 keeps the
    // fp16 partition on the device and the fp32 one on the host alike). fp32 on the device: the
    // master is the shard. bf16/fp16 on the device: none; each gather rounds the master into
    // its output (ShardedUnit::gather), as FSDP2's MixedPrecisionPolicy casts the sharded fp32
    // parameter at each all-gather: 12Ψ/N of model states, not 14Ψ/N (issue 33).
    if (fp.storage == Storage::kShard) fp.shard = fp.master;
    if (fp.storage == Storage::kHost) fp.shard = make(fp.layout.shard_numel(), compute);
  }
  return unit_of_bucket;
}

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
  // The buffer each bucket lives in, and the bucket's offset there: `flat`, or at stage 3 its
  // unit's own buffer.
  const std::vector<int> unit_of_bucket = allocate_flat_and_master(fp, device, opts, false);
  const int r = whole ? 0 : group.rank();
  fp.shard_rank = r;
  const auto& buckets = fp.layout.buckets();
  for (size_t bi = 0; bi < buckets.size(); ++bi) {
    const BucketSlot& b = buckets[bi];
    const int64_t padded = b.shard.padded_numel();
    at::Tensor flat_b = bucket_buffer(fp, unit_of_bucket, static_cast<int>(bi));
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

// Fills from a deferred model's source (deferred_init.hpp) instead of broadcasting rank 0's
// tensors: every rank asks the source, parameter by parameter in registration order, for the
// elements it keeps - its shard of each bucket for the master (and, at stage 3, the compute
// shard), and every element of a parameter held whole (stages 0-2: all of them; stage 3: the
// root unit's). Nothing is broadcast: the source gives every rank the same values. Host memory
// beyond the final buffers: one parameter in fp32 (the pieces the source writes).
void fill_from_values(FlatParams& fp, std::vector<std::pair<std::string, at::Tensor>>& named,
                      const std::vector<int>& named_of_layout, comm::Group& group,
                      const FlattenOptions& opts) {
  const at::Device device = named.front().second.device();
  const std::vector<int> unit_of_bucket = allocate_flat_and_master(fp, device, opts, true);
  const auto compute = at::TensorOptions().dtype(opts.param_dtype).device(device);
  const auto host = at::TensorOptions().dtype(at::kFloat);
  const int r = opts.shards == 1 ? 0 : group.rank();
  fp.shard_rank = r;
  StagingRing ring(device);
  std::vector<int> layout_of(named.size(), -1);
  for (size_t li = 0; li < named_of_layout.size(); ++li) {
    layout_of[named_of_layout[li]] = static_cast<int>(li);
  }
  const InitialValues& values = *opts.values;
  for (size_t i = 0; i < named.size(); ++i) {
    auto& [name, p] = named[i];
    const int li = layout_of[i];
    if (li < 0) {
      // Frozen (or empty): whole on every rank, in the compute dtype as a materialised one.
      at::Tensor v = at::empty({p.numel()}, host);
      values(name, p.sizes(), {ParamPiece{0, v}});
      p.set_data(v.to(compute).view(p.sizes()));
      continue;
    }
    const ParamSlot& s = fp.layout.params()[li];
    const BucketSlot& b = fp.layout.buckets()[s.bucket];
    const bool whole = !opts.unit_buffers ||
                       fp.layout.units()[unit_of_bucket[s.bucket]].unit == kResidentUnit;
    // This rank's shard of the bucket, in the parameter's element coordinates.
    const int64_t own = b.flat_offset + b.shard.shard(r).begin - s.flat_offset;
    const int64_t begin = std::max<int64_t>(0, own);
    const int64_t end = std::min<int64_t>(s.numel, own + b.shard.shard_numel());
    at::Tensor v;  // the pieces asked for, one tensor
    std::vector<ParamPiece> pieces;
    if (whole) {
      v = at::empty({s.numel}, host);
      pieces.push_back({0, v});
    } else if (begin < end) {
      v = at::empty({end - begin}, host);
      pieces.push_back({begin, v});
    }
    values(name, p.sizes(), pieces);
    if (whole) {
      at::Tensor slot =
          bucket_buffer(fp, unit_of_bucket, s.bucket).narrow(0, s.flat_offset - b.flat_offset,
                                                             s.numel);
      ring.upload(slot, v);
      p.set_data(slot.view(p.sizes()));
    } else {
      // A unit gathered on use starts released: units::UnitStorage reads the shape off this.
      p.set_data(at::zeros({1}, compute).expand(p.sizes()));
    }
    if (begin >= end) continue;
    // Where those elements sit in the master and the compute shard.
    const int64_t at_shard = b.shard_offset + begin - own;
    const at::Tensor kept = whole ? v.narrow(0, begin, end - begin) : v;
    const bool own_master = fp.master.defined() && !fp.master_aliases_flat();
    if (own_master) ring.upload(fp.master.narrow(0, at_shard, end - begin), kept);
    if (fp.shard.defined() && !fp.shard.is_same(fp.master)) {
      at::Tensor shard = fp.shard.narrow(0, at_shard, end - begin);
      // Rounded on the device from the master just uploaded, as fill_flat_and_master does
      // (the same round-to-nearest-even as the host's cast: the same bits).
      if (own_master && fp.master.device() == fp.shard.device()) {
        shard.copy_(fp.master.narrow(0, at_shard, end - begin));
      } else {
        ring.upload(shard, kept);
      }
    }
  }
  // The per-parameter fp32 transients (and the model's construction before them) were freed
  // into glibc's heaps, which keep freed memory resident once its mmap threshold has risen past
  // a parameter's size: give it back, or the process's RSS keeps a model's worth of it.
  ::malloc_trim(0);
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
  const bool from_values = opts.values != nullptr && *opts.values;
  for (auto& [name, t] : named) {
    // A deferred parameter has no values to broadcast; a materialised one has no source.
    TORCH_CHECK(from_values || !is_deferred(t), "zero: parameter '", name,
                "' is deferred (zero::defer_parameters, or a model built with zero::Deferred) "
                "but zero::initialize got no InitialValues to fill it from; pass the model's "
                "source: zero::initialize(model, cfg, group, values)");
    TORCH_CHECK(!from_values || is_deferred(t), "zero: parameter '", name,
                "' holds values but zero::initialize was given InitialValues, which fill only "
                "deferred parameters; build the whole model deferred (zero::defer_parameters) "
                "or drop the InitialValues");
    TORCH_CHECK(t.device() == device, "zero: parameter '", name, "' is on ", t.device(), " but '",
                named.front().first, "' is on ", device,
                "; move the whole model to one device before zero::initialize");
    TORCH_CHECK(at::isFloatingType(t.scalar_type()), "zero: parameter '", name, "' has dtype ",
                t.scalar_type(), "; only floating-point parameters can train");
    if (!t.requires_grad() && !from_values) {
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

  if (from_values) {
    fill_from_values(fp, named, named_of_layout, group, opts);
  } else {
    fill_flat_and_master(fp, named, named_of_layout, group, opts);
  }
  fp.layout_of_named.assign(named.size(), -1);
  for (size_t li = 0; li < fp.layout.params().size(); ++li) {
    fp.params.push_back(named[named_of_layout[li]].second);
    fp.layout_of_named[named_of_layout[li]] = static_cast<int>(li);
  }
  return fp;
}

}  // namespace zero
