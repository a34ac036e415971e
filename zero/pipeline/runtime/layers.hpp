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

// The layers of one stage. The list is cut into stages x virtual_stages chunks (the partition
// method over that many parts); stage s holds chunks s, s + P, ..., s + (v - 1)P, as a stage of
// Megatron-LM's interleaved schedule holds model chunks (virtual pipeline stages). With one
// chunk per stage (v = 1, GPipe and 1F1B) that is bounds[stage] .. bounds[stage + 1]. The
// embedding is then on chunk 0 of stage 0, the head on the last chunk of the last stage.
class StageLayers {
 public:
  // `all`: every layer of the model (the partition needs their parameter counts or, for
  // PartitionMethod::Compute, their layer_costs); only this
  // stage's are kept. activation_checkpoint_interval > 0 recomputes runs of that many layers in
  // backward instead of keeping their activations (DeepSpeed's PipelineModule option), within
  // each chunk.
  StageLayers(std::vector<Layer> all, PartitionMethod method, int stages, int stage,
              int activation_checkpoint_interval = 0, int virtual_stages = 1);

  // Chunk `chunk` (0 .. virtual_stages() - 1) of this stage: virtual stage chunk * P + stage.
  at::Tensor forward(const at::Tensor& x, int chunk = 0) const;
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
  int virtual_stages() const { return virtual_stages_; }
  // Virtual stage c holds layers bounds[c] .. bounds[c + 1] - 1 (stages x virtual_stages + 1
  // entries); it lives on stage c % stages.
  const std::vector<int>& bounds() const { return bounds_; }
  const std::vector<Layer>& layers() const { return layers_; }
  // For each tie key: the stages whose layers carry it, in order.
  const std::map<std::string, std::vector<int>>& tie_stages() const { return tie_stages_; }

 private:
  std::vector<Layer> layers_;    // this stage's, chunk after chunk
  std::vector<int> chunk_begin_;  // chunk c's layers: layers_[chunk_begin_[c] .. [c + 1])
  std::vector<int> bounds_;
  int stages_;
  int stage_;
  int virtual_stages_;
  int checkpoint_interval_;
  std::map<std::string, std::vector<int>> tie_stages_;
  std::shared_ptr<torch::nn::Module> module_;
};

}  // namespace zero::pipeline
