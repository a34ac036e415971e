// PipelineRuntime's tied weights (runtime.hpp, Tie): a copy's gradient sent to the owner, the
// owner's sum of them, and the owner's values sent to every copy.
#include <stdexcept>
#include <string>
#include <vector>

#include "zero/pipeline/runtime/runtime.hpp"

namespace zero::pipeline {

// A stage holding a copy: after instruction `idx` of its list (Tie::send_after), the copy's
// gradient (this step's sum over micro-batches, with whatever factor the loss's backward
// applied) goes to the owner.
void PipelineRuntime::send_tied_grads(int idx) {
  for (auto& tie : ties_) {
    if (tie.owner == stage_ || tie.send_after != idx) continue;
    at::Tensor& w = tie.weights.front();
    at::Tensor g = w.grad().defined() ? w.grad().contiguous() : at::zeros_like(w);
    post_send(g, tie.owner,
              "send of the gradient of tied weight '" + tie.key + "' to stage " +
                  std::to_string(tie.owner));
    w.mutable_grad() = at::Tensor();  // the next step starts afresh
  }
}

// The owner, before its last backward: the other holders' gradients, summed.
std::vector<at::Tensor> PipelineRuntime::recv_tied_grads() {
  std::vector<at::Tensor> sums;
  for (auto& tie : ties_) {
    if (tie.owner != stage_) continue;
    const at::Tensor& w = tie.weights.front();
    at::Tensor sum = at::zeros_like(w, at::MemoryFormat::Contiguous);
    for (int t : tie.others) {
      at::Tensor g = at::empty_like(w, at::MemoryFormat::Contiguous);
      recv(g, t,
           "recv of the gradient of tied weight '" + tie.key + "' from stage " + std::to_string(t));
      sum.add_(g);
    }
    sums.push_back(sum);
  }
  return sums;
}

void PipelineRuntime::sync_tied_weights() {
  if (!broken_.empty()) throw std::runtime_error(broken_);
  try {
    exchange_tied_weights();
    wait_sends();
  } catch (...) {
    note_failure("sync_tied_weights");
    throw;
  }
}

// The owner's values to every copy: at start-up, and after each optimizer step.
void PipelineRuntime::exchange_tied_weights() {
  at::NoGradGuard no_grad;
  for (auto& tie : ties_) {
    at::Tensor& w = tie.weights.front();
    if (tie.owner == stage_) {
      for (int t : tie.others)
        post_send(w.detach().contiguous(), t,
                  "send of tied weight '" + tie.key + "' to stage " + std::to_string(t));
      continue;
    }
    at::Tensor v = at::empty_like(w, at::MemoryFormat::Contiguous);
    recv(v, tie.owner,
         "recv of tied weight '" + tie.key + "' from stage " + std::to_string(tie.owner));
    w.detach().copy_(v);
  }
}

}  // namespace zero::pipeline
