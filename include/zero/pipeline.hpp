// Pipeline parallelism as a program describes its model: an ordered list of layers (DeepSpeed's
// PipelineModule(layers=[...])), each a module holding its parameters and a function from its
// input to its output. zero cuts the list into stages (pipeline.partition) and runs each stage's
// share on its pipeline rank.
//
// Tied weights (DeepSpeed's TiedLayerSpec; GPT-2's embedding reused as the head): layers that
// share a weight name it under the same key. Each stage holding a layer of that key keeps a copy;
// the copies' gradients are summed over those stages before the step, so they stay equal.
#pragma once

#include <torch/nn/module.h>

#include <functional>
#include <map>
#include <memory>
#include <string>

namespace zero::pipeline {

struct Layer {
  std::string name;                                      // in errors and reports: "block 3"
  std::shared_ptr<torch::nn::Module> module;             // owns the layer's parameters
  std::function<at::Tensor(const at::Tensor&)> forward;  // input -> output
  std::map<std::string, at::Tensor> tied;                // key -> this layer's tied weight
};

// Last stage: its output and the micro-batch's target -> that micro-batch's mean loss.
using LossFn = std::function<at::Tensor(const at::Tensor& output, const at::Tensor& target)>;

// Where one optimizer step (train_batch) spent this rank's wall time, in seconds, by the kind of
// instruction its stage ran: its layers' forward (the loss included on the last stage), their
// backward (the last one includes the engine's data-parallel gradient reduction), the optimizer
// step (with the tied weights sent to their copies), and the pipeline's communication: waiting
// on activations and gradients from the neighbouring stages (the bubble shows here), the sends'
// completion and the loss's broadcast. Together about the step's time.
struct StepTimes {
  double forward_s = 0, backward_s = 0, step_s = 0, comm_s = 0;
  double total() const { return forward_s + backward_s + step_s + comm_s; }
};

}  // namespace zero::pipeline
