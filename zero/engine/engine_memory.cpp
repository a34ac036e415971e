// Engine::memory_report and gather_memory_reports: what the engine holds, measured from its
// tensors and predicted by the memory model (zero/plan), per rank.
#include <ATen/ATen.h>

#include "device/pinned_host.hpp"
#include "zero/engine/engine_impl.hpp"

namespace zero {

MemoryReport Engine::memory_report() const {
  const auto& m = *impl_;
  MemoryReport r;
  r.rank = m.group->rank();
  r.world_size = m.group->size();
  r.stage = m.sharding.stage();
  r.num_params = m.fp.layout.num_elements();
  r.padded_params = m.fp.layout.total_numel();
  for (const auto& u : m.units) r.measured.params += u->bytes().resident;
  // Stage 3 under optimizer offload: the compute-dtype shard on the device the units' gathers
  // send (otherwise none: fp32 gathers the master, counted there; bf16/fp16 round it into each
  // gather's output).
  if (m.fp.shard.defined() && !m.fp.shard.is_same(m.fp.master)) {
    r.measured.params += static_cast<int64_t>(m.fp.shard.nbytes());
  }
  const GradPathBytes path = m.sync->bytes();
  r.measured.grads = path.grads;
  r.measured.master = m.fp.master_bytes();
  // Scratch too (none with the fused kernels): every byte the optimizer keeps between steps.
  r.measured.optimizer = m.store.optimizer->state_bytes() + m.store.optimizer->scratch_bytes();
  r.measured.comm_buffers = path.comm_buffers;
  const compress::ErrorFeedback* ef = m.sync->reducer().error_feedback();
  if (ef) r.error_feedback = ef->bytes();
  // Stage 3 on a device keeps them in page-locked host memory (error_feedback.hpp), and two
  // staging buffers on the device.
  const int64_t ef_host = ef && ef->on_host() ? ef->bytes() : 0;
  r.error_feedback_on_host = ef_host > 0;
  r.error_feedback_staging = ef ? ef->device_bytes() : 0;
  if (m.offload) {
    // The compute-dtype copy the CPU step writes and the ring the reduced gradient shards land
    // in are the offload's transfer buffers, both in host memory.
    const int64_t staging = m.offload->staging_bytes() + path.host_staging;
    r.measured.comm_buffers += staging;
    r.host_measured =
        r.measured.master + r.measured.optimizer + m.sync->grad_shard().nbytes() + staging;
    // As the page-locked allocator holds them (pin_memory on a CUDA build: each block rounded
    // up to a power of two), which is what the host really gives up.
    r.host_pinned = device::host_bytes(m.fp.master) + device::host_bytes(m.sync->grad_shard()) +
                    device::host_bytes(m.offload->staging()) + path.host_staging_pinned;
    for (const auto& s : m.store.optimizer->state()) r.host_pinned += device::host_bytes(s.second);
    r.host_pinned += m.store.optimizer->scratch_bytes();
  }
  r.host_measured += ef_host;
  r.host_pinned += ef_host;
  r.allocator_delta = m.allocator_delta;
  r.replaced_param_bytes = m.replaced_param_bytes;
  const c10::Device dev = m.fp.device();
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
  for (const auto& u : m.units) {
    if (u->residency() == Residency::kResident && in.stage == 3) {
      for (int li : u->slot().params) in.root_params += m.fp.layout.params()[li].numel;
    }
  }
  r.predicted = predict_model_states(in);
  if (m.offload) {
    // Per element of the (padded) shard: fp32 master, K fp32 states, the fp32 gradient shard
    // (fp32 in host memory whatever grad_accum_dtype) and the compute-dtype copy; plus the
    // declared gradient landing ring.
    const int64_t shard = r.padded_params / r.world_size;
    r.host_predicted =
        shard * (4 + 4 * in.optimizer_states + 4 + in.param_bytes) + path.host_staging;
  }
  // From the residuals' sizes and storage (the figure the start-up check compared with the
  // host's memory), not from the tensors.
  if (ef && ef->on_host()) r.host_predicted += ef->planned_bytes();
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
constexpr int64_t MemoryReport::*kFigures[] = {&MemoryReport::num_params,
                                               &MemoryReport::padded_params,
                                               &MemoryReport::allocator_delta,
                                               &MemoryReport::replaced_param_bytes,
                                               &MemoryReport::host_measured,
                                               &MemoryReport::host_predicted,
                                               &MemoryReport::host_pinned,
                                               &MemoryReport::error_feedback,
                                               &MemoryReport::error_feedback_staging};

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
  at::Tensor local = at::tensor(local_figures, at::kLong).to(impl_->fp.device());
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

}  // namespace zero
