// A unit: a contiguous range of buckets of the engine's one FlatLayout (a UnitSlot) and the
// window of the ShardStore over it (docs/design/sharded-units.md §2). It steps its part of the
// master shard and publishes the new values into the parameters. Stages 0-2 are one unit over
// every bucket: the operations below are the engine's former update_and_publish,
// publish_parameters and publish_from, in the same order.
#pragma once

#include <ATen/core/Tensor.h>

#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "comm/group.hpp"
#include "zero/units/shard_store.hpp"
#include "zero/units/unit_storage.hpp"

namespace zero {

// How a unit's parameters get their values after the master changed.
enum class Publish {
  kNone,       // the master is the flat buffer (stage 0 fp32, one rank fp32)
  kCopy,       // stage 0 otherwise: one flat.copy_(master) after all updates
  kAllGather,  // stages 1, 2, stage 3's root: bucket b updated just before its all-gather
  kCastShard,  // stage 3's gathered units: nothing after the step; the next gather reads the
               // master (fp32), rounds it into its output (bf16/fp16, no compute shard kept),
               // or, under optimizer offload, sends the compute shard the CPU step's
               // compute-dtype copy was uploaded into
};
// Whether the unit's parameters are always there (stages 0-2, stage 3's root) or gathered on
// use and released after it (stage 3's units).
enum class Residency { kResident, kOnUse };

// All-gathers in flight, oldest first, bounded by allgather_bucket_size elements: what they
// hold (the cast temporaries) stays bounded while updates and gathers overlap.
class GatherQueue {
 public:
  explicit GatherQueue(int64_t bound) : bound_(bound) {}
  ~GatherQueue();
  // Launches the all-gather of `in` into `out` after waiting for the oldest ones while the
  // bound would be passed.
  void launch(comm::Group& group, at::Tensor out, at::Tensor in, const std::string& what);
  // Waits for every gather in flight; the seconds it waited, what the updates did not hide
  // (host-blocking on gloo; stream-ordered on NCCL).
  double drain();
  // Whether any gather was launched.
  bool used() const { return used_; }

 private:
  void wait_oldest();
  struct InFlight {
    comm::Work work;
    at::Tensor input;
    int64_t numel;
  };
  int64_t bound_;
  std::deque<InFlight> inflight_;
  int64_t inflight_numel_ = 0;
  bool used_ = false;
};

// The step's inputs, the same for every unit.
struct StepContext {
  at::Tensor grad;  // the gradient shard (grad_accum_dtype, or fp32 on the host); undefined
                    // where it is pieces (stage 3 on the device): read through `window`
  double lr = 0;
  optim::ShardOptimizer::Scalars scalars;
  // Shard elements [offset, offset + numel) inside one unit (GradSink::window).
  std::function<at::Tensor(int64_t offset, int64_t numel)> window;
};

class ShardedUnit {
 public:
  // `owner`: whose shard of each bucket this rank's master and states hold (Sharding::owner).
  // `gathers`: the group a kOnUse unit's gathers go over (stage 3: a communicator of their own,
  // split from dp, so that they never interleave with the gradient reduce-scatters on dp in an
  // order that depends on each rank's graph: review 06e H1); null: dp.
  ShardedUnit(ShardStore& store, comm::Group& dp, const UnitSlot& slot, std::string name,
              Residency residency, Publish publish, at::ScalarType param_dtype, int owner,
              comm::Group* gathers = nullptr);
  // Waits for gathers still in flight (an error between a gather and its wait): freeing the
  // buffer they write would hand its bytes to the next allocation while a collective still
  // writes them (review 06e L2). Each wait is bounded by the group's timeout; their errors are
  // dropped, the one that got here is being reported.
  ~ShardedUnit();
  ShardedUnit(const ShardedUnit&) = delete;
  ShardedUnit& operator=(const ShardedUnit&) = delete;
  const std::string& name() const { return name_; }
  const UnitSlot& slot() const { return slot_; }
  Publish publish_kind() const { return publish_; }
  Residency residency() const { return residency_; }
  int owner() const { return owner_; }

  // The optimizer's step counter, once per step before the first unit steps (ShardOptimizer::
  // begin_step: its checks read the first bucket's window of this unit).
  void begin_step(const StepContext& ctx);
  // The optimizer over this unit's buckets, then the new values into the parameters (gathers
  // queued in `q`; the caller drains it). Under optimizer offload the caller has called
  // OptimizerOffload::begin_publish once for the round (step or publish) and passes host
  // scalars (host_scalars), once for all units.
  void step(const StepContext& ctx, GatherQueue& q);
  // The master's values into the parameters without an update (after a checkpoint load).
  void publish(GatherQueue& q);

