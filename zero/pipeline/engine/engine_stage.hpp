// The pipeline runtime's StageOptimizer seam backed by the ZeRO engine: a micro-batch's backward
// is engine.backward (loss on the last stage, outputs with their received gradients elsewhere),
// each followed by the engine's step() except the window's last, whose step() runs at
// Op::OptimizerStep, after the stage's sends are through.
#pragma once

#include "zero/engine.hpp"
#include "zero/pipeline/runtime/stage_optimizer.hpp"

namespace zero::pipeline {

// Interleaved (v chunks per stage): one engine over all the stage's chunks, whose accumulation
// window counts the stage's chunk backward passes, m x v (PipelineEngine initializes it with
// gradient_accumulation_steps m x v); the window's last is the stage's last backward, after
// which every chunk's gradient is complete. The engine divides the last stage's loss by m x v,
// so backward(loss) hands it loss x v: each micro-batch's gradient is still the mean's, 1 / m.
// Each backward runs as its chunk's kind of pass (zero::PassKind, zero/grads/grad_order.hpp): with
// recomputed blocks the engine learns, per chunk, the gradients that chunk's pass delivers.
class EngineStage : public StageOptimizer {
 public:
  explicit EngineStage(Engine engine, int virtual_stages = 1);
  void backward(const at::Tensor& loss, int micro_batches) override;
  void backward(const std::vector<at::Tensor>& outputs,
                const std::vector<at::Tensor>& grad_outputs) override;
  // The engine reduced the gradients during the window's last backward: nothing left to do.
  void reduce_grads() override {}
  void set_chunk(int chunk) override { chunk_ = chunk; }
  void step() override;

  Engine& engine() { return engine_; }
  // On an accelerator the engine's step() returns before the device decided (it returns true
  // at every boundary; an fp16 skip shows in skipped_steps one step later): this waits for the
  // step's verdict (settled_stats(), a read of the device) and compares the skip count.
  bool last_step_applied() const;

 private:
  void after_backward(bool closes);

  Engine engine_;
  int virtual_stages_ = 1;
  int chunk_ = 0;  // the chunk the next backward runs (set_chunk)
  bool applied_ = false;
  int64_t skipped_before_ = 0;  // skipped_steps before the last step
};

}  // namespace zero::pipeline
