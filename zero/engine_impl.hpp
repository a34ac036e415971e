// Engine::Impl, the engine's state, shared by the files that implement Engine's members
// (engine.cpp: backward and step; checkpoint files: save and load). Private to zero/.
#pragma once

#include <ATen/ATen.h>

#include <memory>

#include "comm/group.hpp"
#include "zero/engine.hpp"
#include "zero/flat_params.hpp"
#include "zero/grad_sync.hpp"
#include "zero/loss_scaler.hpp"
#include "zero/optimizer_factory.hpp"

namespace zero {

at::ScalarType to_scalar_type(Dtype d);

struct Engine::Impl {
  Config cfg;
  std::shared_ptr<torch::nn::Module> module;
  std::shared_ptr<comm::Group> group;
  int stage = 0;
  int64_t accumulation = 1;
  at::ScalarType param_dtype = at::kFloat;
  FlatParams fp;
  std::unique_ptr<GradSync> sync;
  OptimizerBundle opt;
  EngineStats stats;
  LossScaler scaler;  // active under fp16 only
  bool in_backward = false;

  ~Impl();

  // Called by the post-accumulate-grad hook of parameter `index`.
  void on_grad(int index, const at::Tensor& param);
  // Copies (stage 0) or all-gathers (stages 1, 2) the updated master shards into the model.
  void publish_parameters();
};

}  // namespace zero
