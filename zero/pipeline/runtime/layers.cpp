#include "zero/pipeline/runtime/layers.hpp"

#include <algorithm>
#include <map>
#include <set>
#include <stdexcept>

#include "zero/activation_checkpointing.hpp"
#include "zero/tensor_parallel/placement.hpp"

namespace zero::pipeline {
namespace {

namespace tp = zero::tensor_parallel;

// A module rebuilt from a tensor-parallel module's parts (below) answers for them as the
// original does: the engine reads where each parameter lies (tensor_parallel::placements) from
// the module's type, and a plain torch::nn::Module in its place would make a split weight look
// replicated and, under sequence parallelism, leave a norm's partial gradient unmarked.
class MarkedParts : public torch::nn::Module, public tp::SequenceParallelModule {
 public:
  MarkedParts(std::shared_ptr<torch::nn::Module> original, const tp::SequenceParallelModule* mark)
      : torch::nn::Module(original->name()), original_(std::move(original)), mark_(mark) {}
  tp::SequenceShare sequence_share(const std::string& name) const override {
    return mark_->sequence_share(name);
  }

 private:
  std::shared_ptr<torch::nn::Module> original_;  // kept alive for mark_, its own interface
  const tp::SequenceParallelModule* mark_;
};

class LayerParts : public torch::nn::Module,
                   public tp::SequenceParallelModule,
                   public tp::TensorParallelLayer {
 public:
  LayerParts(std::shared_ptr<torch::nn::Module> original, const tp::TensorParallelLayer* layer,
             const tp::SequenceParallelModule* mark)
      : torch::nn::Module(original->name()),
        original_(std::move(original)),
        layer_(layer),
        mark_(mark) {}
  tp::SequenceShare sequence_share(const std::string& name) const override {
    return mark_ ? mark_->sequence_share(name) : tp::SequenceShare::kUnsaid;
  }
  tp::Placement placement(const std::string& name) const override {
    return layer_->placement(name);
  }

 private:
  std::shared_ptr<torch::nn::Module> original_;  // kept alive for layer_ and mark_
  const tp::TensorParallelLayer* layer_;
  const tp::SequenceParallelModule* mark_;
};

// `m` itself when it holds none of `drop`; otherwise a module of its parameters, buffers and
// submodules (recursively the same) under their names, less those in `drop`, that describes its
// tensor-parallel parameters as `m` does (above). The parts are the same tensors and modules:
// training them trains `m`'s.
std::shared_ptr<torch::nn::Module> without(const std::shared_ptr<torch::nn::Module>& m,
                                           const std::set<const void*>& drop) {
  bool holds = false;
  for (const auto& p : m->parameters()) holds = holds || drop.count(p.unsafeGetTensorImpl());
  if (!holds) return m;
  const auto* layer = dynamic_cast<const tp::TensorParallelLayer*>(m.get());
  const auto* mark = dynamic_cast<const tp::SequenceParallelModule*>(m.get());
  std::shared_ptr<torch::nn::Module> out;
  if (layer) {
    out = std::make_shared<LayerParts>(m, layer, mark);
  } else if (mark) {
    out = std::make_shared<MarkedParts>(m, mark);
  } else {
    out = std::make_shared<torch::nn::Module>(m->name());
  }
  for (const auto& p : m->named_parameters(/*recurse=*/false)) {
    if (!drop.count(p.value().unsafeGetTensorImpl()))
      out->register_parameter(p.key(), p.value(), p.value().requires_grad());
  }
  for (const auto& b : m->named_buffers(/*recurse=*/false))
    out->register_buffer(b.key(), b.value());
  for (const auto& c : m->named_children()) out->register_module(c.key(), without(c.value(), drop));
  return out;
}

}  // namespace

StageLayers::StageLayers(std::vector<Layer> all, PartitionMethod method, int stages, int stage,
                         int activation_checkpoint_interval, int virtual_stages)
    : stages_(stages),
      stage_(stage),
      virtual_stages_(virtual_stages),
      checkpoint_interval_(activation_checkpoint_interval) {
  if (stage < 0 || stage >= stages)
    throw std::invalid_argument("pipeline: stage " + std::to_string(stage) + " is outside 0.." +
                                std::to_string(stages - 1));
  if (virtual_stages < 1)
    throw std::invalid_argument("pipeline.virtual_stages is " + std::to_string(virtual_stages) +
                                "; it must be at least 1");
  if (activation_checkpoint_interval < 0)
    throw std::invalid_argument("pipeline.activation_checkpoint_interval is " +
                                std::to_string(activation_checkpoint_interval) +
                                "; it must be 0 (off) or more");
  // The weights the partition balances: each layer's parameter count, or its FLOPs per token.
  std::vector<int64_t> counts;
  if (method == PartitionMethod::Compute) {
    for (const LayerCost& c : layer_costs(all)) counts.push_back(c.flops_per_token);
  } else {
    for (const auto& l : all) {
      int64_t n = 0;
      for (const auto& p : l.module->parameters()) n += p.numel();
      counts.push_back(n);
    }
  }
  const int chunks = stages * virtual_stages;
  if (virtual_stages > 1 && static_cast<int>(all.size()) < chunks)
    throw std::invalid_argument(
        "pipeline: " + std::to_string(all.size()) + " layers cannot fill pipeline.stages " +
        std::to_string(stages) + " x pipeline.virtual_stages " + std::to_string(virtual_stages) +
        " = " + std::to_string(chunks) +
        " model chunks (every chunk needs a layer; use fewer virtual stages or stages)");
  bounds_ = partition_layers(method, counts, chunks);
  // The stages holding each tie key, ascending (the first is its owner): a stage's chunks
  // interleave with the others', so the virtual stages' order is not the stages'.
  std::map<std::string, std::set<int>> holders;
  for (int vs = 0; vs < chunks; ++vs)
    for (int i = bounds_[vs]; i < bounds_[vs + 1]; ++i)
      for (const auto& [key, w] : all[i].tied) holders[key].insert(vs % stages);
  for (const auto& [key, set] : holders) tie_stages_[key].assign(set.begin(), set.end());
  for (int c = 0; c < virtual_stages; ++c) {
    const int vs = c * stages + stage;
    chunk_begin_.push_back(static_cast<int>(layers_.size()));
    for (int i = bounds_[vs]; i < bounds_[vs + 1]; ++i) layers_.push_back(std::move(all[i]));
  }
  chunk_begin_.push_back(static_cast<int>(layers_.size()));

  std::set<const void*> foreign;
  for (const auto& w : foreign_tied()) foreign.insert(w.unsafeGetTensorImpl());
  module_ = std::make_shared<torch::nn::Module>("PipelineStage");
  for (int c = 0; c < virtual_stages; ++c) {
    const int vs = c * stages + stage;
    for (int k = chunk_begin_[c]; k < chunk_begin_[c + 1]; ++k)
      module_->register_module(std::to_string(bounds_[vs] + k - chunk_begin_[c]),
                               without(layers_[k].module, foreign));
  }
}

void StageLayers::to(const c10::Device& device) {
  // Module::to replaces each parameter's data in place (set_data): the stage module's and the
  // tied maps' handles share those tensors and follow.
  for (auto& l : layers_) l.module->to(device);
}

at::Tensor StageLayers::forward(const at::Tensor& x, int chunk) const {
  if (chunk < 0 || chunk >= virtual_stages_)
    throw std::invalid_argument("pipeline: chunk " + std::to_string(chunk) + " of a stage of " +
                                std::to_string(virtual_stages_));
  at::Tensor y = x;
  const int begin = chunk_begin_[chunk], n = chunk_begin_[chunk + 1];
  if (checkpoint_interval_ == 0) {
    for (int i = begin; i < n; ++i) y = layers_[i].forward(y);
    return y;
  }
  int i = begin;
  // Integer input (the first stage's tokens) has no gradient to recompute towards: the first
  // layer (the embedding) runs plainly and the runs start after it.
  if (!y.is_floating_point()) y = layers_[i++].forward(y);
  // Runs of checkpoint_interval_ layers, each recomputed in backward instead of keeping its
  // activations (DeepSpeed's PipelineModule activation_checkpoint_interval).
  for (; i < n; i += checkpoint_interval_) {
    const int end = std::min(n, i + checkpoint_interval_);
    y = zero::checkpoint(
        [this, i, end](const at::Tensor& in) {
          at::Tensor t = in;
          for (int j = i; j < end; ++j) t = layers_[j].forward(t);
          return t;
        },
        y);
  }
  return y;
}

std::vector<at::Tensor> StageLayers::foreign_tied() const {
  std::vector<at::Tensor> out;
  std::set<const void*> seen;
  for (const auto& l : layers_) {
    for (const auto& [key, w] : l.tied) {
      if (tie_stages_.at(key).front() == stage_) continue;
      if (seen.insert(w.unsafeGetTensorImpl()).second) out.push_back(w);
    }
  }
  return out;
}

std::shared_ptr<torch::nn::Module> StageLayers::module() const { return module_; }

std::vector<at::Tensor> StageLayers::parameters() const {
  std::vector<at::Tensor> out;
  std::set<const void*> seen;
  for (const auto& w : foreign_tied()) seen.insert(w.unsafeGetTensorImpl());
  for (const auto& l : layers_) {
    for (const auto& p : l.module->parameters()) {
      if (seen.insert(p.unsafeGetTensorImpl()).second) out.push_back(p);
    }
  }
  return out;
}

}  // namespace zero::pipeline
