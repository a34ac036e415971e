// A DeepSpeed config means here what it means to DeepSpeed 0.19.8: every default of every key
// zero accepts (read from deepspeed/runtime/constants.py, zero/config.py, lr_schedules.py,
// ops/adam/fused_adam.py and engine._configure_basic_optimizer), the scheduler's timing through
// the engine, weight decay on every parameter, and a corpus of real-world-shaped configs that
// train or fail naming the one feature zero lacks.
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <map>
#include <mutex>
#include <numbers>
#include <string>
#include <vector>

#include "support/thread_group.hpp"
#include "support/tiny_net.hpp"
#include "zero/engine.hpp"

namespace zero::testing {
namespace {

const std::string kSrc = ZERO_SOURCE_DIR;

#define EXPECT_HAS(msg, part) EXPECT_NE((msg).find(part), std::string::npos) << (msg)

Config load(const std::string& text) { return Config::from_string(text, "t.json"); }

// ---------------------------------------------------------------------------------------------
// Defaults. One row per key zero accepts whose default can matter; `zero` reads the loaded
// config. Rows marked differs=true are documented differences that do not change the math.

struct DefaultRow {
  const char* key;
  const char* config;  // the smallest config that selects the key's context
  double deepspeed;    // DeepSpeed 0.19.8's default
  std::function<double(const Config&)> zero;
  bool differs = false;  // zero deliberately differs (timing/logging only)
};

std::vector<DefaultRow> default_rows() {
  using C = const Config&;
  const char* adamw = "optimizer: {type: AdamW}";
  const char* torch_adamw = "optimizer: {type: AdamW, params: {torch_adam: true}}";
  const char* torch_adam = "optimizer: {type: Adam, params: {torch_adam: true}}";
  const char* sgd = "optimizer: {type: SGD}";
  const char* wlr = "scheduler: {type: WarmupLR}";
  const char* wcos = "scheduler: {type: WarmupCosineLR, params: {total_num_steps: 5000}}";
  return {
      {"gradient_clipping", "{}", 1.0, [](C c) { return c.gradient_clipping; }},
      {"zero_optimization.stage", "{}", 0, [](C c) { return c.zero_optimization.stage; }},
      {"zero_optimization.reduce_bucket_size", "{}", 5e8,
       [](C c) { return static_cast<double>(c.zero_optimization.reduce_bucket_size); }},
      {"zero_optimization.allgather_bucket_size", "{}", 5e8,
       [](C c) { return static_cast<double>(c.zero_optimization.allgather_bucket_size); }},
      {"zero_optimization.contiguous_gradients", "{}", 1,
       [](C c) { return c.zero_optimization.contiguous_gradients; }},
      {"zero_optimization.reduce_scatter", "{}", 1,
       [](C c) { return c.zero_optimization.reduce_scatter; }},
      {"zero_optimization.overlap_comm", "{}", 0,
       [](C c) { return c.zero_optimization.overlap_comm; }, true},
      {"bf16.enabled", "{}", 0, [](C c) { return c.bf16; }},
      // Unset: the model dtype (engine.py get_data_types), so bf16 sums micro-steps in bf16.
      {"data_types.grad_accum_dtype (fp32 model; fp32 = 0)", "{}", 0,
       [](C c) { return static_cast<double>(c.accum_dtype()); }},
      {"data_types.grad_accum_dtype (bf16 model; bf16 = 1)", "bf16: {enabled: true}", 1,
       [](C c) { return static_cast<double>(c.accum_dtype()); }},
      {"data_types.grad_accum_dtype (fp16 model; fp16 = 2)", "fp16: {enabled: true}", 2,
       [](C c) { return static_cast<double>(c.accum_dtype()); }},
      {"fp16.enabled", "{}", 0, [](C c) { return c.fp16.enabled; }},
      {"fp16.loss_scale", "{}", 0, [](C c) { return c.fp16.loss_scale; }},
      {"fp16.initial_scale_power", "{}", 16, [](C c) { return c.fp16.initial_scale_power; }},
      {"fp16.loss_scale_window", "{}", 1000, [](C c) { return c.fp16.loss_scale_window; }},
      {"fp16.hysteresis", "{}", 2, [](C c) { return c.fp16.hysteresis; }},
      {"fp16.min_loss_scale", "{}", 1, [](C c) { return c.fp16.min_loss_scale; }},
      {"optimizer.params.lr (FusedAdam)", adamw, 1e-3, [](C c) { return c.optimizer.lr; }},
      {"optimizer.params.betas[0]", adamw, 0.9, [](C c) { return c.optimizer.beta1; }},
      {"optimizer.params.betas[1]", adamw, 0.999, [](C c) { return c.optimizer.beta2; }},
      {"optimizer.params.eps", adamw, 1e-8, [](C c) { return c.optimizer.eps; }},
      {"optimizer.params.weight_decay (FusedAdam)", adamw, 0.0,
       [](C c) { return c.optimizer.weight_decay; }},
      {"optimizer.params.weight_decay (torch_adam: torch.optim.AdamW)", torch_adamw, 0.01,
       [](C c) { return c.optimizer.weight_decay; }},
      {"optimizer.params.weight_decay (type Adam, torch_adam: AdamW mode)", torch_adam, 0.01,
       [](C c) { return c.optimizer.weight_decay; }},
      {"optimizer.params.lr (torch.optim.SGD)", sgd, 1e-3, [](C c) { return c.optimizer.lr; }},
      {"optimizer.params.momentum (SGD)", sgd, 0, [](C c) { return c.optimizer.momentum; }},
      {"optimizer.params.dampening (SGD)", sgd, 0, [](C c) { return c.optimizer.dampening; }},
      {"optimizer.params.nesterov (SGD)", sgd, 0, [](C c) { return c.optimizer.nesterov; }},
      {"optimizer.params.weight_decay (SGD)", sgd, 0, [](C c) { return c.optimizer.weight_decay; }},
      {"scheduler.params.warmup_min_lr", wlr, 0, [](C c) { return c.scheduler.warmup_min_lr; }},
      {"scheduler.params.warmup_num_steps", wlr, 1000,
       [](C c) { return static_cast<double>(c.scheduler.warmup_num_steps); }},
      {"scheduler.params.warmup_type (log = 1)", wlr, 1,
       [](C c) { return c.scheduler.warmup_type == "log"; }},
      {"scheduler.params.warmup_min_ratio", wcos, 0,
       [](C c) { return c.scheduler.warmup_min_ratio; }},
      {"scheduler.params.cos_min_ratio", wcos, 1e-4, [](C c) { return c.scheduler.cos_min_ratio; }},
      {"scheduler.params.warmup_num_steps (WarmupCosineLR)", wcos, 1000,
       [](C c) { return static_cast<double>(c.scheduler.warmup_num_steps); }},
      {"no_weight_decay (DeepSpeed decays every parameter: empty)", "{}", 0,
       [](C c) { return static_cast<double>(c.no_weight_decay.size()); }},
      {"activation_checkpointing.partition_activations", "{}", 0,
       [](C c) { return c.extra_bool("activation_checkpointing.partition_activations"); }},
      {"activation_checkpointing.cpu_checkpointing", "{}", 0,
       [](C c) { return c.extra_bool("activation_checkpointing.cpu_checkpointing"); }},
  };
}

TEST(DeepSpeedDefaults, EveryAcceptedKeyDefaultsAsInDeepSpeed) {
  for (const auto& row : default_rows()) {
    const Config c = load(row.config);
    const double got = row.zero(c);
    if (row.differs) {
      EXPECT_NE(got, row.deepspeed) << row.key << ": a documented difference changed";
    } else {
      EXPECT_DOUBLE_EQ(got, row.deepspeed) << row.key << " (config " << row.config << ")";
    }
  }
  // Keys whose DeepSpeed default is "unset, use the model dtype": zero leaves them unset too.
  const Config c = load("{}");
  EXPECT_FALSE(c.communication_data_type.has_value());
  EXPECT_FALSE(c.scheduler.warmup_max_lr.has_value());  // resolved per type: next test
  EXPECT_FALSE(c.grad_accum_dtype.has_value());
}

// Runs `steps` optimizer steps of TinyNet on `world` thread ranks and returns, per step, the lr
// the engine used (engine.lr() before the step) and the final parameters.
struct TrainRun {
  std::vector<double> lrs;
  std::vector<double> losses;
  at::Tensor params;
};

TrainRun train(Config cfg, int world, int steps, int64_t rows) {
  TrainRun out;
  std::mutex mu;
  run_ranks(world, [&](std::shared_ptr<comm::Group> group) {
    auto net = make_tiny_net(11);
    auto engine = initialize(net, cfg, group);
    const int acc = static_cast<int>(engine.config().gradient_accumulation_steps);
    const auto dtype = engine.config().param_dtype();
    for (int s = 0; s < steps; ++s) {
      const double lr = engine.lr();
      const Batch g = global_batch(s, rows);
      double loss_sum = 0;
      for (int m = 0; m < acc; ++m) {
        Batch b = rank_micro_batch(g, group->rank(), world, m, acc);
        at::Tensor x = b.x;
        if (dtype == Dtype::kBFloat16) x = x.to(at::kBFloat16);
        if (dtype == Dtype::kFloat16) x = x.to(at::kHalf);
        at::Tensor loss = mse(net->forward(x).to(at::kFloat), b.y);
        loss_sum += engine.all_reduce_mean(loss.item<double>());
        engine.backward(loss);
        engine.step();
      }
      std::lock_guard<std::mutex> lock(mu);
      if (group->rank() == 0) {
        out.lrs.push_back(lr);
        out.losses.push_back(loss_sum / acc);
      }
    }
    std::lock_guard<std::mutex> lock(mu);
    if (group->rank() == 0) out.params = flatten(*net);
  });
  return out;
}

// Single-process torch::optim with the per-step lrs DeepSpeed's schedule gives, every parameter
// in one group (DeepSpeed's default decays them all).
at::Tensor reference(const Config& cfg, const std::vector<double>& lrs, int64_t rows) {
  auto net = make_tiny_net(11);
  const auto& o = cfg.optimizer;
  std::unique_ptr<torch::optim::Optimizer> opt;
  if (o.type == "SGD") {
    opt = std::make_unique<torch::optim::SGD>(net->parameters(), torch::optim::SGDOptions(1.0)
                                                                     .momentum(o.momentum)
                                                                     .dampening(o.dampening)
                                                                     .weight_decay(o.weight_decay)
                                                                     .nesterov(o.nesterov));
  } else {
    opt =
        std::make_unique<torch::optim::AdamW>(net->parameters(), torch::optim::AdamWOptions(1.0)
                                                                     .betas({o.beta1, o.beta2})
                                                                     .eps(o.eps)
                                                                     .weight_decay(o.weight_decay));
  }
  for (size_t s = 0; s < lrs.size(); ++s) {
    for (auto& group : opt->param_groups()) group.options().set_lr(lrs[s]);
    opt->zero_grad();
    const Batch b = global_batch(static_cast<int64_t>(s), rows);
    mse(net->forward(b.x), b.y).backward();
    opt->step();
  }
  return flatten(*net);
}

void expect_close(const at::Tensor& a, const at::Tensor& b, double tol, const std::string& what) {
  const double diff = (a - b).abs().max().item<double>();
  EXPECT_LE(diff, tol) << what;
}

// DeepSpeed's per-step lrs, worked from lr_schedules.py by hand: the constructor's value for
// step 0, then get_lr() at iteration k - 1.
TEST(ScheduleTiming, EngineStepsUseDeepSpeedsLrPerStep) {
  struct Case {
    std::string json;
    std::vector<double> lrs;
  };
  const double pi = std::numbers::pi;
  // WarmupCosineLR (lr 0.02, total 8, warmup 2 linear, min ratio 0.5, cos_min_ratio 0.1):
  // step 0: 0 (constructor), step 1: it 0 -> 0.5, step 2: it 1 -> 0.5 + 0.5 * 0.5,
  // step k >= 3: it k-1, real step k-2 of 6: 0.1 + 0.9 * (1 + cos(pi (k-2)/6)) / 2.
  std::vector<double> cos_lrs = {0.0, 0.02 * 0.5, 0.02 * 0.75};
  for (int k = 3; k < 8; ++k) {
    cos_lrs.push_back(0.02 * (0.1 + 0.9 * (1 + std::cos(pi * (k - 2) / 6.0)) / 2));
  }
  const std::vector<Case> cases = {
      // WarmupLR linear over 4 to 0.1: steps 0 and 1 at warmup_min_lr, then it/4 of the way.
      {R"({"optimizer": {"type": "SGD", "params": {"lr": 0.5, "momentum": 0.9}},
           "scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": 0.0,
             "warmup_max_lr": 0.1, "warmup_num_steps": 4, "warmup_type": "linear"}}})",
       {0.0, 0.0, 0.025, 0.05, 0.075, 0.1, 0.1}},
      // WarmupLR without warmup_max_lr peaks at the optimizer's lr (DeepSpeed 0.19: None -> lr).
      {R"({"optimizer": {"type": "SGD", "params": {"lr": 0.08}},
           "scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": 0.02,
             "warmup_num_steps": 2, "warmup_type": "linear"}}})",
       {0.02, 0.02, 0.05, 0.08, 0.08}},
      // WarmupDecayLR without warmup_max_lr peaks at its constructor default 0.001, not the
      // optimizer's lr; decays as (total - it) / (total - warmup) from iteration 2.
      {R"({"optimizer": {"type": "AdamW", "params": {"lr": 0.5, "weight_decay": 0.1}},
           "scheduler": {"type": "WarmupDecayLR", "params": {"total_num_steps": 6,
             "warmup_num_steps": 2, "warmup_type": "linear"}}})",
       {0.0, 0.0, 0.0005, 0.001, 0.001 * 3 / 4, 0.001 * 2 / 4, 0.001 * 1 / 4, 0.0}},
      {R"({"optimizer": {"type": "AdamW", "params": {"lr": 0.02}},
           "scheduler": {"type": "WarmupCosineLR", "params": {"total_num_steps": 8,
             "warmup_num_steps": 2, "warmup_type": "linear", "warmup_min_ratio": 0.5,
             "cos_min_ratio": 0.1}}})",
       cos_lrs},
  };
  for (const auto& tc : cases) {
    Config cfg = load(tc.json);
    cfg.gradient_clipping = 0;  // the reference does not clip
    cfg.zero_optimization.stage = 2;
    cfg.zero_optimization.reduce_bucket_size = 100;
    cfg.train_micro_batch_size_per_gpu = 4;
    const int steps = static_cast<int>(tc.lrs.size());
    const TrainRun r = train(cfg, 2, steps, 8);
    ASSERT_EQ(r.lrs.size(), tc.lrs.size());
    for (int k = 0; k < steps; ++k) {
      EXPECT_NEAR(r.lrs[k], tc.lrs[k], 1e-15) << tc.json << " step " << k;
    }
    expect_close(r.params, reference(cfg, tc.lrs, 8), 2e-6, tc.json);
  }
}

