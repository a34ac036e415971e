// What a pipeline stage does with its gradients once a step's micro-batches are through: the
// seam where the data-parallel reduction and the optimizer plug in. Today a torch::optim
// optimizer over the stage's parameters (gradients averaged over the stage's data-parallel
// group first); the ZeRO engine's backward(outputs, grad_outputs) can take its place later
// (Op::ReduceGrads -> its reduction, Op::OptimizerStep -> its step).
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
  // Op::ReduceGrads: the stage's gradients are complete on this rank (tied weights already summed
  // across stages); reduce them across data-parallel replicas.
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
  void reduce_grads() override;
  void step() override;
  torch::optim::Optimizer& optimizer() { return *opt_; }

 private:
  std::unique_ptr<torch::optim::Optimizer> opt_;
  std::shared_ptr<comm::Group> dp_;
};

}  // namespace zero::pipeline
