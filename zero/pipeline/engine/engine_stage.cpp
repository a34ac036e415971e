#include "zero/pipeline/engine/engine_stage.hpp"

#include <stdexcept>
#include <string>

#include "zero/grads/grad_order.hpp"

namespace zero::pipeline {

EngineStage::EngineStage(Engine engine, int virtual_stages)
    : engine_(std::move(engine)), virtual_stages_(virtual_stages) {}

void EngineStage::backward(const at::Tensor& loss, int micro_batches) {
  const int64_t passes = static_cast<int64_t>(micro_batches) * virtual_stages_;
  if (passes != engine_.config().gradient_accumulation_steps)
    throw std::invalid_argument(
        "pipeline: " + std::to_string(micro_batches) + " micro-batches x " +
        std::to_string(virtual_stages_) +
        " chunks per step but the engine accumulates gradient_accumulation_steps = " +
        std::to_string(engine_.config().gradient_accumulation_steps) + "; they must be equal");
  const bool closes = engine_.is_gradient_accumulation_boundary();
  // The engine divides by its window, m x v (and applies fp16's loss scale): times v, the
  // micro-batch's share of the mean loss stays 1 / m.
  const PassKind kind(chunk_);
  engine_.backward(virtual_stages_ > 1 ? loss * static_cast<double>(virtual_stages_) : loss);
  after_backward(closes);
}

void EngineStage::backward(const std::vector<at::Tensor>& outputs,
                           const std::vector<at::Tensor>& grad_outputs) {
  const bool closes = engine_.is_gradient_accumulation_boundary();
  const PassKind kind(chunk_);
  engine_.backward(outputs, grad_outputs);
  after_backward(closes);
}

// A micro-step inside the window: step() only counts it (no collective). The window's last
// waits for Op::OptimizerStep.
void EngineStage::after_backward(bool closes) {
  if (!closes) engine_.step();
}

void EngineStage::step() {
  if (!engine_.is_gradient_accumulation_boundary())
    throw std::logic_error(
        "pipeline: the optimizer step came before the last micro-batch of the accumulation "
        "window (the schedule ran fewer backward passes than gradient_accumulation_steps)");
  // The previous step's verdict: step() waits for it first anyway.
  skipped_before_ = engine_.settled_stats().skipped_steps;
  applied_ = engine_.step();
}

bool EngineStage::last_step_applied() const {
  return applied_ && engine_.settled_stats().skipped_steps == skipped_before_;
}

}  // namespace zero::pipeline
