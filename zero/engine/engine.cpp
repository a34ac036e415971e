// The engine: wires the flat parameters, the gradient path of the chosen stage, the optimizer
// and the parameter all-gather into backward() and step().
#include "zero/engine.hpp"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/nn/module.h>

#include <cmath>
#include <iostream>
#include <sstream>
#include <unordered_set>
#include <utility>

#include "comm/agree.hpp"
#include "comm/launcher_env.hpp"
#include "zero/auto_strategy.hpp"
#include "zero/compress/node_layout.hpp"
#include "zero/device.hpp"
#include "zero/engine/engine_impl.hpp"
#include "zero/step/deepspeed_norm.hpp"

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
}

void Engine::Impl::on_grad(int index, const at::Tensor& param) {
  TORCH_CHECK(in_backward, "zero: a gradient of '", fp.layout.params()[index].name,
              "' arrived outside engine.backward(); call engine.backward(loss) instead of "
              "loss.backward()");
  order->on_grad(index);
  at::Tensor& grad = const_cast<at::Tensor&>(param).mutable_grad();
  sync->on_grad(index, grad);
  // The engine owns the gradient now; freeing autograd's copy is what makes stage 2 save memory.
  grad.reset();
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
}

void Engine::Impl::discard_window() {
  // Reductions already launched pair with the other ranks' (they failed at the same point,
  // or will time out): wait for them, then forget the whole window, as if its micro-batches had
  // never been seen. What autograd still holds of this pass goes too.
  sync->abort();
  for (auto& p : fp.params) p.mutable_grad().reset();
  stats.micro_steps -= stats.micro_steps % accumulation;
  awaiting_step = false;
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

void Engine::Impl::step_units(const StepContext& ctx) {
  GatherQueue q(cfg.zero_optimization.allgather_bucket_size);
  for (auto& u : units) u->step(ctx, q);
  // What the updates did not hide (host-blocking on gloo; stream-ordered on NCCL).
  if (q.used()) stats.allgather_wait_seconds = q.drain();
}

void Engine::Impl::publish_units() {
  GatherQueue q(cfg.zero_optimization.allgather_bucket_size);
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
  return initialize(std::move(model), std::move(cfg), Groups{std::move(public_group), {}});
}

Engine initialize(std::shared_ptr<torch::nn::Module> model, Config cfg, Groups groups) {
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
    if (p.requires_grad() && seen.insert(p.unsafeGetTensorImpl()).second) {
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
      if (!p.is_cpu()) t.held_bytes += static_cast<int64_t>(p.nbytes());
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
  if (off.enabled) {
    // The config refuses offload outside stages 1 and 2; an application could set the field.
    TORCH_CHECK(impl->sharding.optimizer, "zero: ", c.source,
                ": zero_optimization.offload_optimizer needs ZeRO stage 1 or 2, got stage ",
                impl->sharding.stage(), "; set zero_optimization.stage: 2 or turn the offload off");
    fo.host_master = true;
    fo.pin_memory = off.pin_memory;
    impl->sync_opts.host_shard = true;
    impl->sync_opts.pin_memory = off.pin_memory;
    impl->offload = std::make_unique<OptimizerOffload>(off, impl->param_dtype, device);
  }
  impl->fp = flatten_parameters(*impl->module, *impl->group, fo);
  if (impl->offload) impl->offload->reserve(impl->fp.master.numel());

  GradSyncOptions& so = impl->sync_opts;
  so.comm_dtype = to_scalar_type(c.communication_data_type.value_or(c.param_dtype()));
  TORCH_CHECK(c.accum_dtype() == Dtype::kFloat32 || c.accum_dtype() == c.param_dtype(),
              "zero: data_types.grad_accum_dtype ", dtype_name(c.accum_dtype()), " with ",
              dtype_name(c.param_dtype()),
              " parameters: gradients accumulate in fp32 or in the model dtype; set fp32");
  so.accum_dtype = to_scalar_type(c.accum_dtype());
  so.device = impl->fp.flat.device();
  so.overlap = c.zero_optimization.overlap_comm;
  so.reduce_scatter = c.zero_optimization.reduce_scatter;
  const auto& qg = c.zero_optimization.quantized_gradients;
  so.compress = {qg.enabled, qg.bits, qg.block, qg.error_feedback, qg.hierarchical,
                 compress::residual_store(qg.error_feedback_dtype, so.comm_dtype)};
  // The node of each data-parallel rank, from the launcher's ranks per node: the compressed
  // reduction goes within the node first when the group spans nodes (node_layout.hpp).
  if (qg.enabled && qg.hierarchical) {
    so.node_of = compress::nodes_of(*impl->group, compress::local_world_size_from_env());
  }
  impl->make_sync();
  impl->order = std::make_unique<GradOrder>(impl->fp.params);
  impl->set_norm_groups();

  if (c.fp16.enabled) impl->scaler = DeviceLossScaler(c.fp16, impl->fp.flat.device());
  const int owner = impl->sharding.owner;
  // Under offload the optimizer state lives with the master shard in host memory, wherever the
  // parameters are; otherwise beside the flat buffer on the device.
  const at::TensorOptions state_opts = impl->offload ? at::TensorOptions().dtype(at::kFloat)
                                                     : impl->fp.flat.options().dtype(at::kFloat);
  impl->opt = make_optimizer(c, impl->fp.layout, owner, state_opts);
  impl->store.optimizer = std::move(impl->opt.optimizer);
  // Stages 0-2: one unit over every bucket, resident.
  const Publish publish = impl->fp.master_aliases_flat() ? Publish::kNone
                          : !impl->sharding.optimizer    ? Publish::kCopy
                                                         : Publish::kAllGather;
  impl->units.push_back(std::make_unique<ShardedUnit>(impl->store, *impl->group,
                                                      impl->fp.layout.units().front(), "<root>",
                                                      Residency::kResident, publish,
                                                      impl->param_dtype, owner));

  // The Impl outlives its hooks (~Impl removes them first), so the sinks may hold its address.
  Engine::Impl* m = impl.get();
  impl->hooks.install(
      impl->fp.params, [m](int index, const at::Tensor& param) { m->on_grad(index, param); },
      [m] { m->taken_over = true; });
  impl->allocator_delta = allocated_bytes(device) - allocated_before;
  return Engine(std::move(impl));
}

void Engine::Impl::run_backward(const std::vector<at::Tensor>& roots,
                                const std::function<void()>& run) {
  TORCH_CHECK(!taken_over,
              "zero: this engine's model was taken over by another engine (a later "
              "zero::initialize on the same model); train with that one");
  TORCH_CHECK(!awaiting_step,
              "zero: engine.backward() called twice without engine.step() in between; call "
              "step() after every backward() (it applies the optimizer only at accumulation "
              "boundaries), otherwise gradients would be counted twice");
  const bool window_start = stats.micro_steps % accumulation == 0;
  // A rank that skipped a call its peers wait in (a save on rank 0 only) shows it here.
  if (window_start && entries) entries->progress(stats.micro_steps / accumulation + 1);
  if (window_start && order->has_new_order()) {
    // Once, between windows (nothing is held then): buckets reduced in the order they fill.
    apply_arrival_order();
  }
  const bool boundary = (stats.micro_steps + 1) % accumulation == 0;
  const GradSyncCounters before = sync->counters();
  const bool counting = order->counting();
  sync->begin_backward(boundary, order->begin_pass(roots), counting);
  in_backward = true;
  try {
    run();
    in_backward = false;
    sync->end_backward();
  } catch (...) {
    in_backward = false;
    order->end_pass(false);
    discard_window();
    throw;
  }
  order->end_pass(true);
  awaiting_step = true;
  // Since the engine started (the gradient path is rebuilt with the layout, its counters too).
  const auto& c = sync->counters();
  stats.buckets_launched_in_backward += c.launched_in_backward - before.launched_in_backward;
  stats.buckets_launched_after_backward +=
      c.launched_after_backward - before.launched_after_backward;
  stats.comm_wait_seconds += c.wait_seconds - before.wait_seconds;
  stats.bucket_buffers = sync->bucket_buffers();
  stats.bucket_buffers_in_use_peak = sync->bucket_buffers_peak();
}

void Engine::backward(const at::Tensor& loss) {
  auto& m = *impl_;
  TORCH_CHECK(loss.numel() == 1, "zero: engine.backward expects a scalar loss, got shape ",
              loss.sizes());
  m.run_backward({loss}, [&] {
    // Each micro-batch's loss is a mean; dividing by the accumulation steps makes the sum of
    // the window's gradients the gradient of the whole window's mean. The predivide factor
    // rides along (gradients are linear in the loss, so every gradient is divided before it is
    // summed over ranks), and under fp16 so does the loss scale, read from the device.
    const double factor = 1.0 / (static_cast<double>(m.accumulation) * m.predivide);
    if (m.scaler.active()) {
      (loss.to(at::kFloat) * (m.scaler.scale_tensor() * factor).reshape({})).backward();
    } else if (factor != 1.0) {
      (loss * factor).backward();
    } else {
      loss.backward();
    }
  });
}

void Engine::backward(const std::vector<at::Tensor>& outputs,
                      const std::vector<at::Tensor>& grad_outputs) {
  TORCH_CHECK(!outputs.empty(),
              "zero: engine.backward(outputs, grad_outputs) needs at least one "
              "output; a stage without outputs has nothing to back-propagate");
  TORCH_CHECK(outputs.size() == grad_outputs.size(), "zero: engine.backward got ", outputs.size(),
              " outputs but ", grad_outputs.size(), " grad_outputs; pass one gradient per output");
  for (size_t i = 0; i < outputs.size(); ++i) {
    TORCH_CHECK(outputs[i].defined() && grad_outputs[i].defined(),
                "zero: engine.backward: ", outputs[i].defined() ? "grad_outputs[" : "outputs[", i,
                "] is undefined");
    TORCH_CHECK(outputs[i].requires_grad(), "zero: engine.backward: outputs[", i,
                "] does not require grad (computed under no_grad, or detached)");
    TORCH_CHECK(outputs[i].sizes() == grad_outputs[i].sizes(), "zero: engine.backward: outputs[", i,
                "] has shape ", outputs[i].sizes(), " but grad_outputs[", i, "] has shape ",
                grad_outputs[i].sizes());
  }
  // As DeepSpeed's PipelineEngine on a stage other than the last: the received gradients carry
  // the accumulation, predivide and loss-scale factors already; nothing is applied here.
  impl_->run_backward(outputs, [&] { torch::autograd::backward(outputs, grad_outputs); });
}

bool Engine::is_gradient_accumulation_boundary() const {
  return (impl_->stats.micro_steps + 1) % impl_->accumulation == 0;
}

void Engine::Impl::settle() {
  if (!verdict.pending()) return;
  const at::Tensor v = verdict.get();
  const double* x = v.data_ptr<double>();
  const double norm = x[0];
  stats.last_step_skipped = x[1] != 0;
  if (x[1] == 0) {
    stats.last_grad_norm = norm;
    return;
  }
  // The device skipped the update (found_inf); undo what the host counted for it.
  store.optimizer->undo_step();
  --stats.optimizer_steps;
  if (scaler.active()) {
    // The step as DeepSpeed counts it (skipped ones included): optimizer_steps counts only
    // the applied ones, so it stays put while every step overflows.
    const int64_t step = stats.optimizer_steps + stats.skipped_steps;
    ++stats.skipped_steps;
    if (group->rank() == 0) {
      std::ostringstream os;
      os << "zero: fp16 gradient overflow at optimizer step " << step << " (" << stats.skipped_steps
         << " skipped, " << stats.optimizer_steps
         << " applied so far): step skipped on every rank, ";
      if (x[3] != x[2]) {
        os << "loss scale " << x[2] << " -> " << x[3];
      } else if (x[5] < x[4]) {
        // fp16.hysteresis: only that many overflows in a row lower the scale.
        os << "loss scale " << x[2] << " kept: fp16.hysteresis absorbed this overflow (" << x[5]
           << " more in a row lower it)";
      } else {
        os << "loss scale " << x[2] << " kept (static, or at fp16.min_loss_scale)";
      }
      std::cerr << os.str() << "\n";
    }
    return;
  }
  std::ostringstream os;
  os << "zero: the gradient norm is " << norm << " at optimizer step " << stats.optimizer_steps
     << "; the loss or the gradients hold inf/NaN. Lower the learning rate or enable "
        "gradient_clipping; the master weights were not updated.";
  deferred_error = os.str();
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
  at::Tensor& g = m.sync->grad_shard();
  // Sequence parallelism's partial gradients, reduced over dp like any other, summed over tp:
  // one all-reduce per step (zero/grads/partial_grads.hpp), before anything reads the shard.
  m.partial_sum.sum_shard(g, m.fp.layout, m.sharding.owner);
  const at::Tensor sq = m.squared_grad_norm();
  // The shard holds sum_r(grad_r / predivide) x loss_scale; the average gradient is that times
  // predivide / (world x loss_scale), i.e. divided by `divisor`.
  const double host_divisor = m.group->size() / m.predivide;
  at::Tensor divisor = m.scaler.active() ? m.scaler.scale_tensor() * host_divisor
                                         : at::full({1}, host_divisor, sq.options());
  // The verdict is global (stage 0 holds the all-reduced gradient, stages 1/2 the all-reduced
  // square sum), so every rank skips the same steps.
  const at::Tensor found_inf = sq.isfinite().logical_not().to(at::kFloat);
  const at::Tensor norm = sq.sqrt() / divisor;
  at::Tensor grad_scale = divisor, grad_mul;
  if (m.cfg.gradient_clipping > 0 && m.opt.deepspeed_clip) {
    // DeepSpeed's unscale_and_clip_grads: the coefficient's reciprocal multiplies the averaged
    // gradient, a rounding step of its own (torch_adam's op-by-op AdamW applies it).
    grad_mul = at::clamp_min((norm + 1e-6) / m.cfg.gradient_clipping, 1.0).reciprocal();
  } else if (m.cfg.gradient_clipping > 0) {
    const at::Tensor coef = at::clamp_max(m.cfg.gradient_clipping / (norm + 1e-6), 1.0);
    grad_scale = divisor / coef;
  }
  const at::Tensor scale_before = m.scaler.active() ? m.scaler.scale_tensor() : divisor;
  // fp16.hysteresis: how many more overflows in a row the scale tolerates, before and after.
  const at::Tensor left_before = m.scaler.active() ? m.scaler.hysteresis_left() : divisor;

  const double lr = m.opt.schedule->lr_at(m.stats.optimizer_steps);
  // After a skipped step the master is unchanged, so this republishes the same values.
  m.step_units({g, lr, {grad_scale, found_inf, grad_mul}});
  m.scaler.update(found_inf);
  m.sync->zero_grad();
  ++m.stats.optimizer_steps;

  const at::Tensor scale_after = m.scaler.active() ? m.scaler.scale_tensor() : divisor;
  // How many more overflows in a row the scale tolerates before it drops (fp16.hysteresis).
  const at::Tensor left_after = m.scaler.active() ? m.scaler.hysteresis_left() : left_before;
  const auto as_double = [](const at::Tensor& t) { return t.reshape({1}).to(at::kDouble); };
  m.verdict.start(at::cat({as_double(norm), as_double(found_inf), as_double(scale_before),
                           as_double(scale_after), as_double(left_before), as_double(left_after)}));
  if (!m.verdict.ready()) return true;  // CUDA: the outcome reaches the host at the next step
  const int64_t skipped = m.stats.skipped_steps;
  m.settle();
  if (!m.deferred_error.empty()) TORCH_CHECK(false, std::exchange(m.deferred_error, ""));
  return m.stats.skipped_steps == skipped;
}

int Engine::rank() const { return impl_->group->rank(); }
int Engine::world_size() const { return impl_->group->size(); }
int Engine::stage() const { return impl_->sharding.stage(); }
double Engine::lr() const { return impl_->opt.schedule->lr_at(impl_->stats.optimizer_steps); }
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

MemoryReport Engine::memory_report() const {
  const auto& m = *impl_;
  MemoryReport r;
  r.rank = m.group->rank();
  r.world_size = m.group->size();
  r.stage = m.sharding.stage();
  r.num_params = m.fp.layout.num_elements();
  r.padded_params = m.fp.layout.total_numel();
  r.measured.params = m.fp.flat.nbytes();
  r.measured.grads = m.sync->grad_bytes();
  r.measured.master = m.fp.master_bytes();
  // Scratch too (none with the fused kernels): every byte the optimizer keeps between steps.
  r.measured.optimizer = m.store.optimizer->state_bytes() + m.store.optimizer->scratch_bytes();
  r.measured.comm_buffers = m.sync->comm_buffer_bytes();
  if (const compress::ErrorFeedback* ef = m.sync->error_feedback()) r.error_feedback = ef->bytes();
  if (m.offload) {
    // The compute-dtype copy the CPU step writes and the ring the reduced gradient shards land
    // in are the offload's transfer buffers, both in host memory.
    const int64_t staging = m.offload->staging_bytes() + m.sync->host_staging_bytes();
    r.measured.comm_buffers += staging;
    r.host_measured =
        r.measured.master + r.measured.optimizer + m.sync->grad_shard().nbytes() + staging;
    // As the page-locked allocator holds them (pin_memory on a CUDA build: each block rounded
    // up to a power of two), which is what the host really gives up.
    r.host_pinned = device::host_bytes(m.fp.master) + device::host_bytes(m.sync->grad_shard()) +
                    device::host_bytes(m.offload->staging()) + m.sync->host_staging_pinned_bytes();
    for (const auto& s : m.store.optimizer->state()) r.host_pinned += device::host_bytes(s.second);
    r.host_pinned += m.store.optimizer->scratch_bytes();
  }
  r.allocator_delta = m.allocator_delta;
  r.replaced_param_bytes = m.replaced_param_bytes;
  const c10::Device dev = m.fp.flat.device();
  r.allocator = dev.is_cpu() ? "mallinfo2, process-wide"
                : dev.is_cuda()
                    ? "CUDA caching allocator"
                    : c10::DeviceTypeName(dev.type(), /*lower_case=*/true) + " allocator";

  MemoryModelInput in;
  in.num_params = r.num_params;
  in.world_size = r.world_size;
  in.stage = m.sharding.stage();
  in.param_bytes = static_cast<int>(c10::elementSize(m.param_dtype));
  in.grad_accum_bytes = static_cast<int>(c10::elementSize(m.sync_opts.accum_dtype));
  in.optimizer_states = static_cast<int>(m.store.optimizer->state().size());
  in.comm_buffer_bytes = r.measured.comm_buffers;
  in.accumulation = m.accumulation;
  in.overlap_comm = m.sync_opts.overlap;
  in.offload = m.offload != nullptr;
  r.predicted = predict_model_states(in);
  if (m.offload) {
    // Per element of the (padded) shard: fp32 master, K fp32 states, the fp32 gradient shard
    // (fp32 in host memory whatever grad_accum_dtype) and the compute-dtype copy; plus the
    // declared gradient landing ring.
    const int64_t shard = r.padded_params / r.world_size;
    r.host_predicted =
        shard * (4 + 4 * in.optimizer_states + 4 + in.param_bytes) + m.sync->host_staging_bytes();
  }
  MemoryModelInput dp = in;
  dp.stage = 0;
  dp.comm_buffer_bytes = 0;
  r.stage0 = predict_model_states(dp);
  return r;
}

namespace {

// Every figure of a report that a rank measures or predicts for itself: what
// gather_memory_reports carries from each rank (the rest, world size, stage, allocator name, is
// the same on all).
constexpr MemoryBreakdown MemoryReport::* kBreakdowns[] = {
    &MemoryReport::measured, &MemoryReport::predicted, &MemoryReport::stage0};
constexpr int64_t MemoryBreakdown::* kParts[] = {
    &MemoryBreakdown::params, &MemoryBreakdown::grads, &MemoryBreakdown::master,
    &MemoryBreakdown::optimizer, &MemoryBreakdown::comm_buffers};
constexpr int64_t MemoryReport::* kFigures[] = {
    &MemoryReport::num_params,     &MemoryReport::padded_params,
    &MemoryReport::allocator_delta, &MemoryReport::replaced_param_bytes,
    &MemoryReport::host_measured,  &MemoryReport::host_predicted,
    &MemoryReport::host_pinned,    &MemoryReport::error_feedback};

std::vector<int64_t> figures_of(const MemoryReport& r) {
  std::vector<int64_t> v;
  for (auto b : kBreakdowns) {
    for (auto p : kParts) v.push_back(r.*b.*p);
  }
  for (auto f : kFigures) v.push_back(r.*f);
  return v;
}

void set_figures(MemoryReport& r, const int64_t* v) {
  for (auto b : kBreakdowns) {
    for (auto p : kParts) r.*b.*p = *v++;
  }
  for (auto f : kFigures) r.*f = *v++;
}

}  // namespace

std::vector<MemoryReport> Engine::gather_memory_reports() const {
  impl_->enter("gather_memory_reports");
  const MemoryReport mine = memory_report();
  const int n = world_size();
  const std::vector<int64_t> local_figures = figures_of(mine);
  const int64_t k = static_cast<int64_t>(local_figures.size());
  at::Tensor local = at::tensor(local_figures, at::kLong).to(impl_->fp.flat.device());
  at::Tensor all = at::empty({n * k}, local.options());
  impl_->group->all_gather(all, local, "all_gather of memory reports").wait();
  all = all.cpu();
  std::vector<MemoryReport> out;
  for (int r = 0; r < n; ++r) {
    MemoryReport rep = mine;
    rep.rank = r;
    set_figures(rep, all.data_ptr<int64_t>() + r * k);
    out.push_back(rep);
  }
  return out;
}

at::ScalarType Engine::compute_dtype() const { return impl_->param_dtype; }

double Engine::all_reduce_mean(double value) const {
  impl_->enter("all_reduce_mean");
  at::Tensor t =
      at::full({1}, value, at::TensorOptions().dtype(at::kDouble)).to(impl_->fp.flat.device());
  impl_->group->all_reduce_sum(t, "all_reduce of a logged value").wait();
  return t.item<double>() / world_size();
}

at::Tensor Engine::all_reduce_mean(const at::Tensor& values) const {
  impl_->enter("all_reduce_mean");
  at::Tensor t = values.detach().to(impl_->fp.flat.device(), at::kFloat).contiguous().clone();
  impl_->group->all_reduce_sum(t, "all_reduce of logged values").wait();
  return t / world_size();
}

std::vector<int64_t> Engine::all_gather_values(int64_t value) const {
  const auto dev = impl_->fp.flat.device();
  at::Tensor local = at::full({1}, value, at::TensorOptions().dtype(at::kLong).device(dev));
  at::Tensor all = at::empty({world_size()}, local.options());
  impl_->group->all_gather(all, local, "all_gather of per-rank values").wait();
  all = all.cpu();
  return {all.data_ptr<int64_t>(), all.data_ptr<int64_t>() + all.numel()};
}

at::Tensor Engine::flat_parameters() const {
  const auto& fp = impl_->fp;
  std::vector<at::Tensor> parts;
  for (int li : fp.layout_of_named) {
    if (li < 0) continue;
    const ParamSlot& s = fp.layout.params()[li];
    parts.push_back(fp.flat.narrow(0, s.flat_offset, s.numel));
  }
  return at::cat(parts).to(at::kFloat);
}

}  // namespace zero