TEST(ScheduleTiming, FirstOptimizerStepOfAWarmupFromZeroLeavesTheWeights) {
  // The clearest symptom of the old off-by-one: DeepSpeed's first two steps run at lr 0.
  Config cfg = load(R"({"optimizer": {"type": "SGD", "params": {"lr": 1.0}},
                        "scheduler": {"type": "WarmupLR", "params": {"warmup_max_lr": 0.1,
                          "warmup_num_steps": 10}}, "gradient_clipping": 0})");
  cfg.train_micro_batch_size_per_gpu = 4;
  const at::Tensor initial = flatten(*make_tiny_net(11));
  EXPECT_TRUE(at::equal(train(cfg, 2, 2, 8).params, initial));
  EXPECT_FALSE(at::equal(train(cfg, 2, 3, 8).params, initial));
}

TEST(WeightDecay, DefaultDecaysEveryParameterAsDeepSpeed) {
  Config cfg = load(R"({"optimizer": {"type": "AdamW", "params": {"lr": 0.01,
                          "weight_decay": 0.5}}, "gradient_clipping": 0,
                        "zero_optimization": {"stage": 1, "reduce_bucket_size": 100}})");
  ASSERT_TRUE(cfg.no_weight_decay.empty());
  cfg.train_micro_batch_size_per_gpu = 4;
  const std::vector<double> lrs(5, 0.01);
  const TrainRun r = train(cfg, 2, 5, 8);
  expect_close(r.params, reference(cfg, lrs, 8), 2e-6, "decay on every parameter");
  // And the exclusion, when asked for, changes the result (the bias/norm entries).
  cfg.no_weight_decay = {"bias", "norm"};
  EXPECT_GT((train(cfg, 2, 5, 8).params - r.params).abs().max().item<double>(), 1e-5);
}

