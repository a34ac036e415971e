#include "zero/pipeline/runtime/stage_optimizer.hpp"

#include <torch/csrc/autograd/autograd.h>

#include "comm/group.hpp"

namespace zero::pipeline {

TorchStageOptimizer::TorchStageOptimizer(std::unique_ptr<torch::optim::Optimizer> opt,
                                         std::shared_ptr<comm::Group> dp)
    : opt_(std::move(opt)), dp_(std::move(dp)) {}

void TorchStageOptimizer::backward(const at::Tensor& loss, int micro_batches) {
  (loss / micro_batches).backward();
}

void TorchStageOptimizer::backward(const std::vector<at::Tensor>& outputs,
                                   const std::vector<at::Tensor>& grad_outputs) {
  torch::autograd::backward(outputs, grad_outputs);
}

void TorchStageOptimizer::reduce_grads() {
  if (!dp_ || dp_->size() == 1) return;
  int i = 0;
  for (auto& group : opt_->param_groups()) {
    for (auto& p : group.params()) {
      at::Tensor g = p.mutable_grad();
      if (!g.defined()) {
        // A parameter this replica did not reach still takes part: every rank posts the same
        // collectives in the same order.
        p.mutable_grad() = at::zeros_like(p);
        g = p.mutable_grad();
      }
      dp_->all_reduce_sum(g, "pipeline: data-parallel gradient " + std::to_string(i++)).wait();
      g.div_(dp_->size());
    }
  }
}

void TorchStageOptimizer::step() {
  opt_->step();
  opt_->zero_grad();
}

}  // namespace zero::pipeline
