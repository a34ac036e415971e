// For the engine's walk over a loss's graph (zero/grads/grad_order.cpp): which nodes run a backward
// of their own, whose parameters the walk cannot see.
#pragma once

namespace torch::autograd {
struct Node;
}

namespace zero {

// True for the node of a zero::checkpoint block.
bool runs_nested_backward(const torch::autograd::Node& node);

}  // namespace zero
