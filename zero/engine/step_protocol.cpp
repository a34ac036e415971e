// Engine::backward and what surrounds it (docs/design/sharded-units.md §1.1, StepProtocol): one
// micro-step's backward with the gradient path armed, the accumulation window it belongs to,
// a failed window discarded, and the previous step's verdict taken in.
#include <ATen/ATen.h>
#include <torch/csrc/autograd/autograd.h>

#include <algorithm>
#include <iostream>
#include <sstream>

#include "zero/device.hpp"
#include "zero/engine/engine_impl.hpp"

namespace zero {

void Engine::Impl::discard_window() {
  // Reductions already launched pair with the other ranks' (they failed at the same point,
  // or will time out): wait for them, then forget the whole window, as if its micro-batches had
  // never been seen. What autograd still holds of this pass goes too.
  sync->abort();
  for (auto& p : fp.params) p.mutable_grad().reset();
  stats.micro_steps -= stats.micro_steps % accumulation;
  awaiting_step = false;
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
  // Stage 3: no unit entered this pass's backward yet (begin_backward consults the gate).
  std::fill(entered_in_pass.begin(), entered_in_pass.end(), 0);
  const std::vector<int> expected = order->begin_pass(roots);
  sync->begin_backward(boundary, expected, counting);
  if (unit_runtime) begin_unit_pass(expected);
  in_backward = true;
  try {
    run();
    in_backward = false;
    sync->end_backward();
    release_gathered_units();
    // Stage 3: every rank gathered its units in one order (throws on every rank otherwise).
    if (unit_runtime) unit_runtime->end_pass(*unit_group, fp.device());
  } catch (...) {
    in_backward = false;
    order->end_pass(false);
    try {
      release_gathered_units();
    } catch (...) {  // the error that got here is the one to report
    }
    if (unit_runtime) unit_runtime->abandon_pass();
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
  const GradPathBytes bytes = sync->bytes();
  stats.bucket_buffers = bytes.buffers;
  stats.bucket_buffers_in_use_peak = bytes.buffers_peak;
  stats.allocator_retries = alloc_retries(fp.device());
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
  // Stage 3's gather order mixed units in that pass (a seventh value, 1 when the skip was
  // only the order's): the order check throws for it (units/order_check.hpp), not this.
  if (v.numel() > 6 && x[6] > 0) return;
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

}  // namespace zero
