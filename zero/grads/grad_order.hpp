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
//
// Those counts hold for passes over the same graph. A pipeline stage of the interleaved schedule
// runs v kinds of pass, one per model chunk, each reaching only its chunk's parameters; behind
// checkpointed blocks the walk cannot tell them apart (two chunks of recomputed blocks reach
// nothing it sees). The caller names the kind (PassKind) and the counts are learned and applied
// per kind, each from its own first pass: one kind's counts applied to another's pass would
// expect nothing from the parameters it does deliver, and release their buckets before them.
#pragma once

#include <ATen/core/Tensor.h>

#include <map>
#include <unordered_map>
#include <vector>

#include "comm/group.hpp"

namespace zero {

// While one lives, the backward passes this thread runs are of kind `kind` (>= 0; 0 outside
// any): EngineStage names its model chunk. A thread's, not an engine's, setting, because the
// engine's public backward() takes no such argument and only the caller knows what it runs.
class PassKind {
 public:
  explicit PassKind(int kind);
  ~PassKind();
  PassKind(const PassKind&) = delete;
  PassKind& operator=(const PassKind&) = delete;
  static int current();

 private:
  int previous_;
};

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

  // True until a pass of the current kind (PassKind::current()) was recorded: the next pass
  // counts the gradients each parameter delivers (every rank's first pass of each kind; the same
  // on every rank, which runs the same kinds in the same order).
  bool counting() const { return hidden_.count(PassKind::current()) == 0; }
  // True once, when the first pass has been recorded and its order not yet applied.
  bool has_new_order() const { return state_ == State::kObserved; }
  // Rank 0's first-pass arrival order (layout indices; parameters that never arrived last, in
  // layout order), agreed by a broadcast: a collective, called by every rank at the same point.
  struct Agreed {
    std::vector<int> order;
    int arrived = 0;  // how many of `order` delivered a gradient in that pass
  };
  Agreed agreed_order(comm::Group& group, const at::Device& device);
  // The agreed order is in use.
  void applied() { state_ = State::kApplied; }

 private:
  enum class State { kObserving, kObserved, kApplied };
  void index(const std::vector<at::Tensor>& params);

  std::unordered_map<const void*, int> index_;  // TensorImpl of a parameter -> layout index
  State state_ = State::kObserving;
  std::vector<char> reached_;  // this pass: the walk reached the parameter's AccumulateGrad
  std::vector<int> arrivals_;  // this pass: gradients delivered
  int kind_ = 0;               // this pass's PassKind
  std::vector<int> first_order_;
  // Per pass kind: gradients the walk cannot see (nested backward), once known.
  std::map<int, std::vector<int>> hidden_;
};

}  // namespace zero
