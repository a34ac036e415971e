// What one pipeline layer costs to train, in FLOPs per token (forward + backward): the weights
// `pipeline.partition: compute` balances, and the planner's stage times (parallel_plan.hpp), so
// that the layout the planner recommends and the stages the runtime cuts agree. Torch-free.
//
// Megatron-LM's count (training.py num_floating_point_operations; Narayanan et al. 2021, §5.1):
// a matmul weight costs 2 FLOPs per token forward and 4 backward (the input's and the weight's
// gradient), 6 per parameter; a block's attention scores and weighted sum add 2 · 2·s·h forward,
// 12·s·h with backward (Megatron counts the full s x s square, not the causal half); the logits
// 6·h·V. Megatron leaves out the embedding and the loss; a partition cannot, because they sit on
// the first and last stage: the embedding's lookup is counted as its backward's scatter-add (h
// per token), the loss as its softmax and cross-entropy over the vocabulary (forward: max,
// subtract, exp, sum, log, 5·V; backward: the probabilities less the one-hot, scaled, 3·V).
// Norms and element-wise work are counted only through their parameters, as Megatron does.
#pragma once

#include <cstdint>

namespace zero::pipeline {

// A layer of `params` matmul weights (and nothing else of note): 6 x its parameters. Also the
// fallback for a layer that declares no cost.
constexpr int64_t matmul_flops_per_token(int64_t params) { return 6 * params; }

// Attention over `seq` positions in a model of width `hidden`: Megatron's 12·s·h.
constexpr int64_t attention_flops_per_token(int64_t hidden, int64_t seq) {
  return 12 * hidden * seq;
}

// A transformer block of `params` parameters (attention and MLP weights, norms): 6·params +
// 12·s·h.
constexpr int64_t block_flops_per_token(int64_t params, int64_t hidden, int64_t seq) {
  return matmul_flops_per_token(params) + attention_flops_per_token(hidden, seq);
}

// An embedding table's lookup: the backward's scatter-add of a row of `hidden` per token.
constexpr int64_t embedding_flops_per_token(int64_t hidden) { return hidden; }

// Softmax cross-entropy over `vocab` logits: 5·V forward, 3·V backward.
constexpr int64_t cross_entropy_flops_per_token(int64_t vocab) { return 8 * vocab; }

// The last layer of a language model: its `params` parameters (the head's h·V and the final
// norm's h) as matmul weights, and the loss over `vocab` logits that runs on its stage.
constexpr int64_t lm_head_flops_per_token(int64_t params, int64_t vocab) {
  return matmul_flops_per_token(params) + cross_entropy_flops_per_token(vocab);
}

}  // namespace zero::pipeline
