// The tensor-parallel GPT tests' shared part: tp_gpt_training.hpp says what each piece is.
#include "support/tp_gpt_training.hpp"

#include <gtest/gtest.h>
#include <torch/nn/utils/clip_grad.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>
#include <torch/utils.h>

#include <ATen/CPUGeneratorImpl.h>

#include <cmath>
#include <cstdio>
#include <limits>

#include "support/tp_compare.hpp"

namespace zero::testing::tp_gpt {

models::GptConfig shape() { return tiny_gpt(kSeq); }

Batch batch(int step, int64_t vocab) { return token_batch(500 + step, kBatch, kSeq, vocab); }

Batch masked_batch(int step, int64_t vocab) {
  Batch b = batch(step, vocab);
  for (int64_t row = 0; row < kBatch; ++row) {
    b.targets[row].narrow(0, 0, 3 + 2 * row + step % 3).fill_(-100);
  }
  return b;
}

std::unique_ptr<torch::optim::Optimizer> make_optimizer(Opt opt, std::vector<at::Tensor> params) {
  if (opt == Opt::kSgd) {
    return std::make_unique<torch::optim::SGD>(params, torch::optim::SGDOptions(kSgdLr));
  }
  return std::make_unique<torch::optim::AdamW>(
      params, torch::optim::AdamWOptions(kAdamLr).weight_decay(kWeightDecay));
}

models::Gpt initial_model() {
  // The Gpt constructor draws from torch's global generator, which LibTorch seeds from the
  // system's entropy in every process (only Python's `import torch` seeds it with a constant): a
  // fixed seed here, in the main thread before any rank thread exists, makes every run start from
  // the same weights. Unseeded, AdamW's L2 error ranged 1.3e-6 .. 1.1e-4 from run to run.
  at::manual_seed(21);
  models::Gpt gpt(shape());
  at::Generator gen = at::detail::createCPUGenerator(21);
  torch::NoGradGuard no_grad;
  for (auto& p : gpt->named_parameters()) {
    if (p.key().find("norm") != std::string::npos) {
      p.value().copy_(1 + 0.1 * at::randn(p.value().sizes(), gen));
    }
  }
  return gpt;
}

Reference train_plain(Opt opt, const models::Gpt& init, double clip, int steps, bool masked) {
  models::Gpt gpt(shape());
  {
    torch::NoGradGuard no_grad;
    auto src = init->named_parameters();
    for (auto& p : gpt->named_parameters()) p.value().copy_(src[p.key()]);
  }
  auto optimizer = make_optimizer(opt, gpt->parameters());
  Reference ref;
  for (int step = 0; step < steps; ++step) {
    const Batch b = masked ? masked_batch(step, shape().vocab) : batch(step, shape().vocab);
    optimizer->zero_grad();
    at::Tensor loss = gpt->loss(b.tokens, b.targets);
    loss.backward();
    const double norm = torch::nn::utils::clip_grad_norm_(
        gpt->parameters(), clip > 0 ? clip : std::numeric_limits<double>::infinity());
    if (clip > 0) EXPECT_GT(norm, clip) << "step " << step << ": kClip must clip every step";
    ref.grad_norms.push_back(norm);
    optimizer->step();
    ref.losses.push_back(loss.item<double>());
  }
  for (const auto& p : gpt->named_parameters()) ref.params[p.key()] = p.value().detach().clone();
  return ref;
}

void expect_trained_like(models::TpGptImpl& model, const Reference& ref, Opt opt, bool print) {
  const auto full = model.gather_full();
  ASSERT_EQ(full.size(), ref.params.size());
  for (const auto& [name, shard_value] : full) {
    const at::Tensor value = shard_value.cpu();
    const at::Tensor& want = ref.params.at(name);
    if (opt == Opt::kSgd) {
      expect_rel_close(value, want, kTol, "trained " + name, print);
      continue;
    }
    const double l2 = (value - want).norm().item<double>() / want.norm().item<double>();
    const double worst = max_rel_err(value, want);
    EXPECT_LE(l2, kAdamL2Tol) << "trained " << name << ": L2 relative error";
    EXPECT_LE(worst, kAdamMaxTol) << "trained " << name << ": max relative error";
    if (print) {
      std::printf("  trained %-36s L2 rel err %.2g (tol %.0e), max rel err %.2g (tol %.0e)\n",
                  name.c_str(), l2, kAdamL2Tol, worst, kAdamMaxTol);
    }
  }
}

void expect_loss(double got, const Reference& ref, int step, bool print) {
  const double want = ref.losses[step];
  EXPECT_NEAR(got, want, kTol * std::abs(want)) << "step " << step;
  if (print) {
    std::printf("  step %d loss %.7f reference %.7f rel err %.2g\n", step, got, want,
                std::abs(got - want) / want);
  }
}

std::string case_name(const EngineCase& c) {
  std::string n = std::string(c.opt == Opt::kSgd ? "SGD" : "AdamW") + "_stage" +
                  std::to_string(c.stage) + "_T2" + (c.dp > 1 ? "xD" + std::to_string(c.dp) : "");
  if (c.sp) n += "_sequence_parallel";
  if (c.clip > 0) n += "_clip";
  if (c.accumulation > 1) n += "_accum" + std::to_string(c.accumulation);
  if (c.fake) n += "_fake_device";
  return n;
}

Config engine_config(const EngineCase& c) {
  Config cfg;
  cfg.zero_optimization.stage = c.stage;
  cfg.train_micro_batch_size_per_gpu = kBatch / (c.dp * c.accumulation);
  cfg.gradient_accumulation_steps = c.accumulation;
  cfg.gradient_clipping = c.clip;
  cfg.optimizer.type = c.opt == Opt::kSgd ? "SGD" : "AdamW";
  cfg.optimizer.lr = c.opt == Opt::kSgd ? kSgdLr : kAdamLr;
  cfg.optimizer.weight_decay = c.opt == Opt::kSgd ? 0.0 : kWeightDecay;
  // Stage 3: every block parameter in its block's unit, the norms included (DeepSpeed's
  // default threshold would keep the tiny preset's block whole in the root).
  cfg.zero_optimization.stage3.param_persistence_threshold = 0;
  return cfg;
}

double engine_step(Engine& engine, models::TpGptImpl& model, int step, int dp_rank, int dp,
                   int accumulation, bool* applied) {
  Batch b = batch(step, shape().vocab);
  // On the model's device (the fake accelerator's, or the host).
  const c10::Device device = model.embed->weight.device();
  b.tokens = b.tokens.to(device);
  b.targets = b.targets.to(device);
  const int64_t rows = kBatch / (dp * accumulation);
  double loss_sum = 0;
  for (int micro = 0; micro < accumulation; ++micro) {
    const int64_t first = (dp_rank * accumulation + micro) * rows;
    at::Tensor loss = model.loss(b.tokens.narrow(0, first, rows), b.targets.narrow(0, first, rows));
    loss_sum += engine.all_reduce_mean(loss.item<double>());
    engine.backward(loss);
    const bool stepped = engine.step();
    if (micro < accumulation - 1) {
      EXPECT_FALSE(stepped) << "micro-step " << micro << " is not a boundary";
    } else if (applied) {
      *applied = stepped;
    } else {
      EXPECT_TRUE(stepped) << "step " << step;
    }
  }
  return loss_sum / accumulation;
}

}  // namespace zero::testing::tp_gpt
