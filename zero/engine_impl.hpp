// Engine::Impl, the engine's state, shared by the files that implement Engine's members
// (engine.cpp: backward and step; checkpoint files: save and load). Private to zero/.
#pragma once

#include <ATen/ATen.h>

#include <memory>

#include "comm/group.hpp"
#include "zero/engine.hpp"
#include "zero/flat_params.hpp"
#include "zero/grad_hooks.hpp"
#include "zero/grad_order.hpp"
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
  FlattenOptions flat_opts;
  FlatParams fp;
  GradSyncOptions sync_opts;
  std::unique_ptr<GradSync> sync;
  std::unique_ptr<GradOrder> order;
  GradHooks hooks;
  OptimizerBundle opt;
  EngineStats stats;
  LossScaler scaler;  // active under fp16 only
  bool in_backward = false;
  bool awaiting_step = false;  // a backward ran and its step() has not
  bool taken_over = false;     // a later zero::initialize on the same model owns the hooks now

  ~Impl();

  // Called by the post-accumulate-grad hook of parameter `index` (layout index).
  void on_grad(int index, const at::Tensor& param);
  // The gradient path for the current layout (zero/engine.cpp).
  void make_sync();
  // After a backward that threw: discards the accumulation window (zero/engine.cpp).
  void discard_window();
  // Between the first two accumulation windows: agrees on the first pass's arrival order and
  // rebuilds the layout if buckets did not fill in order (zero/relayout.cpp).
  void apply_arrival_order();
  // Lays the parameters out in `order` (new layout index -> current one), moving the masters
  // and optimizer states with them; every rank calls it with the same order (zero/relayout.cpp).
  void rebuild_layout(const std::vector<int>& order);
  // Copies (stage 0) or all-gathers (stages 1, 2) the updated master shards into the model.
  void publish_parameters();
};

}  // namespace zero
