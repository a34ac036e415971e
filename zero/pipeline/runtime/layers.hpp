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
  // This stage's parameters, each once (a weight two of its layers tie appears once).
  std::vector<at::Tensor> parameters() const;
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
};

}  // namespace zero::pipeline
