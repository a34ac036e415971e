// Engine::Impl, the engine's state, shared by the files that implement Engine's members
// (engine.cpp: initialize and step; step_protocol.cpp: backward; engine_memory.cpp: the memory
// report; checkpoint files: save and load). Private to zero/.
//
// Impl = Topology (the groups) + StepProtocol (accumulation, loss scale, verdict, call order)
// + ShardStore (the per-rank state) + the units that are windows of it (stages 0-2: one unit
// over every bucket; docs/design/sharded-units.md).
#pragma once

#include <ATen/ATen.h>

#include <functional>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "comm/entries.hpp"
#include "comm/group.hpp"
#include "device/host_readback.hpp"
#include "zero/engine.hpp"
#include "zero/engine/engine_units.hpp"
#include "zero/engine/step_protocol.hpp"
#include "zero/engine/topology.hpp"
#include "zero/grads/grad_hooks.hpp"
#include "zero/grads/grad_order.hpp"
#include "zero/grads/grad_sync.hpp"
#include "zero/grads/partial_grads.hpp"
#include "zero/params/flat_params.hpp"
#include "zero/params/sharding.hpp"
#include "zero/step/loss_scaler.hpp"
#include "zero/step/optimizer_factory.hpp"
#include "zero/step/optimizer_offload.hpp"
#include "zero/units/shard_store.hpp"
#include "zero/units/sharded_unit.hpp"

namespace zero {

at::ScalarType to_scalar_type(Dtype d);
// initialize(model, cfg)'s ConfigError for tensor_parallel.autotp_size or pipeline.stages > 1,
// naming the call to use instead (initialize_mesh.cpp).
void refuse_model_parallel_without_mesh(const Config& cfg);
// initialize(model, cfg, group) for a model with tensor-parallel layers split over more than one
// rank: it would train, clipping each tp rank by its own shard's norm. Refused, naming the mesh.
void refuse_tensor_parallel_model_on_one_group(const torch::nn::Module& model);
// Stage 3's unit of each trainable parameter (by TensorImpl) from the zero::shard marks and the
// persistence thresholds (units::plan_units); `names` gets the plan's unit names.
std::unordered_map<const void*, int> plan_stage3_units(
    torch::nn::Module& model, const ZeroOptimizationConfig::Stage3Config& z3,
    std::vector<std::string>& names);

struct Engine::Impl : Topology, StepProtocol {
  Config cfg;
  std::shared_ptr<torch::nn::Module> module;
  // The calls a program makes itself on every rank, announced over dp's store: a rank that did
  // not enter one is named within seconds (comm/entries.hpp). Null before initialize sets it.
  std::unique_ptr<comm::Entries> entries;
  Sharding sharding;                   // what the stage shards (zero/params/sharding.hpp)
  // Per layout parameter whether this rank counts it in the gradient norm (not when it is
  // replicated across a norm group whose rank 0 this rank is not). Empty without norm groups.
  std::vector<char> norm_counted;
  // groups.norm's `partial` parameters: their gradients summed over the group at the step, after
  // the data-parallel reduction, in one all-reduce (zero/grads/partial_grads.hpp). Empty without
  // any.
  PartialGradSum partial_sum;
  at::ScalarType param_dtype = at::kFloat;
  FlattenOptions flat_opts;
  // The per-rank state the units share (zero/units/shard_store.hpp): flat parameters and master
  // shard, the gradient path, the optimizer, optimizer offload. Stages 0-2: one unit over every
  // bucket.
  ShardStore store;
  std::vector<std::unique_ptr<ShardedUnit>> units;
  // Stage 3: what run_unit calls (the registry holds it weakly; ~Impl unbinds it), the index in
  // `units` of each bucket's unit, and per unit how many of its buckets this backward pass
  // launched (the last one releases the unit).
  std::shared_ptr<EngineUnits> unit_runtime;
  std::vector<int> unit_index_of_bucket;
  std::vector<int> launched_in_pass;
  bool release_on_launch = false;
  // By plan unit id: "<root>", then the marked modules.
  std::vector<std::string> unit_names;
  // Each layout parameter's shape (stage 3's released parameters are 0-element tensors).
  std::vector<std::vector<int64_t>> param_shapes;
  // The store's members by their short names.
  FlatParams& fp = store.fp;
  std::unique_ptr<GradSync>& sync = store.grads;
  std::unique_ptr<OptimizerOffload>& offload = store.offload;
  GradSyncOptions sync_opts;
  std::vector<int> bucket_order;  // the buckets' release order once agreed; empty: index order
  std::unique_ptr<GradOrder> order;
  GradHooks hooks;
  int64_t allocator_delta = 0;  // allocated_bytes() over initialize
  int64_t replaced_param_bytes = 0;  // the model's trainable parameters before initialize
  // Page-locked host buffer of save/load_checkpoint for states on the device (one bucket's
  // shard), kept from one checkpoint to the next: allocating and freeing page-locked memory
  // each time costs cudaHostAlloc's page locking and cudaFreeHost's device synchronisation.
  at::Tensor checkpoint_staging;

