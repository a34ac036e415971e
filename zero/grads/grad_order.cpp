#include "zero/grads/grad_order.hpp"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/accumulate_grad.h>

#include <algorithm>
#include <numeric>
#include <unordered_set>

#include "offload/recompute_node.hpp"
#include "zero/grads/grad_buckets.hpp"

namespace zero {
namespace {
thread_local int current_pass_kind = 0;
}  // namespace

PassKind::PassKind(int kind) : previous_(current_pass_kind) { current_pass_kind = kind; }
PassKind::~PassKind() { current_pass_kind = previous_; }
int PassKind::current() { return current_pass_kind; }

GradOrder::GradOrder(const std::vector<at::Tensor>& params) {
  index(params);
  reached_.assign(params.size(), 0);
  arrivals_.assign(params.size(), 0);
}

void GradOrder::index(const std::vector<at::Tensor>& params) {
  index_.clear();
  for (size_t i = 0; i < params.size(); ++i) {
    index_[params[i].unsafeGetTensorImpl()] = static_cast<int>(i);
  }
}

std::vector<int> GradOrder::begin_pass(const std::vector<at::Tensor>& roots) {
  using torch::autograd::AccumulateGrad;
  using torch::autograd::Node;
  std::fill(reached_.begin(), reached_.end(), 0);
  std::fill(arrivals_.begin(), arrivals_.end(), 0);
  if (state_ == State::kObserving) first_order_.clear();
  kind_ = PassKind::current();

  std::vector<Node*> stack;
  std::unordered_set<Node*> seen;
  bool nested = false;  // a node that runs a backward of its own (a checkpointed block)
  auto visit = [&](Node* n) {
    if (n == nullptr || !seen.insert(n).second) return;
    nested = nested || runs_nested_backward(*n);
    if (auto* acc = dynamic_cast<AccumulateGrad*>(n)) {
      auto it = index_.find(acc->variable.unsafeGetTensorImpl());
      if (it != index_.end()) reached_[it->second] = 1;
      return;
    }
    stack.push_back(n);
  };
  for (const at::Tensor& root : roots) {
    // A parameter itself as a root (an empty stage passing its input through) has no grad_fn.
    const auto it = index_.find(root.unsafeGetTensorImpl());
    if (it != index_.end()) reached_[it->second] = 1;
    visit(root.grad_fn().get());
  }
  while (!stack.empty()) {
    Node* n = stack.back();
    stack.pop_back();
    for (const auto& edge : n->next_edges()) visit(edge.function.get());
  }

  const auto learned = hidden_.find(kind_);
  const bool known = learned != hidden_.end();
  std::vector<int> expected(reached_.size());
  for (size_t p = 0; p < expected.size(); ++p) {
    const int hidden = known ? learned->second[p] : 0;
    if (reached_[p]) {
      expected[p] = 1 + hidden;
    } else {
      // Unreached and no nested backward: unused in this pass. Behind a checkpointed block,
      // before the first pass counted: unknown.
      expected[p] = known ? hidden : (nested ? kUnknownArrivals : 0);
    }
  }
  return expected;
}

void GradOrder::on_grad(int param) {
  if (arrivals_[param]++ == 0 && state_ == State::kObserving) first_order_.push_back(param);
}

void GradOrder::end_pass(bool ok) {
  if (!ok) return;
  if (!hidden_.count(kind_)) {
    std::vector<int>& hidden = hidden_[kind_];
    hidden.resize(arrivals_.size());
    for (size_t p = 0; p < hidden.size(); ++p) {
      hidden[p] = std::max(0, arrivals_[p] - (reached_[p] ? 1 : 0));
    }
  }
  if (state_ == State::kObserving) state_ = State::kObserved;
}

GradOrder::Agreed GradOrder::agreed_order(comm::Group& group, const at::Device& device) {
  const int64_t n = static_cast<int64_t>(arrivals_.size());
  std::vector<int64_t> v{static_cast<int64_t>(first_order_.size())};
  v.insert(v.end(), first_order_.begin(), first_order_.end());
  std::vector<char> placed(n, 0);
  for (int p : first_order_) placed[p] = 1;
  for (int64_t p = 0; p < n; ++p) {
    if (!placed[p]) v.push_back(p);
  }
  at::Tensor t = at::tensor(v, at::kLong).to(device);
  group.broadcast(t, 0, "broadcast of the gradient arrival order").wait();
  t = t.cpu();
  const int64_t* d = t.data_ptr<int64_t>();
  return {std::vector<int>(d + 1, d + 1 + n), static_cast<int>(d[0])};
}

}  // namespace zero
