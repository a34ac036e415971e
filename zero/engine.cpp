// The engine: wires the flat parameters, the gradient path of the chosen stage, the optimizer
// and the parameter all-gather into backward() and step().
#include "zero/engine.hpp"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/nn/module.h>

#include <cmath>
#include <deque>
#include <iostream>

#include "zero/auto_strategy.hpp"
#include "zero/engine_impl.hpp"

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
  for (auto& p : fp.params) torch::autograd::impl::set_post_acc_grad_hooks(p, nullptr);
}

void Engine::Impl::on_grad(int index, const at::Tensor& param) {
  TORCH_CHECK(in_backward, "zero: a gradient of '", fp.layout.params()[index].name,
              "' arrived outside engine.backward(); call engine.backward(loss) instead of "
              "loss.backward()");
  at::Tensor& grad = const_cast<at::Tensor&>(param).mutable_grad();
  sync->on_grad(index, grad);
  // The engine owns the gradient now; freeing autograd's copy is what makes stage 2 save memory.
  grad.reset();
}

void Engine::Impl::publish_parameters() {
  at::NoGradGuard no_grad;
  if (fp.master_aliases_flat) return;
  if (stage == 0) {
    fp.flat.copy_(fp.master);
    return;
  }
  // Gathers run asynchronously; bound what is in flight (and the cast temporaries it holds).
  struct InFlight {
    comm::Work work;
    at::Tensor input;
    int64_t numel;
  };
  std::deque<InFlight> inflight;
  int64_t inflight_numel = 0;
  const auto& buckets = fp.layout.buckets();
  for (size_t b = 0; b < buckets.size(); ++b) {
    const BucketSlot& bucket = buckets[b];
    const int64_t S = bucket.shard.shard_numel();
    at::Tensor in = fp.master.narrow(0, bucket.shard_offset, S);
    if (param_dtype != at::kFloat) in = in.to(param_dtype);
    at::Tensor out = fp.flat.narrow(0, bucket.flat_offset, bucket.shard.padded_numel());
    while (!inflight.empty() &&
           inflight_numel + out.numel() > cfg.zero_optimization.allgather_bucket_size) {
      inflight.front().work.wait();
      inflight_numel -= inflight.front().numel;
      inflight.pop_front();
    }
    auto work = group->all_gather(out, in, "all_gather of parameter bucket " + std::to_string(b));
    inflight.push_back({std::move(work), in, out.numel()});
    inflight_numel += out.numel();
  }
  for (auto& f : inflight) f.work.wait();
}

namespace {

class GradHook final : public torch::autograd::PostAccumulateGradHook {
 public:
  GradHook(Engine::Impl* impl, int index) : impl_(impl), index_(index) {}
  void operator()(const torch::autograd::Variable& param) override {
    impl_->on_grad(index_, param);
  }

 private:
  Engine::Impl* impl_;
  int index_;
};

}  // namespace

