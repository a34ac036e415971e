// What a pipeline stage does with a micro-batch's backward and with its gradients once a step's
// micro-batches are through: the seam where the data-parallel reduction and the optimizer plug
// in. TorchStageOptimizer: plain autograd and a torch::optim optimizer (gradients averaged over
// the stage's data-parallel group). The ZeRO engine's backward(outputs, grad_outputs) and step()
// are the other implementation (zero/pipeline/engine/engine_stage.hpp), kept apart so this
// runtime does not depend on the engine.
#pragma once

#include <torch/optim/optimizer.h>

#include <memory>
#include <vector>

namespace zero::comm {
class Group;
}

namespace zero::pipeline {

class StageOptimizer {
 public:
  virtual ~StageOptimizer() = default;
  // Op::Backward on the last stage: `loss` is one micro-batch's mean loss, one of
  // `micro_batches`; the gradients must come out as those of the mean over all of them.
  virtual void backward(const at::Tensor& loss, int micro_batches) = 0;
  // Op::Backward on the other stages: `outputs` back-propagated with the gradients the next
  // stage sent (and, on the stage that owns a tied weight, that weight with the other stages'
  // gradients for it). These carry whatever factor the last stage's backward applied.
  virtual void backward(const std::vector<at::Tensor>& outputs,
                        const std::vector<at::Tensor>& grad_outputs) = 0;
  // The model chunk (0 .. virtual_stages - 1) whose backward the next backward() runs: under
  // the interleaved schedule a stage's passes reach one chunk's parameters each.
  virtual void set_chunk(int /*chunk*/) {}
  // Op::ReduceGrads: the stage's gradients are complete on this rank; reduce them across
  // data-parallel replicas (or nothing, where backward already did).
  virtual void reduce_grads() = 0;
  // Op::OptimizerStep: apply the gradients and zero them for the next step.
  virtual void step() = 0;
};

// A torch::optim optimizer; with a data-parallel group (size > 1), each gradient is all-reduced
// and divided by its size before the step (plain data parallelism, not ZeRO).
class TorchStageOptimizer : public StageOptimizer {
 public:
  TorchStageOptimizer(std::unique_ptr<torch::optim::Optimizer> opt,
                      std::shared_ptr<comm::Group> dp = nullptr);
  void backward(const at::Tensor& loss, int micro_batches) override;
  void backward(const std::vector<at::Tensor>& outputs,
                const std::vector<at::Tensor>& grad_outputs) override;
  void reduce_grads() override;
  void step() override;
  torch::optim::Optimizer& optimizer() { return *opt_; }

 private:
  std::unique_ptr<torch::optim::Optimizer> opt_;
  std::shared_ptr<comm::Group> dp_;
};

}  // namespace zero::pipeline
