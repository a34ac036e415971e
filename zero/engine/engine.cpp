// The engine: wires the flat parameters, the gradient path of the chosen stage, the optimizer
// and the parameter all-gather into backward() and step().
#include "zero/engine.hpp"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/nn/module.h>

#include <algorithm>
#include <cmath>
#include <iostream>
#include <unordered_set>
#include <utility>

#include "comm/agree.hpp"
#include "comm/launcher_env.hpp"
#include "zero/auto_strategy.hpp"
#include "zero/compress/node_layout.hpp"
#include "zero/device.hpp"
#include "zero/engine/engine_impl.hpp"
#include "zero/host_counting.hpp"
#include "zero/memory.hpp"
#include "zero/step/deepspeed_norm.hpp"
#include "zero/units/unit_registry.hpp"

namespace zero {

at::ScalarType to_scalar_type(Dtype d) {
  switch (d) {
    case Dtype::kFloat32:
      return at::kFloat;
    case Dtype::kBFloat16:
      return at::kBFloat16;
    case Dtype::kFloat16:
      return at::kHalf;
  }
  return at::kFloat;
}

Engine::Impl::~Impl() {
  // The hooks point at this object: detach them so a model that outlives its engine is safe.
  hooks.remove();
  // run_unit stops finding this engine's units (the registry holds the runtime weakly; this
  // drops the entries at once).
  if (unit_runtime) units::unbind(*unit_runtime);
}

void Engine::Impl::on_grad(int index, const at::Tensor& param) {
  TORCH_CHECK(in_backward, "zero: a gradient of '", fp.layout.params()[index].name,
              "' arrived outside engine.backward(); call engine.backward(loss) instead of "
              "loss.backward()");
  order->on_grad(index);
  at::Tensor& grad = const_cast<at::Tensor&>(param).mutable_grad();
  // Counted as a gradient the engine holds from here (CPU peaks' split; nothing otherwise). The
  // counter is checked first: a storage-less gradient (sparse, mkldnn) must reach sync's own check.
  if (HostCountingAllocator::installed() && grad.defined() && grad.is_cpu() && grad.has_storage()) {
    HostCountingAllocator::retag(grad.storage().data(), HostTag::kUnitGrads);
  }
  sync->on_grad(index, grad);
  // The engine owns the gradient now; freeing autograd's copy is what makes stage 2 save memory.
  grad.reset();
  if (unit_runtime) on_unit_grad(index);
}

void Engine::Impl::make_sync() {
  // Stage 1 keeps a full accumulator only where it needs one: across the micro-steps of an
  // accumulation window, or to reduce after backward (overlap_comm off, as DeepSpeed's ZeRO-1
  // does then). Otherwise it reduces during backward exactly as stage 2 does, and holds what
  // stage 2 holds (accumulated_grads.cpp says what the accumulator costs it).
  const bool partitioned = !sharding.keeps_full_gradient(accumulation, sync_opts.overlap);
  sync = partitioned ? make_partitioned_grads(fp.layout, *group, sync_opts)
                     : make_accumulated_grads(fp.layout, *group, sharding.optimizer, sync_opts);
  if (!bucket_order.empty()) sync->set_release_order(bucket_order);
  if (unit_runtime) sync->set_launch_gate([this](int b) { return may_launch(b); });
}

namespace {

// An NCCL group runs every collective on the GPU it was bound to (LOCAL_RANK's), whatever
// device the tensors are on: a model on another GPU would make each collective read memory of
// the wrong device, or wait on a stream nobody feeds, and hang. Checked before the first
// collective, and agreed over the group: a rank alone on the wrong GPU must not throw while its
// peers wait for it in the parameter broadcast until comm_timeout_s. The agreement itself runs
// on the bound device, the one the group's collectives use on every rank (the bad rank's too).
void check_bound_device(comm::Group& group, const at::Device& device) {
  const std::optional<c10::Device> bound = group.bound_device();
  if (!bound) return;
  std::string error;
  if (bound->type() == device.type() && device.has_index() && *bound != device) {
    std::string launcher;
    try {
      const comm::LaunchInfo info = comm::read_launch_env();
      if (info.launcher != "none") {
        launcher = " (the launcher, " + info.launcher +
                   ", set LOCAL_RANK=" + std::to_string(info.local_rank) + ")";
      }
    } catch (const std::exception&) {
      // An incomplete launcher environment: the message goes without it.
    }
    error = "the model is on " + device.str() + " but the process group (" + group.name() +
            ", rank " + std::to_string(group.rank()) + ") is bound to " + bound->str() + launcher +
            "; its collectives would run on the other device and hang. Move the model to " +
            bound->str() +
            " before initialize (torch::Device(torch::kCUDA, LOCAL_RANK), as the examples do), "
            "or start one rank per GPU so that LOCAL_RANK names the model's GPU";
  }
  const std::string agreed =
      comm::agree_errors(group, error, *bound, "the check of the model's device");
  TORCH_CHECK(agreed.empty(), "zero::initialize: every rank stops, ", agreed);
}

}  // namespace

int64_t publish_gather_bound(const FlatLayout& layout, int64_t allgather_bucket_size, int world) {
  int64_t largest = 0;
  for (const BucketSlot& b : layout.buckets()) largest = std::max(largest, b.shard.padded_numel());
  // Gloo stages a gather's output in a flat buffer of its size (a coalesced one its inputs as
  // well, 1/world of that), and ran the per-bucket gathers two at a time (its two worker
  // threads). The coalesced gathers go one at a time: at most 2 x largest x world / (world + 1)
  // output elements each hold no more than two bucket gathers could, so the step's peak stays
  // where it was. NCCL stages nothing.
  const int64_t held = 2 * largest * world / (world + 1);
  return std::max<int64_t>(1, std::min(allgather_bucket_size, held));
}

void Engine::Impl::step_units(const StepContext& ctx) {
  // Declared before the queue: the queue's drain (or its destructor) launches the coalesced
  // gathers and waits for them before the window closes.
  comm::CoalescingWindow window(publish_group.get());
  GatherQueue q(cfg.zero_optimization.allgather_bucket_size);
  // Stage 3: a unit still gathered (prefetched by a forward run after backward) would keep the
  // values from before the step.
  if (unit_runtime) release_gathered_units();
  StepContext c = ctx;
  if (offload) {
    // Once a step, not per unit (review 2026-12-07a L4): the previous step's uploads out of
    // staging finished, and the scalars' one device read (fp16: found_inf, grad_scale).
    offload->begin_publish();
    c.scalars = OptimizerOffload::host_scalars(ctx.scalars);
  }
  units.front()->begin_step(c);
  for (auto& u : units) u->step(c, q);
  // What the updates did not hide (host-blocking on gloo; stream-ordered on NCCL); at stage 3
  // also the units' gathers that forward and backward waited for since the last step.
  const double wait = q.used() ? q.drain() : 0.0;
  if (unit_runtime) stats.allgather_wait_seconds = wait + unit_runtime->take_wait_seconds();
  else if (q.used()) stats.allgather_wait_seconds = wait;
}

void Engine::Impl::publish_units() {
  comm::CoalescingWindow window(publish_group.get());
  GatherQueue q(cfg.zero_optimization.allgather_bucket_size);
  if (unit_runtime) release_gathered_units();
  if (offload) offload->begin_publish();
  for (auto& u : units) u->publish(q);
  if (q.used()) stats.allgather_wait_seconds = q.drain();
}

Engine::Engine(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Engine::Engine(Engine&&) noexcept = default;
Engine& Engine::operator=(Engine&&) noexcept = default;
Engine::~Engine() = default;

std::shared_ptr<Group> process_group_from_env(const Config& cfg, c10::DeviceType device) {
  comm::GroupOptions go;
  go.timeout = cfg.comm_timeout;
  go.device = device;
  return comm::Group::from_env(go);
}

Engine initialize(std::shared_ptr<torch::nn::Module> model, Config cfg) {
  // Before the process group: every rank refuses alike, with nothing to wait for.
  refuse_model_parallel_without_mesh(cfg);
  c10::DeviceType device = c10::DeviceType::CPU;
  for (const auto& p : model->parameters()) {
    device = p.device().type();
    break;
  }
  auto group = process_group_from_env(cfg, device);
  return initialize(std::move(model), std::move(cfg), std::move(group));
}

Engine initialize(std::shared_ptr<torch::nn::Module> model, Config cfg,
                  std::shared_ptr<Group> public_group) {
  TORCH_CHECK(public_group, "zero::initialize: the process group is null");
  TORCH_CHECK(model, "zero::initialize: the model is null");
  refuse_tensor_parallel_model_on_one_group(*model);
  return initialize(std::move(model), std::move(cfg), Groups{std::move(public_group), {}});
}

Engine initialize(std::shared_ptr<torch::nn::Module> model, Config cfg,
                  std::shared_ptr<Group> public_group, const InitialValues& values) {
  TORCH_CHECK(public_group, "zero::initialize: the process group is null");
  TORCH_CHECK(model, "zero::initialize: the model is null");
  refuse_tensor_parallel_model_on_one_group(*model);
  return initialize(std::move(model), std::move(cfg), Groups{std::move(public_group), {}},
                    values);
}

Engine initialize(std::shared_ptr<torch::nn::Module> model, Config cfg, Groups groups) {
  return initialize(std::move(model), std::move(cfg), std::move(groups), InitialValues{});
}

Engine initialize(std::shared_ptr<torch::nn::Module> model, Config cfg, Groups groups,
                  const InitialValues& values) {
  TORCH_CHECK(model, "zero::initialize: the model is null");
  TORCH_CHECK(groups.dp, "zero::initialize: groups.dp (the data-parallel process group) is null");
  for (size_t i = 0; i < groups.norm.size(); ++i) {
    TORCH_CHECK(groups.norm[i].group, "zero::initialize: groups.norm[", i,
                "].group is null; leave groups.norm empty to take the norm over dp alone");
  }
  std::shared_ptr<comm::Group> group = comm::of(groups.dp);
  const at::Device device =
      model->parameters().empty() ? at::Device(at::kCPU) : model->parameters().front().device();
  // The model's GPU becomes this thread's current device: what the engine allocates or
  // launches without naming a device (streams, events, the caching allocator's defaults)
  // follows it, and would otherwise make a context on GPU 0 from every rank.
  set_current_device(device);
  check_bound_device(*group, device);
  const int64_t allocated_before = allocated_bytes(device);
  int64_t replaced = 0;
  std::unordered_set<const void*> seen;  // tied weights once
  for (const auto& p : model->parameters()) {
    // A deferred parameter held no bytes of its own (deferred_init.hpp).
    if (p.requires_grad() && !is_deferred(p) && seen.insert(p.unsafeGetTensorImpl()).second) {
      replaced += static_cast<int64_t>(p.nbytes());
    }
  }
  auto impl = std::make_unique<Engine::Impl>();
  impl->replaced_param_bytes = replaced;
  if (cfg.zero_optimization.stage_auto) {
    // The application did not resolve "auto" with its model's shape (resolve_auto): plan the
    // stage for the model states alone.
    AutoTarget t;
    for (const auto& p : model->parameters()) {
      t.num_params += p.numel();
      t.device = p.device();
      if (!p.is_cpu() && !is_deferred(p)) t.held_bytes += static_cast<int64_t>(p.nbytes());
    }
    resolve_auto(cfg, t, *group);
  }
  cfg.resolve_batch(group->size());
  impl->cfg = std::move(cfg);
  const Config& c = impl->cfg;
  impl->module = std::move(model);
  impl->group = std::move(group);
  // Before the parameter broadcast: every rank's first position is in the store by the time any
  // rank leaves initialize.
  impl->entries = std::make_unique<comm::Entries>(impl->group);
  impl->groups = std::move(groups);
  TORCH_CHECK(c.zero_optimization.stage >= 0 && c.zero_optimization.stage <= 3,
              "zero: zero_optimization.stage ", c.zero_optimization.stage,
              " is not a ZeRO stage; set 0, 1, 2 or 3");
  impl->sharding =
      Sharding::of_stage(c.zero_optimization.stage, impl->group->rank(), impl->group->size());
  impl->accumulation = c.gradient_accumulation_steps;
  impl->param_dtype = to_scalar_type(c.param_dtype());
  const double world = impl->group->size();
  impl->predivide = c.prescale_gradients
                        ? world
                        : c.gradient_predivide_factor.value_or(c.fp16.enabled ? world : 1);
  if (impl->group->rank() == 0) {
    for (const auto& w : c.warnings) {
      // Some notes carry their own "zero: " prefix; print it once.
      std::cerr << "zero: warning: " << (w.rfind("zero: ", 0) == 0 ? w.substr(6) : w) << "\n";
    }
  }

  FlattenOptions& fo = impl->flat_opts;
  fo.param_dtype = impl->param_dtype;
  fo.bucket_numel = c.zero_optimization.reduce_bucket_size;
  fo.shards = impl->sharding.shards;
  const auto& off = c.zero_optimization.offload_optimizer;
  const bool stage3 = impl->sharding.params;
  // Stage 3 under tensor parallelism: each unit holds the dp shard of this tp rank's
  // parameters, gathered over dp alone, and the norm sums over groups.norm as at stage 2.
  // (Pipelines refuse stage 3 themselves: PipelineEngine, config_pipeline.cpp.)
  if (stage3) {
    fo.unit_of = plan_stage3_units(*impl->module, c.zero_optimization.stage3, impl->unit_names);
    agree_stage3_units(*impl->group, device, *impl->module, fo.unit_of, impl->unit_names,
                       fo.bucket_numel);
    fo.unit_buffers = true;
  }
  if (off.enabled) {
    // The config refuses offload at stage 0; an application could set the field.
    TORCH_CHECK(impl->sharding.optimizer, "zero: ", c.source,
                ": zero_optimization.offload_optimizer needs ZeRO stage 1, 2 or 3, got stage ",
                impl->sharding.stage(), "; set zero_optimization.stage: 2 or turn the offload off");
    fo.host_master = true;
    fo.pin_memory = off.pin_memory;
    impl->sync_opts.host_shard = true;
    impl->sync_opts.pin_memory = off.pin_memory;
    impl->offload = std::make_unique<OptimizerOffload>(off, impl->param_dtype, device);
  }
  if (values) fo.values = &values;
  impl->fp = flatten_parameters(*impl->module, *impl->group, fo);
  for (const at::Tensor& p : impl->fp.params) impl->param_shapes.push_back(p.sizes().vec());
  if (impl->offload) impl->offload->reserve(impl->fp.master.numel());

  GradSyncOptions& so = impl->sync_opts;
  so.comm_dtype = to_scalar_type(c.communication_data_type.value_or(c.param_dtype()));
  TORCH_CHECK(c.accum_dtype() == Dtype::kFloat32 || c.accum_dtype() == c.param_dtype(),
              "zero: data_types.grad_accum_dtype ", dtype_name(c.accum_dtype()), " with ",
              dtype_name(c.param_dtype()),
              " parameters: gradients accumulate in fp32 or in the model dtype; set fp32");
  so.accum_dtype = to_scalar_type(c.accum_dtype());
  so.device = impl->fp.device();
  so.overlap = c.zero_optimization.overlap_comm;
  so.reduce_scatter = c.zero_optimization.reduce_scatter;
  // Stage 3 holds between steps only what FSDP2 does (parameter shard, master, optimizer
  // states): the gradient shard and the bucket buffers exist from the window's first reduction
  // to the step (grad_sync.hpp).
  so.release_between_steps = stage3;
  const auto& qg = c.zero_optimization.quantized_gradients;
  so.compress = {qg.enabled, qg.bits, qg.block, qg.error_feedback, qg.hierarchical,
                 compress::residual_store(qg.error_feedback_dtype, so.comm_dtype)};
  // Stage 3 keeps 16/N bytes a parameter on the device; a residual of the whole gradient there
  // would undo that (review 2026-12-07a M2), so its residuals live in host memory, one slot
  // staged per reduction (error_feedback.hpp). On CPU nothing moves.
  if (impl->sharding.stage() == 3) so.compress.feedback_residence = compress::Residence::kHost;
  // A verdict on the residuals reaches the whole mesh, not one dp group (review 07d M1).
  for (const auto& n : impl->groups.norm) so.compress.agree_also.push_back(comm::of(n.group));
  // Their host-memory check counts what offload allocates after them (host_room.hpp).
  if (impl->offload) {
    const int64_t shard = impl->fp.layout.shard_numel();
    const int64_t states = 4 * optimizer_state_count(c) * shard;
    const int64_t grads = host_shard_bytes(shard, impl->fp.layout.chunk_numel(), so);
    so.compress.host_later = states + grads;
    so.compress.host_later_what = "offload_optimizer: " + format_bytes(states) +
                                  " of optimizer states, " + format_bytes(grads) +
                                  " of gradient shard and its landing ring";
  }
  // The node of each data-parallel rank, from the launcher's ranks per node: the compressed
  // reduction goes within the node first when the group spans nodes (node_layout.hpp).
  if (qg.enabled && qg.hierarchical) {
    so.node_of = compress::nodes_of(*impl->group, compress::local_world_size_from_env());
  }
  impl->make_sync();
  impl->order = std::make_unique<GradOrder>(impl->fp.params);
  impl->set_norm_groups();

  if (c.fp16.enabled) impl->scaler = DeviceLossScaler(c.fp16, impl->fp.device());
  const int owner = impl->sharding.owner;
  // Under offload the optimizer state lives with the master shard in host memory, wherever the
  // parameters are; otherwise beside the flat buffer on the device.
  const at::TensorOptions state_opts = impl->offload ? at::TensorOptions().dtype(at::kFloat)
                                                     : impl->fp.options().dtype(at::kFloat);
  OptimizerBundle bundle = make_optimizer(c, impl->fp.layout, owner, state_opts);
  impl->store.optimizer = std::move(bundle.optimizer);
  impl->schedule = std::move(bundle.schedule);
  impl->deepspeed_clip = bundle.deepspeed_clip;
  if (stage3) {
    impl->make_stage3_units();
  } else {
    // Stages 0-2: one unit over every bucket, resident. It queues one all-gather per bucket,
    // each right after that bucket's update; publish_group sends them as one collective per
    // publish_gather_bound elements (DeepSpeed gathers its whole partition at once).
    const Publish publish = impl->fp.master_aliases_flat() ? Publish::kNone
                            : !impl->sharding.optimizer    ? Publish::kCopy
                                                           : Publish::kAllGather;
    impl->publish_group = std::make_shared<comm::GatherCoalescingGroup>(
        impl->group,
        publish_gather_bound(impl->fp.layout, c.zero_optimization.allgather_bucket_size,
                             impl->group->size()));
    impl->units.push_back(std::make_unique<ShardedUnit>(
        impl->store, *impl->publish_group, impl->fp.layout.units().front(), "<root>",
        Residency::kResident, publish, impl->param_dtype, owner));
  }

  // The Impl outlives its hooks (~Impl removes them first), so the sinks may hold its address.
  Engine::Impl* m = impl.get();
  impl->hooks.install(
      impl->fp.params, [m](int index, const at::Tensor& param) { m->on_grad(index, param); },
      [m] { m->taken_over = true; });
  impl->allocator_delta = allocated_bytes(device) - allocated_before;
  return Engine(std::move(impl));
}

bool Engine::step() {
  auto& m = *impl_;
  TORCH_CHECK(m.awaiting_step,
              "zero: engine.step() called without an engine.backward() since the last step(); "
              "call backward(loss) once before every step()");
  m.awaiting_step = false;
  at::NoGradGuard no_grad;
  ++m.stats.micro_steps;
  if (m.stats.micro_steps % m.accumulation != 0) return false;
  // The previous step's verdict first: lr, bias correction and SGD's first step depend on
  // whether it was applied.
  m.settle();
  if (!m.deferred_error.empty()) TORCH_CHECK(false, std::exchange(m.deferred_error, ""));

  // Nothing below reads a value on the host: the norm, the inf check, the clip coefficient and
  // the loss scale stay on the device and reach the fused kernel as grad_scale / found_inf.
  // (torch_adam's op-by-op AdamW cannot mask itself on the device: it reads found_inf once.)
  GradSink& sink = m.sync->sink();
  // Stage 3 on the device keeps a piece per unit (grad_sink.hpp): read through windows.
  const at::Tensor g = sink.whole() ? sink.shard() : at::Tensor();
  // Sequence parallelism's partial gradients, reduced over dp like any other, summed over tp:
  // one all-reduce per step (zero/grads/partial_grads.hpp), before anything reads the shard.
  m.partial_sum.sum_shard(sink, m.fp.layout, m.sharding.owner);
  const at::Tensor sq = m.squared_grad_norm();
  // The shard holds sum_r(grad_r / predivide) x loss_scale; the average gradient is that times
  // predivide / (world x loss_scale), i.e. divided by `divisor`.
  const double host_divisor = m.group->size() / m.predivide;
  at::Tensor divisor = m.scaler.active()
                           ? m.scaler.scale_tensor() * host_divisor
                           : at::full({1}, host_divisor, sq.options().dtype(at::kFloat));
  // The verdict is global (stage 0 holds the all-reduced gradient, stages 1/2 the all-reduced
  // square sum), so every rank skips the same steps.
  const at::Tensor found_inf = sq.isfinite().logical_not().to(at::kFloat);
  // Stage 3 on a device: the last pass's gather-order comparison is still on the device; a pass
  // whose gathers mixed units skips its step there as an overflow does (the loss scale is left
  // alone), and its backward-late check throws (units/order_check.hpp).
  at::Tensor skip = found_inf;
  if (m.unit_runtime) {
    if (const at::Tensor mixed = m.unit_runtime->pending_order_flag(); mixed.defined()) {
      skip = at::maximum(found_inf, mixed.to(found_inf.options()).reshape(found_inf.sizes()));
    }
  }
  const at::Tensor norm = sq.sqrt() / divisor;
  at::Tensor grad_scale = divisor, grad_mul;
  if (m.cfg.gradient_clipping > 0 && m.deepspeed_clip) {
    // DeepSpeed's unscale_and_clip_grads: the coefficient's reciprocal multiplies the averaged
    // gradient, a rounding step of its own (torch_adam's op-by-op AdamW applies it).
    // Stage 3's norm is fp64 as DeepSpeed's ZeRO-3's; the fp32 gradient takes the coefficient
    // rounded to fp32, as DeepSpeed's mul_ by a 0-dim fp64 tensor rounds it.
    grad_mul =
        at::clamp_min((norm + 1e-6) / m.cfg.gradient_clipping, 1.0).reciprocal().to(at::kFloat);
  } else if (m.cfg.gradient_clipping > 0) {
    const at::Tensor coef = at::clamp_max(m.cfg.gradient_clipping / (norm + 1e-6), 1.0);
    grad_scale = divisor / coef;
  }
  const at::Tensor scale_before = m.scaler.active() ? m.scaler.scale_tensor() : divisor;
  // fp16.hysteresis: how many more overflows in a row the scale tolerates, before and after.
  const at::Tensor left_before = m.scaler.active() ? m.scaler.hysteresis_left() : divisor;

  const double lr = m.schedule->lr_at(m.stats.optimizer_steps);
  // After a skipped step the master is unchanged, so this republishes the same values.
  m.step_units({g, lr, {grad_scale, skip, grad_mul}, [&sink](int64_t offset, int64_t numel) {
                  return sink.window(offset, numel);
                }});
  m.scaler.update(found_inf);
  m.sync->zero_grad();
  ++m.stats.optimizer_steps;
  m.stats.allocator_retries = alloc_retries(m.fp.device());

  const at::Tensor scale_after = m.scaler.active() ? m.scaler.scale_tensor() : divisor;
  // How many more overflows in a row the scale tolerates before it drops (fp16.hysteresis).
  const at::Tensor left_after = m.scaler.active() ? m.scaler.hysteresis_left() : left_before;
  const auto as_double = [](const at::Tensor& t) { return t.reshape({1}).to(at::kDouble); };
  std::vector<at::Tensor> verdict{as_double(norm),         as_double(skip),
                                  as_double(scale_before), as_double(scale_after),
                                  as_double(left_before),  as_double(left_after)};
  // Whether the skip was the gather order's (then the order check reports it, not settle()).
  if (!skip.is_same(found_inf)) verdict.push_back(as_double(skip - found_inf));
  m.verdict.start(at::cat(verdict));
  if (!m.verdict.ready()) return true;  // CUDA: the outcome reaches the host at the next step
  const int64_t skipped = m.stats.skipped_steps;
  m.settle();
  if (!m.deferred_error.empty()) TORCH_CHECK(false, std::exchange(m.deferred_error, ""));
  return m.stats.skipped_steps == skipped;
}

int Engine::rank() const { return impl_->group->rank(); }
int Engine::world_size() const { return impl_->group->size(); }
int Engine::stage() const { return impl_->sharding.stage(); }
double Engine::lr() const { return impl_->schedule->lr_at(impl_->stats.optimizer_steps); }
double Engine::loss_scale() const { return impl_->scaler.scale(); }
const Config& Engine::config() const { return impl_->cfg; }

at::Tensor Engine::cast_input(const at::Tensor& input) const {
  const Fp16Config& f = impl_->cfg.fp16;
  if (!f.enabled || !f.auto_cast || !input.defined() || !input.is_floating_point()) return input;
  return input.to(at::kHalf);
}
const EngineStats& Engine::stats() const { return impl_->stats; }
const EngineStats& Engine::settled_stats() const {
  impl_->settle();
  return impl_->stats;
}
std::shared_ptr<torch::nn::Module> Engine::module() const { return impl_->module; }
Group& Engine::group() const { return *impl_->group; }
const Groups& Engine::groups() const { return impl_->groups; }

at::ScalarType Engine::compute_dtype() const { return impl_->param_dtype; }

double Engine::all_reduce_mean(double value) const {
  impl_->enter("all_reduce_mean");
  at::Tensor t =
      at::full({1}, value, at::TensorOptions().dtype(at::kDouble)).to(impl_->fp.device());
  impl_->group->all_reduce_sum(t, "all_reduce of a logged value").wait();
  return t.item<double>() / world_size();
}

at::Tensor Engine::all_reduce_mean(const at::Tensor& values) const {
  impl_->enter("all_reduce_mean");
  at::Tensor t = values.detach().to(impl_->fp.device(), at::kFloat).contiguous().clone();
  impl_->group->all_reduce_sum(t, "all_reduce of logged values").wait();
  return t / world_size();
}

std::vector<int64_t> Engine::all_gather_values(int64_t value) const {
  const auto dev = impl_->fp.device();
  at::Tensor local = at::full({1}, value, at::TensorOptions().dtype(at::kLong).device(dev));
  at::Tensor all = at::empty({world_size()}, local.options());
  impl_->group->all_gather(all, local, "all_gather of per-rank values").wait();
  all = all.cpu();
  return {all.data_ptr<int64_t>(), all.data_ptr<int64_t>() + all.numel()};
}

at::Tensor Engine::flat_parameters() const {
  const auto& fp = impl_->fp;
  std::vector<at::Tensor> full;  // stage 3: per layout parameter, gathered from the masters
  if (impl_->sharding.params) {
    impl_->enter("flat_parameters");  // a collective there (state_dict says why)
    full = impl_->gathered_params(impl_->param_dtype);
  }
  std::vector<at::Tensor> parts;
  for (int li : fp.layout_of_named) {
    if (li < 0) continue;
    const ParamSlot& s = fp.layout.params()[li];
    parts.push_back(full.empty() ? impl_->unit_of(s.bucket).param_values(s) : full[li]);
  }
  return at::cat(parts).to(at::kFloat);
}

}  // namespace zero
