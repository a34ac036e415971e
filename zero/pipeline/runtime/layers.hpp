// One pipeline stage's share of a model's layers (include/zero/pipeline.hpp), cut by
// zero/pipeline/partition.hpp, and their forward.
#pragma once

#include <torch/nn/module.h>

#include <map>
#include <string>
#include <vector>

#include "zero/pipeline.hpp"
#include "zero/pipeline/partition.hpp"

namespace zero::pipeline {

// The layers of one stage: bounds[stage] .. bounds[stage + 1] of the whole list.
class StageLayers {
 public:
  // `all`: every layer of the model (the partition needs their parameter counts); only this
  // stage's are kept. activation_checkpoint_interval > 0 recomputes runs of that many layers in
  // backward instead of keeping their activations (DeepSpeed's PipelineModule option).
  StageLayers(std::vector<Layer> all, PartitionMethod method, int stages, int stage,
              int activation_checkpoint_interval = 0);

  at::Tensor forward(const at::Tensor& x) const;
  // Moves this stage's layers (their parameters, buffers and tied copies) to `device`; the
  // other stages' layers stay where they are.
  void to(const c10::Device& device);
  // The parameters this stage trains, each once (a weight two of its layers tie appears once).
  // A tied weight belongs to the first stage holding it (its owner, as DeepSpeed's tied module
  // lives with the first stage that builds it): a later stage's copy is left out here and
  // follows the owner's values (PipelineRuntime sends the copy's gradient to the owner and the
  // updated weight back).
  std::vector<at::Tensor> parameters() const;
  // The same parameters as one module, for an engine to wrap (zero::initialize): each layer's
  // module under its index in the whole list ("3.wq.weight"), or, for a layer holding a tied
  // weight this stage does not own, a module of its parts without that weight.
  std::shared_ptr<torch::nn::Module> module() const;
  // This stage's copies of tied weights that another stage owns (each once).
  std::vector<at::Tensor> foreign_tied() const;
  int stage() const { return stage_; }
  int stages() const { return stages_; }
  const std::vector<int>& bounds() const { return bounds_; }
  const std::vector<Layer>& layers() const { return layers_; }
  // For each tie key: the stages whose layers carry it, in order.
  const std::map<std::string, std::vector<int>>& tie_stages() const { return tie_stages_; }

 private:
  std::vector<Layer> layers_;
  std::vector<int> bounds_;
  int stages_;
  int stage_;
  int checkpoint_interval_;
  std::map<std::string, std::vector<int>> tie_stages_;
  std::shared_ptr<torch::nn::Module> module_;
};

}  // namespace zero::pipeline
