// Cross-entropy over logits split by vocabulary (the output of a ColumnParallelLinear head
// without gather_output), Megatron's vocab_parallel_cross_entropy: no rank ever holds the full
// logits. Per token: the maximum over the whole vocabulary (each rank's maximum, all-gathered),
// the target's logit from the rank whose part holds it and the sum of exponentials, both summed
// over the group in one all-reduce; loss = log(sum exp(z - max)) - (z_target - max). Backward is
// softmax - one_hot(target) on each rank's part, with no communication.
#pragma once

#include <ATen/core/Reduction.h>
#include <ATen/core/Tensor.h>

#include <cstdint>

#include "zero/tensor_parallel/mappings.hpp"

namespace zero::tensor_parallel {

// logits_shard: [..., vocab / T], this rank's part of the vocabulary (rank r: ids
// [r * vocab / T, (r + 1) * vocab / T)). target: [...], ids in [0, vocab) or ignore_index
// (supervised fine-tuning's masked prompt tokens, -100 as in torch). The loss is computed in fp32
// whatever the logits' dtype, and `reduction` reduces it as at::cross_entropy's does:
//   - at::Reduction::Mean (the default, torch's): the mean over the tokens whose target is not
//     ignore_index, never over every token. A batch whose every target is ignored gives NaN and
//     a zero gradient, as torch does.
//   - at::Reduction::Sum: the sum over the tokens.
//   - at::Reduction::None: the loss per token, [...]; an ignored token's is 0.
// An ignored token has no gradient. The same on every rank of the group.
// `check_targets`: the targets' shape and ids are checked, agreed over the group (an all-gather
// of three numbers per rank and a host read per call, which on a GPU waits for the queued work),
// every rank throwing the same error naming the bad id and its rank. Off: no collective and no
// host read; a wrong shape throws on its own rank only (its peers then wait in the loss's
// collectives until comm_timeout_s), and a target outside the vocabulary that is not
// ignore_index has its logit on no rank: its loss is log sum exp(z - max), Megatron-LM's masked
// value (never an out-of-bounds read). For targets checked already (zero-train's).
at::Tensor vocab_parallel_cross_entropy(const at::Tensor& logits_shard, const at::Tensor& target,
                                        const GroupPtr& group, int64_t ignore_index = -100,
                                        int64_t reduction = at::Reduction::Mean,
                                        bool check_targets = true);

}  // namespace zero::tensor_parallel