  // The unit's parameters in the compute dtype: layout elements [slot().flat_begin,
  // slot().flat_end), each parameter a view of its slot (stages 0-2: the whole flat buffer).
  // What reads the parameters' storage reads it here, not through FlatParams::flat, so that a
  // unit's own buffer (units::UnitStorage, stage 3) can replace the one flat tensor.
  at::Tensor buffer() const;
  // Parameter `s`'s values in the compute dtype, flat; `s` is one of the unit's parameters.
  at::Tensor param_values(const ParamSlot& s) const;
  // The unit's parameter bytes (the memory report's `params`): held between steps, and held only
  // while gathered (none for a resident unit).
  struct Bytes {
    int64_t resident = 0, gathered = 0;
  };
  Bytes bytes() const;

  // kOnUse only (stage 3). gather: fresh bytes for the unit's buffer and one all-gather per
  // bucket into it, from the compute shard (offload) or the master rounded into this rank's
  // slot of the output (in place; fp32: the master is the shard); wait: those done, the parameters
  // views of the buffer; release: a gather in flight waited for, the bytes freed (parameters
  // 0-element).
  void gather();
  void wait();
  void release();
  // Gathered or gathering (a resident unit always is).
  bool gathered() const;

  // What checkpoints, state_dict and the norm read of the unit.
  bool has_bucket(int b) const { return b >= slot_.first_bucket && b < slot_.end_bucket; }
  // The pieces of the unit's parameters that this rank's master and states hold (its owner's
  // shard of each of the unit's buckets; unsharded: all of them), in shard order.
  std::vector<OwnedPiece> owned_pieces() const;
  // Bucket b's part of the master as a tensor addressed like the shard
  // (FlatParams::master_window); b must be one of the unit's.
  at::Tensor master_window(const BucketSlot& b) const;
  // The optimizer's states by name, each addressed like the shard: the unit's elements are
  // [slot().shard_begin, slot().shard_end).
  std::vector<std::pair<std::string, at::Tensor>> optimizer_window() const;
  // Zeroes the unit's master and states, padding included (a load starts from a fresh engine's
  // values).
  void zero_master_and_states();
  // The unit's windows of the gradient shard that count in the norm: whole buckets when
  // `counted` is empty, else the owned pieces of the parameters it marks (layout indices).
  std::vector<optim::Range> norm_pieces(const std::vector<char>& counted) const;
  // A collective: each of the unit's buckets' fp32 master, whole (its shards all-gathered over
  // the group where the group runs), passed to f(bucket, values) in bucket order. With
  // `scratch`, its buffers (fp32, on the group's device, at least the unit's largest padded
  // bucket and, for a master elsewhere, its largest shard) are used for every bucket and
  // nothing is allocated outside f, so no rank can fail alone between two gathers (state_dict;
  // review 2026-12-07a L7); f must then copy what it keeps before it returns.
  struct GatherScratch {
    at::Tensor full;
    at::Tensor in;
  };
  void for_each_gathered_master(const std::function<void(const BucketSlot&, const at::Tensor&)>& f,
                                const GatherScratch* scratch = nullptr) const;

 private:
  // Copies (kCopy) or all-gathers (kAllGather) the master shards into the model; `before` runs
  // for each bucket just before its gather is launched.
  void publish_parameters(GatherQueue& q, const std::function<void(const BucketSlot&)>& before);
  // The same with each bucket's shard values, in the compute dtype on the device, from `source`
  // (which may update them first).
  void publish_from(GatherQueue& q, const std::function<at::Tensor(const BucketSlot&)>& source);
  // This rank's part of bucket b's all-gather output in the flat buffer. Under offload the new
  // values are uploaded straight there and the gather runs in place (its input inside its
  // output at the rank's offset, which NCCL and gloo both accept): no device temporary.
  at::Tensor own_part(const BucketSlot& b) const;
  // Where optimizer offload uploads bucket b's new compute-dtype values: own_part, or for a
  // kCastShard unit (stage 3) b's window of the compute shard, which the unit's gathers send.
  at::Tensor publish_dst(const BucketSlot& b) const;

  ShardStore& store_;
  comm::Group& dp_;
  comm::Group& gathers_;  // kOnUse gathers
  UnitSlot slot_;
  int index_ = 0;  // the slot's position in layout().units(), FlatParams::unit_buffers' index
  std::unique_ptr<units::UnitStorage> storage_;  // kOnUse only
  std::vector<comm::Work> pending_;              // gathers issued, not yet waited for
  std::string name_;
  Residency residency_;
  Publish publish_;
  at::ScalarType param_dtype_;
  int owner_;
};

}  // namespace zero
