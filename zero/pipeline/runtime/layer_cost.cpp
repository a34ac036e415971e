// layer_costs (include/zero/pipeline.hpp): the weights pipeline.partition: compute cuts by.
#include <torch/nn/modules/embedding.h>

#include <stdexcept>
#include <string>
#include <vector>

#include "zero/pipeline.hpp"
#include "zero/pipeline_flops.hpp"
#include "zero/tensor_parallel/embedding.hpp"

namespace zero::pipeline {

std::vector<LayerCost> layer_costs(const std::vector<Layer>& layers) {
  std::vector<LayerCost> out;
  for (const auto& l : layers) {
    if (l.flops_per_token) {
      if (*l.flops_per_token < 0)
        throw std::invalid_argument("pipeline: layer '" + l.name + "' declares " +
                                    std::to_string(*l.flops_per_token) +
                                    " FLOPs per token; a cost is 0 or more");
      out.push_back({*l.flops_per_token, LayerCost::Source::kDeclared});
      continue;
    }
    // An embedding's table holds many parameters but costs a lookup: 6 x its parameters would
    // weigh it like a head of the same size, which is the imbalance this method corrects.
    if (const auto* e = l.module ? l.module->as<torch::nn::EmbeddingImpl>() : nullptr) {
      out.push_back(
          {embedding_flops_per_token(e->options.embedding_dim()), LayerCost::Source::kEmbedding});
      continue;
    }
    // The vocabulary-parallel one too (review 06e L8): its shard is also a lookup.
    if (const auto* v =
            l.module ? l.module->as<tensor_parallel::VocabParallelEmbeddingImpl>() : nullptr) {
      out.push_back({embedding_flops_per_token(v->options().dim()), LayerCost::Source::kEmbedding});
      continue;
    }
    int64_t params = 0;
    if (l.module)
      for (const auto& p : l.module->parameters()) params += p.numel();
    out.push_back({matmul_flops_per_token(params), LayerCost::Source::kParameters});
  }
  return out;
}

std::string describe_layer_costs(const std::vector<Layer>& layers,
                                 const std::vector<LayerCost>& costs) {
  int declared = 0;
  std::string embeddings, fallback;
  for (size_t i = 0; i < costs.size() && i < layers.size(); ++i) {
    switch (costs[i].source) {
      case LayerCost::Source::kDeclared:
        ++declared;
        break;
      case LayerCost::Source::kEmbedding:
        embeddings += (embeddings.empty() ? "" : ", ") + layers[i].name;
        break;
      case LayerCost::Source::kParameters:
        fallback += (fallback.empty() ? "" : ", ") + layers[i].name;
        break;
    }
  }
  std::string out = "pipeline.partition compute: FLOPs per token (forward + backward) of " +
                    std::to_string(costs.size()) + " layers: " + std::to_string(declared) +
                    " declared";
  if (!embeddings.empty()) out += "; an Embedding's lookup (its width) for " + embeddings;
  if (!fallback.empty()) out += "; 6 x parameters (no flops_per_token declared) for " + fallback;
  return out;
}

}  // namespace zero::pipeline
