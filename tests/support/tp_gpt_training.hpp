// The shared part of the tensor-parallel GPT training tests (test_tensor_parallel_gpt_training,
// test_tensor_parallel_gpt_precision): the tiny preset's batches, the independent reference (the
// plain models::Gpt trained in one process with torch::optim on the same batches) and the
// engine cases' config and optimizer step.
#pragma once

#include <torch/optim/optimizer.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "support/token_batch.hpp"
#include "zero/engine.hpp"
#include "zero/models/gpt.hpp"
#include "zero/models/tp_gpt.hpp"

namespace zero::testing::tp_gpt {

constexpr int kSteps = 5;
constexpr int64_t kBatch = 4, kSeq = 16;
constexpr double kTol = 1e-5;

enum class Opt { kSgd, kAdamW };
constexpr double kSgdLr = 0.5, kAdamLr = 1e-3, kWeightDecay = 0.01;

// The parameters: SGD, each within kTol (max |a - b| / max |b|). AdamW divides each gradient
// element by its own RMS, so the relative rounding error of a small gradient element (the order
// of a sum differs: ~1e-7 of the largest element, which can be much of a small one) becomes the
// same relative error of a whole lr-sized step, and the steps compound. Measured over these 5
// steps (lr 1e-3, 3 runs): up to 9e-6 in L2 and single elements 3e-4 of the tensor's largest
// value. At lr 1e-2 the dynamics turn chaotic: 3e-4 in L2 and the losses 1e-5 apart by step 5;
// the reference against itself, each gradient summed from the batch's two halves, then differs
// by up to 7e-4 per element too: the optimizer's sensitivity, not the split. So AdamW is
// checked in L2 within kAdamL2Tol and per element within kAdamMaxTol; the losses stay within
// kTol. A misplaced shard or a missing reduction is off by 1e-3 .. 1 in both (the
// sequence-parallel norms without their all-reduce: > 1e-3 after 10 SGD steps,
// test_tensor_parallel_training).
constexpr double kAdamL2Tol = 5e-5, kAdamMaxTol = 2e-3;

// A threshold below the tiny preset's gradient norm at every one of these steps (train_plain
// checks): each step is clipped, so a norm that counted a replicated parameter twice, or one
// tp rank's shards only, or a norm's partial gradient, would scale the step by another factor.
constexpr double kClip = 0.05;

models::GptConfig shape();

using Batch = TokenBatch;
Batch batch(int step, int64_t vocab);

// Supervised fine-tuning's batches: each row's prompt (its first 3 + 2 * row + step % 3 tokens)
// has its targets ignored (-100), 24 .. 32 of the 64 per step, a different count each step.
Batch masked_batch(int step, int64_t vocab);

std::unique_ptr<torch::optim::Optimizer> make_optimizer(Opt opt, std::vector<at::Tensor> params);

struct Reference {
  std::vector<double> losses;
  std::vector<double> grad_norms;            // the whole batch's gradient norm, before clipping
  std::map<std::string, at::Tensor> params;  // after the last step
};

// The initial weights every run starts from (drawn once, in the calling thread).
models::Gpt initial_model();

// `clip` > 0: the gradient clipped to that global norm before each step, as
// torch::nn::utils::clip_grad_norm_ does (the coefficient clip / (norm + 1e-6), at most 1).
// `masked`: on masked_batch's batches.
Reference train_plain(Opt opt, const models::Gpt& init, double clip = 0, int steps = kSteps,
                      bool masked = false);

void expect_trained_like(models::TpGptImpl& model, const Reference& ref, Opt opt, bool print);
void expect_loss(double got, const Reference& ref, int step, bool print);

// Through the engine: tensor-parallel groups of 2 ({0,1}, and {2,3} at D = 2), the engine over
// the data-parallel groups ({0,2} {1,3}; a group of one at D = 1) with the tensor-parallel group
// as a norm group, as zero-train wires it (examples::engine_groups): replicated parameters
// counted once in the clipping norm and, under sequence parallelism, the norms' and
// row-parallel biases' partial gradients summed over tp by the engine after its dp reduction
// (groups.norm.partial). Each data-parallel rank takes its rows of every batch, split again over
// the accumulation micro-steps; the tensor-parallel ranks of a pair take the same rows.
struct EngineCase {
  Opt opt;
  int stage;
  int dp;             // data-parallel size; world = 2 x dp
  bool sp;            // sequence parallelism
  double clip;        // gradient_clipping (0: off)
  int accumulation;   // gradient_accumulation_steps
  bool fake = false;  // world rank r on the fake accelerator's device r (support/fake_device.hpp)
};

std::string case_name(const EngineCase& c);
Config engine_config(const EngineCase& c);

// One optimizer step of the engine over step `step`'s batch: this rank's rows, in micro-steps.
// Returns the step's loss, the mean over the whole batch (every rank the same); `applied`: whether
// the optimizer step was applied (not skipped for an fp16 overflow).
double engine_step(Engine& engine, models::TpGptImpl& model, int step, int dp_rank, int dp,
                   int accumulation, bool* applied = nullptr);

}  // namespace zero::testing::tp_gpt
