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
#include "comm/gather_coalescing.hpp"
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
// The most output elements one coalesced parameter all-gather of stages 1-2 carries:
// allgather_bucket_size (DeepSpeed's elements gathered at a time), and no more than the
// per-bucket gathers it replaces could hold at once (zero/engine/engine.cpp says why).
int64_t publish_gather_bound(const FlatLayout& layout, int64_t allgather_bucket_size, int world);
// Stage 3's unit of each trainable parameter (by TensorImpl) from the zero::shard marks and the
// persistence thresholds (units::plan_units); `names` gets the plan's unit names.
std::unordered_map<const void*, int> plan_stage3_units(
    torch::nn::Module& model, const ZeroOptimizationConfig::Stage3Config& z3,
    std::vector<std::string>& names);
// A collective over `group` before the first one that depends on the layout: every rank planned
// the same units (names, parameter counts and sizes) and bucket size, or every rank throws naming
// the first unit that differs (review 06e L4). One all-gather of two numbers when they agree.
void agree_stage3_units(comm::Group& group, const at::Device& device,
                        const torch::nn::Module& model,
                        const std::unordered_map<const void*, int>& unit_of,
                        const std::vector<std::string>& names, int64_t bucket_numel);

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
  // Stage 3: the communicator the units' all-gathers go over (split from dp). Declared before
  // the units, which hold a reference to it, so that it outlives their destructors' waits.
  std::shared_ptr<comm::Group> unit_group;
  // Stages 0-2: the group the root unit publishes through, dp with its per-bucket all-gathers
  // coalesced into gathers of up to publish_gather_bound elements while step_units or
  // publish_units runs (comm/gather_coalescing.hpp). Null at stage 3. Like
  // unit_group, declared before the units that hold a reference to it.
  std::shared_ptr<comm::GatherCoalescingGroup> publish_group;
  std::vector<std::unique_ptr<ShardedUnit>> units;
  // Stage 3: what run_unit calls (the registry holds it weakly; ~Impl unbinds it), the index in
  // `units` of each bucket's and each layout parameter's unit, and per unit the gradients of its
  // parameters this backward pass still expects (the last one releases the unit; -1: released
  // when backward ends).
  std::shared_ptr<EngineUnits> unit_runtime;
  std::vector<int> unit_index_of_bucket;
  std::vector<int> unit_index_of_param;
  std::vector<int> unit_awaiting;
  // Stage 3: a unit's gradient buckets are reduced only once its boundary was reached in this
  // backward pass (`entered_in_pass`; the gathers' own communicator is `unit_group`, above the
  // units): each communicator then carries one sequence on every rank, whatever parameters a
  // rank's graph leaves unused (review 06e H1).
  std::vector<char> entered_in_pass;
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
  // copied (stage 0) or all-gathered (stages 1, 2: each bucket's gather queued after its
  // update, the queue gathered in as few collectives as allgather_bucket_size allows).
  void step_units(const StepContext& ctx);
  // The gradient shard's windows `ranges` (empty ones left out), and the shard's options: stage
  // 3 on the device holds it as pieces (GradSink::window).
  std::vector<at::Tensor> grad_windows(const std::vector<optim::Range>& ranges);
  at::TensorOptions grad_options();
  // Every unit's master values into the model, without a step (after a checkpoint load).
  void publish_units();
  // Stage 3 (zero/engine/engine_stage3.cpp): one unit per layout unit, the marked modules bound
  // to them, the gathered-on-use ones released.
  void make_stage3_units();
  // A collective: every layout parameter's values, whole, from the fp32 masters (in `dtype`).
  std::vector<at::Tensor> gathered_params(at::ScalarType dtype) const;
  // Stage 3: a backward pass expecting `expected` gradients per layout parameter starts; a
  // gradient of layout parameter `p` arrived (the unit's last expected one releases it).
  void begin_unit_pass(const std::vector<int>& expected);
  void on_unit_grad(int p);
  // Stage 3: whether bucket b may be reduced now (its unit is resident, or was entered in
  // this backward pass); unit k's boundary was reached in backward.
  bool may_launch(int b) const;
  void on_unit_entered_backward(int k);
  // Stage 3: a unit's forward began (its gather issued).
  void on_unit_entered_forward();
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