Engine::Engine(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Engine::Engine(Engine&&) noexcept = default;
Engine& Engine::operator=(Engine&&) noexcept = default;
Engine::~Engine() = default;

Engine initialize(std::shared_ptr<torch::nn::Module> model, Config cfg) {
  comm::GroupOptions go;
  go.timeout = cfg.comm_timeout;
  for (const auto& p : model->parameters()) {
    go.device = p.device().type();
    break;
  }
  auto group = comm::Group::from_env(go);
  return initialize(std::move(model), std::move(cfg), std::move(group));
}

Engine initialize(std::shared_ptr<torch::nn::Module> model, Config cfg,
                  std::shared_ptr<comm::Group> group) {
  TORCH_CHECK(model, "zero::initialize: the model is null");
  TORCH_CHECK(group, "zero::initialize: the process group is null");
  auto impl = std::make_unique<Engine::Impl>();
  if (cfg.zero_optimization.stage_auto) {
    // The application did not resolve "auto" with its model's shape (resolve_auto): plan the
    // stage for the model states alone.
    AutoTarget t;
    for (const auto& p : model->parameters()) {
      t.num_params += p.numel();
      t.device = p.device();
      if (p.is_cuda()) t.held_bytes += static_cast<int64_t>(p.nbytes());
    }
    resolve_auto(cfg, t, *group);
  }
  cfg.resolve_batch(group->size());
  impl->cfg = std::move(cfg);
  const Config& c = impl->cfg;
  impl->module = std::move(model);
  impl->group = std::move(group);
  impl->stage = c.zero_optimization.stage;
  impl->accumulation = c.gradient_accumulation_steps;
  impl->param_dtype = to_scalar_type(c.param_dtype());
  if (c.fp16.enabled) impl->scaler = LossScaler(c.fp16);
  if (impl->group->rank() == 0) {
    for (const auto& w : c.warnings) std::cerr << "zero: warning: " << w << "\n";
  }

  FlattenOptions fo;
  fo.param_dtype = impl->param_dtype;
  fo.bucket_numel = c.zero_optimization.reduce_bucket_size;
  fo.shards = impl->stage == 0 ? 1 : impl->group->size();
  impl->fp = flatten_parameters(*impl->module, *impl->group, fo);

  GradSyncOptions so;
  so.comm_dtype = to_scalar_type(c.communication_data_type.value_or(c.param_dtype()));
  so.device = impl->fp.flat.device();
  so.overlap = c.zero_optimization.overlap_comm;
  so.reduce_scatter = c.zero_optimization.reduce_scatter;
  auto& grp = *impl->group;
  impl->sync = impl->stage == 2
                   ? make_partitioned_grads(impl->fp.layout, grp, so)
                   : make_accumulated_grads(impl->fp.layout, grp, impl->stage == 1, so);

  const int owner = impl->stage == 0 ? 0 : grp.rank();
  impl->opt = make_optimizer(c, impl->fp.layout, owner, impl->fp.master.options());

  for (size_t i = 0; i < impl->fp.params.size(); ++i) {
    torch::autograd::impl::set_post_acc_grad_hooks(
        impl->fp.params[i], std::make_unique<GradHook>(impl.get(), static_cast<int>(i)));
  }
  return Engine(std::move(impl));
}

void Engine::backward(const at::Tensor& loss) {
  auto& m = *impl_;
  TORCH_CHECK(loss.numel() == 1, "zero: engine.backward expects a scalar loss, got shape ",
              loss.sizes());
  const bool boundary = (m.stats.micro_steps + 1) % m.accumulation == 0;
  m.sync->begin_backward(boundary);
  m.in_backward = true;
  try {
    // Each micro-batch's loss is a mean; dividing by the accumulation steps makes the sum of
    // the window's gradients the gradient of the whole window's mean. Under fp16 the loss scale
    // rides along in the same multiply.
    const double factor = m.scaler.scale() / static_cast<double>(m.accumulation);
    if (factor != 1.0) {
      (loss * factor).backward();
    } else {
      loss.backward();
    }
  } catch (...) {
    m.in_backward = false;
    throw;
  }
  m.in_backward = false;
  m.sync->end_backward();
  const auto& c = m.sync->counters();
  m.stats.buckets_launched_in_backward = c.launched_in_backward;
  m.stats.buckets_launched_after_backward = c.launched_after_backward;
  m.stats.comm_wait_seconds = c.wait_seconds;
}

bool Engine::is_gradient_accumulation_boundary() const {
  return (impl_->stats.micro_steps + 1) % impl_->accumulation == 0;
}

bool Engine::step() {
  auto& m = *impl_;
  at::NoGradGuard no_grad;
  ++m.stats.micro_steps;
  if (m.stats.micro_steps % m.accumulation != 0) return false;

  at::Tensor& g = m.sync->grad_shard();
  const double world = m.group->size();
  // The reduced shard holds the sum over ranks; the norm of the average is that over N.
  at::Tensor sq = at::linalg_vector_norm(g, 2, {}, false, at::kDouble).square().reshape({1});
  if (m.stage != 0) m.group->all_reduce_sum(sq, "all_reduce of the gradient norm").wait();
  // The norm is a global quantity (stage 0 holds the all-reduced gradient, stages 1/2 the
  // all-reduced square sum), so every rank sees the same verdict on inf/NaN and skips together.
  const double loss_scale = m.scaler.scale();
  const double norm = std::sqrt(sq.item<double>()) / world / loss_scale;
  if (m.cfg.fp16.enabled) {
    const bool overflow = !std::isfinite(norm);
    m.scaler.update(overflow);
    if (overflow) {
      ++m.stats.skipped_steps;
      if (m.group->rank() == 0) {
        std::cerr << "zero: fp16 gradient overflow at optimizer step " << m.stats.optimizer_steps
                  << ": step skipped on every rank, loss scale " << loss_scale << " -> "
                  << m.scaler.scale() << "\n";
      }
      m.sync->zero_grad();
      return false;
    }
  }
  TORCH_CHECK(std::isfinite(norm), "zero: the gradient norm is ", norm, " at optimizer step ",
              m.stats.optimizer_steps,
              "; the loss or the gradients hold inf/NaN. Lower the learning rate or enable "
              "gradient_clipping; the master weights were not updated.");
  m.stats.last_grad_norm = norm;
  double scale = 1.0 / (world * loss_scale);
  if (m.cfg.gradient_clipping > 0) {
    const double coef = m.cfg.gradient_clipping / (norm + 1e-6);
    if (coef < 1.0) scale *= coef;
  }
  if (scale != 1.0) g.mul_(scale);

  const double lr = m.opt.schedule->lr_at(m.stats.optimizer_steps);
  m.opt.optimizer->step(m.fp.master, g, lr);
  m.publish_parameters();
  m.sync->zero_grad();
  ++m.stats.optimizer_steps;
  return true;
}

int Engine::rank() const { return impl_->group->rank(); }
int Engine::world_size() const { return impl_->group->size(); }
int Engine::stage() const { return impl_->stage; }
double Engine::lr() const { return impl_->opt.schedule->lr_at(impl_->stats.optimizer_steps); }
double Engine::loss_scale() const { return impl_->scaler.scale(); }
const Config& Engine::config() const { return impl_->cfg; }
const EngineStats& Engine::stats() const { return impl_->stats; }
std::shared_ptr<torch::nn::Module> Engine::module() const { return impl_->module; }
comm::Group& Engine::group() const { return *impl_->group; }

MemoryReport Engine::memory_report() const {
  const auto& m = *impl_;
  MemoryReport r;
  r.rank = m.group->rank();
  r.world_size = m.group->size();
  r.stage = m.stage;
  r.num_params = m.fp.layout.num_elements();
  r.padded_params = m.fp.layout.total_numel();
  r.measured.params = m.fp.flat.nbytes();
  r.measured.grads = m.sync->grad_bytes();
  r.measured.master = m.fp.master_aliases_flat ? 0 : m.fp.master.nbytes();
  r.measured.optimizer = m.opt.optimizer->state_bytes();
  r.measured.comm_buffers = m.sync->comm_buffer_bytes();

  MemoryModelInput in;
  in.num_params = r.num_params;
  in.world_size = r.world_size;
  in.stage = m.stage;
  in.param_bytes = static_cast<int>(c10::elementSize(m.param_dtype));
  in.grad_accum_bytes = 4;
  in.optimizer_states = static_cast<int>(m.opt.optimizer->state().size());
  in.comm_buffer_bytes = r.measured.comm_buffers;
  r.predicted = predict_model_states(in);
  MemoryModelInput dp = in;
  dp.stage = 0;
  dp.comm_buffer_bytes = 0;
  r.stage0 = predict_model_states(dp);
  return r;
}

std::vector<MemoryReport> Engine::gather_memory_reports() const {
  const MemoryReport mine = memory_report();
  const int n = world_size();
  at::Tensor local = at::tensor(std::vector<int64_t>{mine.measured.params, mine.measured.grads,
                                                     mine.measured.master, mine.measured.optimizer,
                                                     mine.measured.comm_buffers},
                                at::kLong)
                         .to(impl_->fp.flat.device());
  at::Tensor all = at::empty({n * 5}, local.options());
  impl_->group->all_gather(all, local, "all_gather of memory reports").wait();
  all = all.cpu();
  std::vector<MemoryReport> out;
  for (int r = 0; r < n; ++r) {
    MemoryReport rep = mine;
    rep.rank = r;
    const int64_t* v = all.data_ptr<int64_t>() + r * 5;
    rep.measured = {v[0], v[1], v[2], v[3], v[4]};
    out.push_back(rep);
  }
  return out;
}

double Engine::all_reduce_mean(double value) const {
  at::Tensor t =
      at::full({1}, value, at::TensorOptions().dtype(at::kDouble)).to(impl_->fp.flat.device());
  impl_->group->all_reduce_sum(t, "all_reduce of a logged value").wait();
  return t.item<double>() / world_size();
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
