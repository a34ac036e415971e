#include "zero/step/optimizer_offload.hpp"

#include <ATen/ATen.h>

#if defined(__linux__)
#include <sched.h>
#endif

#include <algorithm>
#include <cstdlib>
#include <thread>

namespace zero {

int host_step_threads(int configured) {
  if (configured > 0) return configured;
  int cores = static_cast<int>(std::thread::hardware_concurrency());
#if defined(__linux__)
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) == 0) cores = CPU_COUNT(&set);
#endif
  int local = 1;
  for (const char* name : {"LOCAL_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE"}) {
    const char* v = std::getenv(name);
    if (v != nullptr && std::atoi(v) > 0) {
      local = std::atoi(v);
      break;
    }
  }
  return std::max(1, cores / local);
}

OptimizerOffload::OptimizerOffload(const ZeroOptimizationConfig::OffloadOptimizerConfig& cfg,
                                   at::ScalarType param_dtype, at::Device device)
    : pin_(cfg.pin_memory),
      param_dtype_(param_dtype),
      device_(device),
      engine_(device::make_copy_engine(device)) {}

OptimizerOffload::~OptimizerOffload() {
  // Staging goes with this object: no upload may still be reading it.
  begin_publish();
}

optim::ShardOptimizer::Scalars OptimizerOffload::host_scalars(
    const optim::ShardOptimizer::Scalars& s) {
  std::vector<at::Tensor> on_device;
  for (const at::Tensor* t : {&s.grad_scale, &s.found_inf}) {
    if (t->defined() && !t->is_cpu()) on_device.push_back(t->reshape({-1}).to(at::kFloat));
  }
  if (on_device.empty()) return s;
  // The step's one read of the device: the CPU optimizer cannot start without these values.
  const at::Tensor host = at::cat(on_device).cpu();
  optim::ShardOptimizer::Scalars out = s;
  int64_t i = 0;
  for (at::Tensor* t : {&out.grad_scale, &out.found_inf}) {
    if (t->defined() && !t->is_cpu()) *t = host.narrow(0, i++, 1);
  }
  return out;
}

void OptimizerOffload::begin_publish() {
  for (const auto& t : uploads_) engine_->synchronize(t);
  uploads_.clear();
}

at::Tensor OptimizerOffload::update_bucket(optim::ShardOptimizer* opt, at::Tensor& master,
                                           const at::Tensor& grad, double lr,
                                           const optim::ShardOptimizer::Scalars& scalars,
                                           const BucketSlot& b, const at::Tensor& dst) {
  // Sized by the master: a relayout may change the shard's size.
  reserve(master.numel());
  const int64_t begin = b.shard_offset, S = b.shard.shard_numel();
  TORCH_INTERNAL_ASSERT(dst.numel() == S && dst.scalar_type() == param_dtype_);
  at::Tensor out = staging_.narrow(0, begin, S);
  if (auto* host = dynamic_cast<optim::HostShardOptimizer*>(opt)) {
    host->update_to(master, grad, lr, scalars, {begin, begin + S}, out);
  } else {
    TORCH_INTERNAL_ASSERT(opt == nullptr, "zero: optimizer offload needs a host optimizer");
    out.copy_(master.narrow(0, begin, S));
  }
  // On the copy stream (a plain copy on a CPU run); the gather reads `dst` only after it.
  device::Ticket t = engine_->copy_to_device(dst, out);
  engine_->wait(t);
  if (t) uploads_.push_back(std::move(t));
  return dst;
}

at::Tensor OptimizerOffload::to_host(const at::Tensor& t) const {
  at::Tensor h = device::host_zeros(t.numel(), pin_, t.scalar_type());
  h.copy_(t.reshape({-1}));
  return h;
}

}  // namespace zero
