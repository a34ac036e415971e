// The autograd side of a stage-3 unit (design sharded-units.md §3.2): `UnitBoundary`, an
// identity on the unit's outputs whose backward gathers the unit again before autograd reaches
// the unit's own nodes (DeepSpeed's PreBackwardFunctionForModule, parameter_offload.py).
#pragma once

#include <ATen/core/Tensor.h>

#include <memory>
#include <vector>

#include "zero/units/unit_runtime.hpp"

namespace torch::autograd {
struct Node;
}

namespace zero::units {

// `outputs` passed through an identity Function (when one of them requires grad) whose
// backward calls ensure_gathered, entered_backward and prefetch on `runtime` for `unit`. The
// Function holds the runtime weakly: a backward after the engine is gone fails, naming the unit.
// Integer outputs come out non-differentiable; gradients pass through unchanged.
std::vector<at::Tensor> unit_boundary(std::vector<at::Tensor> outputs,
                                      const std::shared_ptr<UnitRuntime>& runtime, int unit);

// True for a UnitBoundary's graph node (for walks over a loss's graph).
bool is_unit_boundary(const torch::autograd::Node& node);

}  // namespace zero::units
