#include "zero/pipeline/runtime/layers.hpp"

#include <algorithm>
#include <set>
#include <stdexcept>

#include "zero/activation_checkpointing.hpp"

namespace zero::pipeline {
namespace {

// `m` itself when it holds none of `drop`; otherwise a module of its parameters, buffers and
// submodules (recursively the same) under their names, less those in `drop`. The parts are the
// same tensors and modules: training them trains `m`'s.
std::shared_ptr<torch::nn::Module> without(const std::shared_ptr<torch::nn::Module>& m,
                                           const std::set<const void*>& drop) {
  bool holds = false;
  for (const auto& p : m->parameters()) holds = holds || drop.count(p.unsafeGetTensorImpl());
  if (!holds) return m;
  auto out = std::make_shared<torch::nn::Module>(m->name());
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
                         int activation_checkpoint_interval)
    : stages_(stages), stage_(stage), checkpoint_interval_(activation_checkpoint_interval) {
  if (stage < 0 || stage >= stages)
    throw std::invalid_argument("pipeline: stage " + std::to_string(stage) + " is outside 0.." +
                                std::to_string(stages - 1));
  if (activation_checkpoint_interval < 0)
    throw std::invalid_argument("pipeline.activation_checkpoint_interval is " +
                                std::to_string(activation_checkpoint_interval) +
                                "; it must be 0 (off) or more");
  std::vector<int64_t> counts;
  for (const auto& l : all) {
    int64_t n = 0;
    for (const auto& p : l.module->parameters()) n += p.numel();
    counts.push_back(n);
  }
  bounds_ = partition_layers(method, counts, stages);
  for (int s = 0; s < stages; ++s) {
    for (int i = bounds_[s]; i < bounds_[s + 1]; ++i) {
      for (const auto& [key, w] : all[i].tied) {
        auto& owners = tie_stages_[key];
        if (owners.empty() || owners.back() != s) owners.push_back(s);
      }
    }
  }
  for (int i = bounds_[stage]; i < bounds_[stage + 1]; ++i) layers_.push_back(std::move(all[i]));

  std::set<const void*> foreign;
  for (const auto& w : foreign_tied()) foreign.insert(w.unsafeGetTensorImpl());
  module_ = std::make_shared<torch::nn::Module>("PipelineStage");
  for (size_t k = 0; k < layers_.size(); ++k) {
    module_->register_module(std::to_string(bounds_[stage] + static_cast<int>(k)),
                             without(layers_[k].module, foreign));
  }
}

void StageLayers::to(const c10::Device& device) {
  // Module::to replaces each parameter's data in place (set_data): the stage module's and the
  // tied maps' handles share those tensors and follow.
  for (auto& l : layers_) l.module->to(device);
}

at::Tensor StageLayers::forward(const at::Tensor& x) const {
  at::Tensor y = x;
  const int n = static_cast<int>(layers_.size());
  if (checkpoint_interval_ == 0) {
    for (const auto& l : layers_) y = l.forward(y);
    return y;
  }
  int i = 0;
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
