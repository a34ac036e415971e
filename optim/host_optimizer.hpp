// The host optimizers' common part (internal to optim/): checks, the fp16 overflow skip, the
// parameter groups' slices of an update window, each slice's whole vectors split over the rank's
// threads and its remainder handed to ATen's kernel.
#pragma once

#include <c10/core/thread_pool.h>

#include <functional>
#include <memory>
#include <optional>

#include "optim/cpu_adamw.hpp"
#include "optim/host_kernels.hpp"

namespace zero::optim::host {

// The new values of p[0, n) rounded into `out` (of kind `kind`; nothing for kNone).
void round_to(Out kind, const float* p, void* out, int64_t n);

// A view of n host floats at `ptr` (no copy): a remainder handed to ATen's kernel in place.
at::Tensor view(float* ptr, int64_t n);

// A remainder's gradient as ATen's fused kernels take it: a copy, since they write the unscaled
// gradient back and the shard's gradient is not the optimizer's; and the scale (none at 1).
struct RemainderGrad {
  at::Tensor grad;
  std::optional<at::Tensor> scale;
};
RemainderGrad remainder_grad(const float* g, int64_t n, float grad_scale);

// The rounding of this process's ATen kernel named `what` (its CPU capability is picked at load
// time, or by ATEN_CPU_CAPABILITY), by the probe `mismatches(rounding)`: how many elements of
// whole vectors the host kernel with that rounding and ATen's leave unequal. Should a torch build
// round otherwise than both, the closer one is used and offloaded runs are no longer
// bit-identical to runs without offload on a CPU (an ulp here and there): said once per kernel.
Rounding pick_rounding(const char* what, const std::function<int64_t(Rounding)>& mismatches);

// Where a slice's body of whole vectors ends: a multiple of 16 floats from its start, which is a
// multiple of every float vector width of ATen's CPU kernels (16 AVX-512, 8 AVX2 and SVE256, 4
// NEON). The remainder then runs through ATen's kernel, which splits it into its own vectors and
// remainder exactly where it splits the whole slice.
constexpr int64_t kRemainderAlign = 16;

class HostOptimizerBase : public HostShardOptimizer {
 public:
  HostOptimizerBase(int64_t numel, std::vector<ParamGroup> groups, const at::TensorOptions& opts,
                    const HostOptimizerOptions& host);

  void update_to(at::Tensor& param, const at::Tensor& grad, double lr, const Scalars& s,
                 Range window, const at::Tensor& out) override;
  at::Tensor squared_norm(const at::Tensor& grad, const std::vector<Range>& pieces) override;

 protected:
  // One chunk of the update: n elements at `offset` of the shard (p, g point there), at the
  // group's lr and weight decay (unset: the optimizer's), the copy of kind `out_kind` at `out`
  // (or none). A chunk is whole vectors of kRemainderAlign elements from its slice's start.
  virtual void apply_chunk(Out out_kind, float* p, const float* g, int64_t offset, int64_t n,
                           double lr, float grad_scale, std::optional<double> weight_decay,
                           void* out) = 0;
  // A slice's last n < kRemainderAlign elements, through ATen's kernel (its remainder loop
  // rounds otherwise than its vector body).
  virtual void apply_remainder(Out out_kind, float* p, const float* g, int64_t offset, int64_t n,
                               double lr, float grad_scale, std::optional<double> weight_decay,
                               void* out) = 0;

  at::Tensor state_zeros() const;

 private:
  template <typename F>
  void for_chunks(Range r, F&& f);

  bool pin_;
  std::unique_ptr<c10::ThreadPool> pool_;  // threads_ - 1 workers, made at the first big step
};

}  // namespace zero::optim::host
