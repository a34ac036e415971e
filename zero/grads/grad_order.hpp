// What a backward pass will deliver, per parameter, and the order the first pass delivered it in.
//
// DDP's Reducer has the same two problems and the same two answers. A parameter the loss does not
// reach (an unused head, an unrouted expert) never delivers a gradient, and would hold its bucket
// back until backward ends: the loss's autograd graph is walked before backward, and every
// parameter whose AccumulateGrad node it does not reach counts as delivered (with zeros, which is
// what its gradient is). And parameters arrive in the order the graph produces them, not in
// registration order: the first pass records the arrival order, and from rank 0's record the
// buckets are reduced in the order they completed (Engine::Impl::apply_arrival_order); the
// layout of the parameters and their states stays.
//
// A checkpointed block (zero::checkpoint) runs its own backward inside the outer one: its
// parameters are invisible to the walk and may deliver several gradients (tied weights shared by
// blocks). When the graph holds such a block, the first pass treats every unreached parameter as
// unknown (its bucket waits for the end of backward, so that first pass overlaps little) and
// counts what arrives; later passes expect those counts.
#pragma once

#include <ATen/core/Tensor.h>

#include <unordered_map>
#include <vector>

#include "comm/group.hpp"

namespace zero {

class GradOrder {
 public:
  // `params`: the engine's trainable parameters, in layout order.
  explicit GradOrder(const std::vector<at::Tensor>& params);

  // Walks the graph of `roots` (the loss, or a pipeline stage's outputs); returns the gradients
  // each parameter will deliver in this pass (see BucketTracker), and starts counting arrivals.
  std::vector<int> begin_pass(const std::vector<at::Tensor>& roots);
  void on_grad(int param);
  // The pass ended: `ok` false when it failed (what it saw is forgotten).
  void end_pass(bool ok);

  // True until a pass was recorded: the next pass counts the gradients each parameter delivers
  // (every rank's first pass; the same on every rank).
  bool counting() const { return state_ == State::kObserving; }
  // True once, when the first pass has been recorded and its order not yet applied.
  bool has_new_order() const { return state_ == State::kObserved; }
  // Rank 0's first-pass arrival order (layout indices; parameters that never arrived last, in
  // layout order), agreed by a broadcast: a collective, called by every rank at the same point.
  struct Agreed {
    std::vector<int> order;
    int arrived = 0;  // how many of `order` delivered a gradient in that pass
  };
  Agreed agreed_order(comm::Group& group, const at::Device& device);
  // The agreed order is in use: later passes expect the counts the first pass recorded.
  void applied() { state_ = State::kApplied; }

 private:
  enum class State { kObserving, kObserved, kApplied };
  void index(const std::vector<at::Tensor>& params);

  std::unordered_map<const void*, int> index_;  // TensorImpl of a parameter -> layout index
  State state_ = State::kObserving;
  std::vector<char> reached_;  // this pass: the walk reached the parameter's AccumulateGrad
  std::vector<int> arrivals_;  // this pass: gradients delivered
  std::vector<int> first_order_;
  std::vector<int> hidden_;  // gradients the walk cannot see (nested backward), once known
};

}  // namespace zero