// ---------------------------------------------------------------------------------------------
// The corpus: DeepSpeed configs shaped like DeepSpeed's examples and the HF Transformers /
// Accelerate test configs. "" = loads and trains; otherwise the error must name the feature.

const std::map<std::string, std::string>& corpus_expectations() {
  static const std::map<std::string, std::string> m = {
      {"accelerate_zero1_sgd.json", ""},
      {"accelerate_zero2_ga_only.json", ""},
      {"ds_bf16_accum.json", ""},
      {"ds_bing_bert_lamb.json", "'optimizer.type' 'Lamb' is not supported by zero"},
      {"ds_chat_bf16_fp32_accum.json", ""},
      {"ds_chat_step1_zero2.json", ""},
      {"ds_cifar_stage0.json", ""},
      {"ds_fp16_dynamic.json", ""},
      {"ds_megatron_gpt2_actckpt.json", ""},
      {"ds_megatron_gpt2_zero1.json", "use the top-level 'gradient_clipping' key instead"},
      {"ds_onebit_adam.json", "'optimizer.type' 'OneBitAdam' is not supported by zero"},
      {"ds_onecycle.json", "'scheduler.type' 'OneCycle' is not supported by zero"},
      // The pipeline section loads (issue 24); without 'stages' it is one stage, which trains
      // the whole model as DeepSpeed does a model that is not a PipelineModule.
      {"ds_pipeline.json", ""},
      {"ds_warmup_cosine_torch_adam.json", ""},
      {"hf_zero1_bf16.json", ""},
      {"hf_zero2_auto.json", ""},
      {"hf_zero2_offload_cpu.json", ""},
      {"accelerate_zero2_offload.json", ""},
      {"ds_cifar_cpu_offload.json", ""},
      {"hf_zero2_warmup_decay.json", ""},
      // The three keys issue 36 found refused: a compile block (a warning), total_num_steps
      // "auto" (filled below as zero-train fills it) and fp16.auto_cast.
      {"hf_zero2_compile_autocast.json", ""},
      // Stage 3 (issue 33): "auto" persistence filled from the hidden size below, as
      // transformers fills it.
      {"hf_zero3_auto.json", ""},
      {"lightning_zero2.json", ""},
      // LLaMA-Factory's examples/deepspeed/ shapes: top-level comms_config and monitor_config,
      // which DeepSpeed never reads, load with one warning.
      {"llamafactory_ds_z0_config.json", ""},
      {"llamafactory_ds_z2_config.json", ""},
      {"llamafactory_ds_z2_offload_config.json", ""},
  };
  return m;
}

