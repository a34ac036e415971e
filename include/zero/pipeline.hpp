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

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace zero::pipeline {

struct Layer {
  std::string name;                                      // in errors and reports: "block 3"
  std::shared_ptr<torch::nn::Module> module;             // owns the layer's parameters
  std::function<at::Tensor(const at::Tensor&)> forward;  // input -> output
  std::map<std::string, at::Tensor> tied;                // key -> this layer's tied weight
  // What training this layer costs, in FLOPs per token, forward + backward (the formulas of
  // include/zero/pipeline_flops.hpp); the last layer's includes the loss that runs after it.
  // pipeline.partition: compute balances these. Unset: layer_costs' fallback.
  std::optional<int64_t> flops_per_token = std::nullopt;
};

// Each layer's cost as pipeline.partition: compute weighs it: its declared flops_per_token; or,
// for a layer declaring none, a torch::nn::Embedding module counted as its lookup (its
// embedding_dim per token) and any other module as 6 x its parameters (matmul weights).
struct LayerCost {
  enum class Source { kDeclared, kEmbedding, kParameters };
  int64_t flops_per_token = 0;
  Source source = Source::kDeclared;
};
std::vector<LayerCost> layer_costs(const std::vector<Layer>& layers);
// One line for the start-up report: how many layers declared their cost and which fell back.
std::string describe_layer_costs(const std::vector<Layer>& layers,
                                 const std::vector<LayerCost>& costs);

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