  ~Impl();

  // Takes in the last step's verdict: the norm for stats, and for an overflow the skipped-step
  // bookkeeping (the device already left the weights alone). On CUDA this waits only for the
  // work queued up to that step's end, which is normally long done.
  void settle();
  // Announces the collective `call` ("save_checkpoint") and returns once every rank of dp
  // entered it; throws CommError naming a rank that cannot (comm/entries.hpp).
  void enter(const std::string& call) const {
    if (entries) entries->enter(call);
  }

  // Called by the post-accumulate-grad hook of parameter `index` (layout index).
  void on_grad(int index, const at::Tensor& param);
  // The optimizer step over every unit, each publishing its updated values into the model:
  // copied (stage 0) or all-gathered bucket by bucket as each bucket's update is queued
  // (stages 1, 2).
  void step_units(const StepContext& ctx);
  // Every unit's master values into the model, without a step (after a checkpoint load).
  void publish_units();
  // Stage 3 (zero/engine/engine_stage3.cpp): one unit per layout unit, the marked modules bound
  // to them, the gathered-on-use ones released.
  void make_stage3_units();
  // A collective: every layout parameter's values, whole, from the fp32 masters (in `dtype`).
  std::vector<at::Tensor> gathered_params(at::ScalarType dtype) const;
  // Stage 3: a bucket's reduction was launched in backward; the unit's last one releases it.
  void on_bucket_launched(int b);
  // Stage 3: every unit gathered on use that is still gathered, released (the end of each
  // backward, failed ones too: nothing gathered survives into step()).
  void release_gathered_units();
  // The unit holding bucket `b`.
  ShardedUnit& unit_of(int b) const {
    for (const auto& u : units) {
      if (u->has_bucket(b)) return *u;
    }
    TORCH_INTERNAL_ASSERT(false, "zero: bucket ", b, " is in no unit");
  }

  // One micro-step's backward: walks `roots`' graph for the parameters it reaches, runs `run`
  // (autograd) with the hooks armed, finishes the reductions; on failure discards the window.
  void run_backward(const std::vector<at::Tensor>& roots, const std::function<void()>& run);
  // The squared global gradient norm, a one-element fp32 tensor on the device: over dp, then
  // each norm group.
  at::Tensor squared_grad_norm();
  // fp16 with norm groups: 0, or NaN when a gradient piece this rank leaves out of the norm
  // (counted on another rank of a norm group) is not finite; this rank's alone, a one-element
  // fp32 tensor on the shard's device. Undefined when there is nothing to check.
  at::Tensor uncounted_overflow();
  // From groups.norm: norm_groups and norm_counted (zero/engine/grad_norm.cpp).
  void set_norm_groups();

  // The gradient path for the current layout (zero/engine/engine.cpp).
  void make_sync();
  // After a backward that threw: discards the accumulation window (zero/engine/engine.cpp).
  void discard_window();
  // Between the first two accumulation windows: agrees on the first pass's arrival order and
  // from then on reduces buckets in the order they completed in it; the layout stays
  // (zero/engine/release_order.cpp).
  void apply_arrival_order();
};

}  // namespace zero
