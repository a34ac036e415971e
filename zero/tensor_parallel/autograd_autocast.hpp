// Autocast for the tensor-parallel autograd functions, as torch.amp.custom_fwd(cast_inputs=...)
// does it. Inside a custom function's forward autocast would cast the operands of at::linear
// where autograd cannot see it, while the function saves the uncast tensors: backward then
// multiplies low-precision gradients with fp32 saved tensors (a dtype error), or in fp32 where
// the plain at::linear would have run in bf16. Instead the function's floating-point inputs are
// cast to the autocast dtype once, its body runs with autocast off, and the cast tensors are
// the ones saved: backward's products then run in the forward's dtype with no autocast at all.
// The gradients it returns are in that dtype; autograd converts each to its input's dtype.
#pragma once

#include <ATen/autocast_mode.h>
#include <c10/core/impl/LocalDispatchKeySet.h>

#include <vector>

namespace zero::tensor_parallel {

class AutocastInputs {
 public:
  // The autocast state of `x`'s device type, read before the function runs.
  explicit AutocastInputs(const at::Tensor& x)
      : device_(x.device().type()),
        on_(at::autocast::is_autocast_available(device_) &&
            at::autocast::is_autocast_enabled(device_)),
        dtype_(on_ ? at::autocast::get_autocast_dtype(device_) : x.scalar_type()) {}

  bool on() const { return on_; }

  // What autocast would hand at::linear: floating-point tensors of the device (fp64 excepted)
  // in the autocast dtype. An explicit copy, not at::autocast::cached_cast: inside a custom
  // function's forward grad mode is off, and a cast cached there for a leaf weight would be
  // handed, without its history, to a later at::linear on that weight in the same region.
  at::Tensor cast(const at::Tensor& t) const {
    if (!on_ || !t.defined() || !t.is_floating_point() || t.device().type() != device_ ||
        t.scalar_type() == at::kDouble)
      return t;
    return t.to(dtype_);
  }
  std::vector<at::Tensor> cast(at::TensorList ts) const {
    std::vector<at::Tensor> out;
    out.reserve(ts.size());
    for (const at::Tensor& t : ts) out.push_back(cast(t));
    return out;
  }

  // For a bias added outside the function by plain autograd: at::linear's own autocast cast
  // (recorded by autograd, cached like the one at::linear would make), so that y + b stays in
  // the autocast dtype instead of being promoted to the bias's fp32.
  at::Tensor cast_outside(const at::Tensor& b) const {
    return on_ && b.defined() ? at::autocast::cached_cast(dtype_, b, device_) : b;
  }

 private:
  c10::DeviceType device_;
  bool on_;
  at::ScalarType dtype_;
};

// The function body with autocast off, for every device type (what autocast's own kernels do
// around the op they redispatch).
struct NoAutocast : c10::impl::ExcludeDispatchKeyGuard {
  NoAutocast() : ExcludeDispatchKeyGuard(c10::autocast_dispatch_keyset) {}
};

}  // namespace zero::tensor_parallel
