// The process group of a tensor-parallel autograd function, kept in its context for backward.
// Autograd keeps a function's non-tensor state in IValues; the group travels as a capsule (the
// one IValue that holds an arbitrary C++ object without registering a TorchScript class).
#pragma once

#include <torch/csrc/autograd/custom_function.h>

#include <memory>
#include <utility>

#include "comm/group.hpp"
#include "zero/group.hpp"

namespace zero::tensor_parallel {

struct GroupHolder : torch::CustomClassHolder {
  explicit GroupHolder(std::shared_ptr<zero::Group> g) : group(std::move(g)) {}
  std::shared_ptr<zero::Group> group;
};

inline void save_group(torch::autograd::AutogradContext* ctx,
                       const std::shared_ptr<zero::Group>& group) {
  TORCH_CHECK(group, "zero: a tensor-parallel function was given no process group");
  ctx->saved_data["group"] = c10::IValue::make_capsule(c10::make_intrusive<GroupHolder>(group));
}

inline comm::Group& group_of(torch::autograd::AutogradContext* ctx) {
  auto holder =
      c10::static_intrusive_pointer_cast<GroupHolder>(ctx->saved_data.at("group").toCapsule());
  return comm::of(*holder->group);
}

}  // namespace zero::tensor_parallel
