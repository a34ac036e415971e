// The single-process reference of the pipelined checkpoint tests (test_pipeline_checkpoint.cpp,
// test_pipeline_interleaved_checkpoint.cpp): the whole example GPT in one process, plain
// autograd, torch's clip_grad_norm_ and the same torch optimizer, each step's batch in the
// micro-batches and data-parallel groups a pipelined run uses; and weights drawn from a
// generator of the test's own.
#pragma once

#include <cstdint>
#include <vector>

#include "support/pipeline_gpt.hpp"
#include "zero/config.hpp"
#include "zero/models/gpt.hpp"

namespace zero::testing {

enum class RefOpt { SGD, AdamW };

// SGD: lr 0.1, momentum 0.9. AdamW: lr 1e-2, weight decay 0.1, eps `adamw_eps`.
// The engine's optimizer keys for the reference's optimizer `o` (eps aside).
void set_optimizer(Config& c, RefOpt o);

struct RefSetup {
  int rows = 2;          // per micro-batch
  int global_rows = 16;  // per step, over every data-parallel rank
  double clip = 0.5;     // gradient_clipping
  double adamw_eps = 1e-6;
};

struct RefTrained {
  std::vector<float> losses;
  GptParams params;
};

// Every parameter from N(0, 0.05^2), drawn from a generator seeded with `seed` (rank threads
// share torch's global one).
GptParams draw_weights(const models::GptConfig& c, uint64_t seed);

// Each step's batch in global_rows / rows chunks of `rows` rows split into `groups[step]` equal
// groups in order (the data-parallel ranks' shares): each group's chunks accumulated by autograd,
// the groups' gradients then averaged. The sums go in the order the ranks' do: under AdamW a
// parameter with a gradient near zero (an embedding row no token of the batch uses) moves by
// about lr whatever its size, so the summation order alone would move it by more than 1e-5
// relative.
RefTrained reference_training(const models::GptConfig& c, const GptParams& init,
                              const std::vector<StepBatch>& batches, RefOpt o,
                              const std::vector<int>& groups, const RefSetup& setup = {});

}  // namespace zero::testing
