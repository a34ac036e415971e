// Cross-entropy over logits split by vocabulary (the output of a ColumnParallelLinear head
// without gather_output), Megatron's vocab_parallel_cross_entropy: no rank ever holds the full
// logits. Per token: the maximum over the whole vocabulary (each rank's maximum, all-gathered),
// the target's logit from the rank whose part holds it and the sum of exponentials, both summed
// over the group in one all-reduce; loss = log(sum exp(z - max)) - (z_target - max). Backward is
// softmax - one_hot(target) on each rank's part, with no communication.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

#include "zero/tensor_parallel/mappings.hpp"

namespace zero::tensor_parallel {

// logits_shard: [..., vocab / T], this rank's part of the vocabulary (rank r: ids
// [r * vocab / T, (r + 1) * vocab / T)). target: [...], ids in [0, vocab) or ignore_index.
// Returns the loss per token, [...], in fp32 (computed in fp32 whatever the logits' dtype); a
// token whose target is ignore_index has loss 0 and no gradient. The mean over the tokens that
// are not ignored equals at::cross_entropy on the full logits.
at::Tensor vocab_parallel_cross_entropy(const at::Tensor& logits_shard, const at::Tensor& target,
                                        const GroupPtr& group, int64_t ignore_index = -100);

}  // namespace zero::tensor_parallel