TEST(DeepSpeedCorpus, EachConfigTrainsOrNamesTheMissingFeature) {
  const std::string dir = kSrc + "/tests/data/ds_corpus";
  std::vector<std::string> files;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    if (e.path().extension() == ".json") files.push_back(e.path().filename().string());
  }
  std::sort(files.begin(), files.end());
  const auto& expect = corpus_expectations();
  EXPECT_EQ(files.size(), expect.size()) << "every corpus file needs an expectation";
  int trained = 0, refused = 0;
  for (const auto& name : files) {
    SCOPED_TRACE(name);
    auto it = expect.find(name);
    ASSERT_NE(it, expect.end()) << name << " has no expectation";
    const std::string path = dir + "/" + name;
    if (!it->second.empty()) {
      try {
        Config::from_file(path);
        ADD_FAILURE() << name << " loaded; expected: " << it->second;
      } catch (const ConfigError& e) {
        EXPECT_HAS(std::string(e.what()), it->second);
        EXPECT_HAS(std::string(e.what()), path);
        ++refused;
      }
      continue;
    }
    Config cfg = Config::from_file(path);
    // What HF's Trainer does for "auto" total_num_steps: the run's optimizer steps.
    if (cfg.scheduler.total_num_steps_auto) cfg.scheduler.total_num_steps = 3;
    // What HF's Trainer does for stage 3's "auto" keys: from the model's hidden size (TinyNet's
    // 24).
    cfg.zero_optimization.stage3.resolve_auto(24);
    // Small buckets so stages 1/2 really split the tiny model into several.
    cfg.zero_optimization.reduce_bucket_size =
        std::min<int64_t>(cfg.zero_optimization.reduce_bucket_size, 300);
    Config probe = cfg;
    probe.resolve_batch(2);
    const int64_t rows = probe.train_batch_size;
    const TrainRun r = train(cfg, 2, 3, rows);
    ASSERT_EQ(r.losses.size(), 3u);
    for (double l : r.losses) EXPECT_TRUE(std::isfinite(l)) << l;
    // At least one step ran with a nonzero lr, so the weights moved.
    const at::Tensor initial = flatten(*make_tiny_net(11));
    if (r.lrs.back() > 0) EXPECT_FALSE(at::equal(r.params, initial));
    ++trained;
  }
  std::printf("ds_corpus: %zu configs: %d train, %d refused naming the feature\n", files.size(),
              trained, refused);
}

}  // namespace
}  // namespace zero::testing
