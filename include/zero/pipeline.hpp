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

}  // namespace zero::pipeline
