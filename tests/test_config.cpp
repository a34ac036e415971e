// Config loading: DeepSpeed JSON and our YAML presets load; every mistake is an error that
// names the key, the position and what is allowed. The sections of the features beyond plain
// ZeRO-1/2 (offload, compression, tensor and pipeline parallelism): test_config_features.cpp.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "support/config_helpers.hpp"
#include "zero/config.hpp"

using zero::Config;
using zero::ConfigError;
using zero::Dtype;
using namespace zero::testing;

TEST(Config, DeepSpeedJsonLoadsUnchanged) {
  const std::string path = kSrc + "/tests/data/deepspeed_zero2.json";
  Config c = Config::from_file(path);
  EXPECT_EQ(c.source, path);
  EXPECT_EQ(c.train_batch_size, 16);
  EXPECT_EQ(c.train_micro_batch_size_per_gpu, 4);
  EXPECT_EQ(c.gradient_accumulation_steps, 2);
  EXPECT_DOUBLE_EQ(c.gradient_clipping, 1.0);
  EXPECT_EQ(c.steps_per_print, 50);
  EXPECT_TRUE(c.bf16);
  EXPECT_EQ(c.param_dtype(), Dtype::kBFloat16);
  EXPECT_EQ(c.zero_optimization.stage, 2);
  EXPECT_EQ(c.zero_optimization.reduce_bucket_size, 500'000'000);
  EXPECT_EQ(c.zero_optimization.allgather_bucket_size, 500'000'000);
  EXPECT_TRUE(c.zero_optimization.overlap_comm);
  EXPECT_EQ(c.optimizer.type, "AdamW");
  EXPECT_DOUBLE_EQ(c.optimizer.lr, 3e-4);
  EXPECT_DOUBLE_EQ(c.optimizer.beta1, 0.9);
  EXPECT_DOUBLE_EQ(c.optimizer.beta2, 0.999);
  EXPECT_DOUBLE_EQ(c.optimizer.eps, 1e-8);
  EXPECT_DOUBLE_EQ(c.optimizer.weight_decay, 0.01);
  EXPECT_EQ(c.scheduler.type, "WarmupLR");
  EXPECT_DOUBLE_EQ(c.scheduler.warmup_min_lr, 0.0);
  ASSERT_TRUE(c.scheduler.warmup_max_lr.has_value());
  EXPECT_DOUBLE_EQ(*c.scheduler.warmup_max_lr, 3e-4);
  EXPECT_EQ(c.scheduler.warmup_num_steps, 100);
  EXPECT_TRUE(c.warnings.empty()) << c.warnings.front();  // wall_clock_breakdown is off

  Config two = c;
  EXPECT_NO_THROW(two.resolve_batch(2));
  const std::string m = error_of([&] { c.resolve_batch(3); });
  EXPECT_HAS(m, path);
  EXPECT_HAS(m,
             "train_batch_size (16) must equal train_micro_batch_size_per_gpu (4) x "
             "gradient_accumulation_steps (2) x world size (3) = 24");
  EXPECT_HAS(m, "launch with 2 ranks");
}

TEST(Config, PresetsLoadWithTrainerExtension) {
  const auto ext = trainer_ext();
  for (int stage : {0, 1, 2}) {
    const std::string path = kSrc + "/configs/zero" + std::to_string(stage) + ".yaml";
    Config c = Config::from_file(path, {}, &ext);
    EXPECT_EQ(c.zero_optimization.stage, stage) << path;
    EXPECT_EQ(c.zero_optimization.reduce_bucket_size, 500'000);
    EXPECT_EQ(c.train_micro_batch_size_per_gpu, 8);
    EXPECT_EQ(c.gradient_accumulation_steps, 1);
    EXPECT_EQ(c.optimizer.type, "AdamW");
    EXPECT_DOUBLE_EQ(c.optimizer.lr, 3e-3);
    EXPECT_DOUBLE_EQ(c.optimizer.beta2, 0.95);
    EXPECT_DOUBLE_EQ(c.optimizer.weight_decay, 0.1);
    EXPECT_EQ(c.scheduler.type, "WarmupCosineLR");
    EXPECT_EQ(c.scheduler.total_num_steps, 200);
    EXPECT_EQ(c.scheduler.warmup_num_steps, 20);
    EXPECT_EQ(c.comm_timeout, std::chrono::seconds(1800));
    EXPECT_EQ(c.seed, 1234u);
    // DeepSpeed decays everything; the presets opt out for biases and norms explicitly.
    EXPECT_EQ(c.no_weight_decay, (std::vector<std::string>{"bias", "norm"}));
    EXPECT_EQ(c.extra_string("trainer.model"), "small");
    EXPECT_EQ(c.extra_int("trainer.steps"), 200);
    EXPECT_EQ(c.extra_int("trainer.seq_len"), 64);
    EXPECT_EQ(c.extra_string("trainer.data"), "synthetic");
    EXPECT_TRUE(c.warnings.empty());
    c.resolve_batch(2);
    EXPECT_EQ(c.train_batch_size, 16);
  }
}

TEST(Config, UnknownKeySuggestsNearestWithPosition) {
  std::string m = load_error("seed: 1\n\nzero_optimisation:\n  stage: 1\n");
  EXPECT_HAS(m, "zero: t.yaml:3:1: unknown key 'zero_optimisation'");
  EXPECT_HAS(m, "did you mean 'zero_optimization'?");
  EXPECT_HAS(m, "Allowed here: train_batch_size, ");
  EXPECT_HAS(m, "trainer");

  m = load_error("zero_optimization:\n  stage: 1\n  reduce_bucket_sise: 10\n");
  EXPECT_HAS(m, "t.yaml:3:3: unknown key 'zero_optimization.reduce_bucket_sise'");
  EXPECT_HAS(m, "did you mean 'zero_optimization.reduce_bucket_size'?");

  m = load_error("trainer:\n  modle: tiny\n");
  EXPECT_HAS(m, "t.yaml:2:3: unknown key 'trainer.modle'; did you mean 'trainer.model'?");
  EXPECT_HAS(m, "Allowed here: model, steps, seq_len, data");

  // Inside a section DeepSpeed validates strictly, any unknown key is an error.
  m = load_error("zero_optimization:\n  banana: 1\n");
  EXPECT_HAS(m, "unknown key 'zero_optimization.banana'; Allowed here: ");

  m = load_error("scheduler: {type: WarmupCosinLR}\n");
  EXPECT_HAS(m, "'scheduler.type' 'WarmupCosinLR' is unknown; did you mean 'WarmupCosineLR'?");

  // Without an extension the section is a top-level key DeepSpeed would not read either: it is
  // ignored with the warning (it was an error before DeepSpeed's lenient top level was followed).
  const Config c = Config::from_string("trainer:\n  steps: 3\n", "t.yaml");
  ASSERT_EQ(c.warnings.size(), 1u);
  EXPECT_HAS(c.warnings[0], "zero: t.yaml: ignoring 'trainer' (t.yaml:1)");
}

// DeepSpeed reads the top level key by key and ignores what it does not know (LLaMA-Factory's
// ZeRO configs carry comms_config and monitor_config); zero loads them with one warning that
// names them all. A near miss of a known key stays an error: DeepSpeed would silently train
// without a misspelt zero_optimization, which is the kind of change zero refuses.
TEST(Config, KeysDeepSpeedIgnoresLoadWithOneWarning) {
  Config c = load(
      "train_batch_size: auto\ncomms_config: {verbose: false}\n"
      "monitor_config: {enabled: true, tag: DeepSpeedMonitor, csv_monitor: {enabled: false}}\n"
      "activation_checkpointing: {foo_bar: 1}\ndata_types: {param_dtype: bf16}\n"
      "optimizer: {type: AdamW, comment: tuned}\n");
  ASSERT_EQ(c.warnings.size(), 1u) << c.warnings[0];
  EXPECT_EQ(c.warnings[0],
            "zero: t.yaml: ignoring 'comms_config' (t.yaml:2), 'monitor_config' (t.yaml:3), "
            "'activation_checkpointing.foo_bar' (t.yaml:4), 'data_types.param_dtype' (t.yaml:5), "
            "'optimizer.comment' (t.yaml:6): DeepSpeed does not read these keys either");
  c = load("banana: 1\n");
  ASSERT_EQ(c.warnings.size(), 1u);
  EXPECT_HAS(c.warnings[0],
             "ignoring 'banana' (t.yaml:1): DeepSpeed does not read this key either");

  // Sections DeepSpeed validates strictly (pydantic, extra="forbid"; optimizer and scheduler
  // params are constructor arguments) keep unknown keys errors.
  for (const char* yaml :
       {"zero_optimization: {verbose: 1}\n", "fp16: {enabled: false, verbose: 1}\n",
        "bf16: {verbose: 1}\n", "optimizer: {type: AdamW, params: {verbose: 1}}\n",
        "scheduler: {type: WarmupLR, params: {verbose: 1}}\n",
        "zero_optimization: {offload_optimizer: {device: cpu, verbose: 1}}\n"}) {
    EXPECT_HAS(load_error(yaml), ".verbose'; Allowed here: ");
  }
  // A near miss at the top level or in a lenient section is a typo.
  EXPECT_HAS(load_error("gradient_cliping: 1.0\n"),
             "unknown key 'gradient_cliping'; did you mean 'gradient_clipping'?");
  EXPECT_HAS(load_error("activation_checkpointing: {cpu_checkpointng: true}\n"),
             "did you mean 'activation_checkpointing.cpu_checkpointing'?");
}

// LLaMA-Factory's ZeRO-0/2/2-offload configs (examples/deepspeed/), taken unchanged: they load,
// and the two top-level keys DeepSpeed never reads are named in one warning.
TEST(Config, LlamaFactoryConfigsLoadUnchanged) {
  for (const std::string name : {"ds_z0_config", "ds_z2_config", "ds_z2_offload_config"}) {
    SCOPED_TRACE(name);
    const std::string path = kSrc + "/tests/data/ds_corpus/llamafactory_" + name + ".json";
    Config c = Config::from_file(path);
    EXPECT_EQ(c.zero_optimization.stage, name == "ds_z0_config" ? 0 : 2);
    EXPECT_EQ(c.zero_optimization.offload_optimizer.enabled, name == "ds_z2_offload_config");
    EXPECT_FALSE(c.bf16);
    EXPECT_FALSE(c.fp16.enabled);
    int ignoring = 0;
    for (const auto& w : c.warnings) {
      if (w.find("ignoring") == std::string::npos) continue;
      ++ignoring;
      const bool offload = name == "ds_z2_offload_config";  // 4 lines more above them
      EXPECT_EQ(w, "zero: " + path + ": ignoring 'comms_config' (" + path +
                       (offload ? ":32" : ":28") + "), 'monitor_config' (" + path +
                       (offload ? ":35" : ":31") + "): DeepSpeed does not read these keys either");
    }
    EXPECT_EQ(ignoring, 1);
    c.resolve_batch(2);
    EXPECT_EQ(c.train_micro_batch_size_per_gpu, 1);
    EXPECT_EQ(c.gradient_accumulation_steps, 1);
  }
}

// Keys accepted with a warning are allowed keys: "Allowed here" offers them too.
TEST(Config, AllowedHereListsKeysAcceptedWithAWarning) {
  std::string m = load_error("zero_optimization: {banana: 1}\n");
  for (const char* k : {"stage, ", "use_multi_rank_bucket_allreduce", "sub_group_size", "stage3_*",
                        "round_robin_gradients", "offload_optimizer"}) {
    EXPECT_HAS(m, k);
  }
  m = load_error("zero_optimization: {stage: 2, offload_optimizer: {device: cpu, banana: 1}}\n");
  EXPECT_HAS(m, "nvme_path");
  EXPECT_HAS(m, "cpuadam_cores_perc");
  m = load_error("bf16: {banana: 1}\n");
  EXPECT_HAS(m, "Allowed here: enabled, immediate_grad_update, check_grad_overflow");
  m = load_error("optimizer: {params: {banana: 1}}\n");
  EXPECT_HAS(m, "foreach");
  EXPECT_HAS(m, "fp32_optimizer_states");
  m = load_error("gradient_cliping: 1\n");
  for (const char* k : {"wall_clock_breakdown", "tensorboard", "flops_profiler",
                        "dataloader_drop_last", "comms_logger"}) {
    EXPECT_HAS(m, k);
  }
}

// Every problem of a config in one error, each with its position, instead of one per run.
TEST(Config, EveryProblemInOneError) {
  const std::string m = load_error(
      "zero_optimization:\n  stage: two\n  banana: 1\nfp16: {enabled: maybe}\n"
      "optimizer: {type: AdamW, params: {lr: -1}}\nseed: 1\n");
  EXPECT_HAS(m, "zero: 4 problems in t.yaml:\n");
  EXPECT_HAS(m, "\n  t.yaml:2:10: 'zero_optimization.stage' must be an integer, got 'two'");
  EXPECT_HAS(m, "\n  t.yaml:3:3: unknown key 'zero_optimization.banana'");
  EXPECT_HAS(m, "\n  t.yaml:4:17: 'fp16.enabled' must be true or false, got 'maybe'");
  EXPECT_HAS(m, "'optimizer.params.lr' must be a number >= 0, got '-1'");
  EXPECT_EQ(m.find("zero: t.yaml"), std::string::npos) << "one prefix per problem: " << m;
  // A check across keys does not add a second error about a value that already failed.
  std::string one = load_error("scheduler: {type: WarmupCosinLR, params: {warmup_num_steps: 5}}\n");
  EXPECT_EQ(one.find("problems"), std::string::npos) << one;
  one = load_error("zero_optimization: {stage: three, offload_optimizer: {device: cpu}}\n");
  EXPECT_EQ(one.find("problems"), std::string::npos) << one;
  one = load_error("optimizer: {type: Lamb, params: {momentum: 0.9}}\n");
  EXPECT_EQ(one.find("problems"), std::string::npos) << one;
  one = load_error("bf16: {enabled: maybe}\ndata_types: {grad_accum_dtype: bf16}\n");
  EXPECT_EQ(one.find("problems"), std::string::npos) << one;
  // A single problem reads as before.
  EXPECT_EQ(load_error("seed: x\n"),
            "zero: t.yaml:1:7: 'seed' must be a non-negative integer, got 'x'");
}

// DeepSpeed accepts reduce_bucket_size 0 (each parameter its own bucket); so does zero.
TEST(Config, ReduceBucketSizeZeroLoads) {
  const Config c = Config::from_string(
      R"({"zero_optimization": {"stage": 2, "reduce_bucket_size": 0}})", "ds.json");
  EXPECT_EQ(c.zero_optimization.reduce_bucket_size, 0);
}

TEST(Config, FromStringNeedsNoSourceName) {
  const Config c = Config::from_string("zero_optimization: {stage: 1}\n");
  EXPECT_EQ(c.zero_optimization.stage, 1);
  EXPECT_EQ(c.source, "<string>");
  EXPECT_HAS(error_of([] { Config::from_string("seed: x\n"); }), "zero: <string>:1:7: 'seed'");
}

// yaml-cpp stops deep nesting with the text "bad file"; the message says what it is.
TEST(Config, DeeplyNestedDocumentSaysSo) {
  for (const std::string& doc : {std::string(5000, '[') + std::string(5000, ']'), [] {
                                   std::string d;
                                   for (int i = 0; i < 5000; ++i) d += "{a: ";
                                   return d + "1" + std::string(5000, '}');
                                 }()}) {
    const std::string m = error_of([&] { Config::from_string(doc, "deep.yaml"); });
    EXPECT_HAS(m, "zero: deep.yaml:1:");
    EXPECT_HAS(m, ": the document nests deeper than yaml-cpp's limit of ");
    EXPECT_HAS(m, "yaml-cpp: bad file");
  }
}

TEST(Config, DuplicateKeyIsAnError) {
  const std::string m = load_error("seed: 1\nseed: 2\n");
  EXPECT_HAS(m, "t.yaml:2:1: duplicate key 'seed' (first given at t.yaml:1:1)");
}

TEST(Config, WrongTypeNamesKeyAndValue) {
  std::string m = load_error("zero_optimization:\n  stage: two\n");
  EXPECT_HAS(m, "zero: t.yaml:2:10: 'zero_optimization.stage' must be an integer, got 'two'");
  m = load_error("zero_optimization: 2\n");
  EXPECT_HAS(m, "'zero_optimization' must be a section (a map of keys), got '2'");
  m = load_error("bf16:\n  enabled: maybe\n");
  EXPECT_HAS(m, "'bf16.enabled' must be true or false, got 'maybe'");
  m = load_error("optimizer:\n  type: AdamW\n  params:\n    betas: 0.9\n");
  EXPECT_HAS(m, "t.yaml:4:12: 'optimizer.params.betas' must be a list of numbers, got '0.9'");
  m = load_error("no_weight_decay: bias\n");
  EXPECT_HAS(m, "'no_weight_decay' must be a list of strings");
  m = load_error("trainer:\n  steps: lots\n");
  EXPECT_HAS(m, "'trainer.steps' must be an integer, got 'lots'");
  m = load_error("communication_data_type: int8\n");
  EXPECT_HAS(m, "'communication_data_type' must be one of fp32, bf16, fp16, got 'int8'");
  m = load_error("- 1\n- 2\n");
  EXPECT_HAS(m, "the config must be a map of keys, got a list");
}

TEST(Config, ImpossibleValuesNameTheRange) {
  EXPECT_HAS(load_error("train_batch_size: -4\n"),
             "'train_batch_size' must be a positive integer (or \"auto\" to derive it), got '-4'");
  EXPECT_HAS(load_error("zero_optimization: {stage: 5}\n"),
             "'zero_optimization.stage' must be 0, 1, 2 or 3, got '5'");
  EXPECT_HAS(load_error("gradient_clipping: -1\n"),
             "'gradient_clipping' must be a number >= 0, got '-1'");
  EXPECT_HAS(load_error("optimizer: {type: AdamW, params: {lr: -0.1}}\n"),
             "'optimizer.params.lr' must be a number >= 0, got '-0.1'");
  EXPECT_HAS(load_error("optimizer: {type: AdamW, params: {betas: [0.9, 1.0]}}\n"),
             "'optimizer.params.betas' values must be in [0, 1), got 1.0");
  EXPECT_HAS(load_error("optimizer: {type: AdamW, params: {betas: [0.9]}}\n"),
             "must be a list of two numbers");
  EXPECT_HAS(load_error("optimizer: {type: AdamW, params: {eps: -1e-8}}\n"),
             "'optimizer.params.eps' must be a number >= 0");
  EXPECT_HAS(load_error("zero_optimization: {reduce_bucket_size: -1}\n"),
             "'zero_optimization.reduce_bucket_size' must be a number of elements >= 0, got "
             "'-1'");
  EXPECT_HAS(load_error("zero_optimization: {allgather_bucket_size: 0}\n"),
             "'zero_optimization.allgather_bucket_size' must be a positive number of elements, "
             "got '0'");
  EXPECT_HAS(load_error("zero_optimization: {allgather_bucket_size: 1.5}\n"),
             "'zero_optimization.allgather_bucket_size' must be an integer, got '1.5'");
  EXPECT_HAS(load_error("comm_timeout_s: 0\n"),
             "'comm_timeout_s' must be a positive number of seconds, got '0'");
  EXPECT_HAS(load_error("scheduler: {type: WarmupLR, params: {warmup_type: cubic}}\n"),
             "'scheduler.params.warmup_type' must be log or linear, got 'cubic'");
}

TEST(Config, TypesAreCanonicalised) {
  Config c = load(
      "optimizer: {type: adam, params: {torch_adam: true}}\n"
      "scheduler: {type: warmupdecaylr, params: {total_num_steps: 10, warmup_num_steps: 2}}\n"
      "communication_data_type: bfloat16\ndata_types: {grad_accum_dtype: fp32}\n"
      "bfloat16: {enabled: true}\nno_weight_decay: [bias, ln_]\nseed: 18446744073709551615\n"
      "activation_checkpointing: {cpu_checkpointing: true, number_checkpoints: 4}\n");
  EXPECT_EQ(c.optimizer.type, "AdamW");
  // torch_adam builds torch.optim.AdamW in DeepSpeed, whose default weight_decay is 0.01, and
  // zero then steps with torch's op-by-op arithmetic.
  EXPECT_DOUBLE_EQ(c.optimizer.weight_decay, 0.01);
  EXPECT_TRUE(c.optimizer.torch_adam);
  EXPECT_FALSE(load("optimizer: {type: AdamW}\n").optimizer.torch_adam);
  EXPECT_EQ(c.scheduler.type, "WarmupDecayLR");
  EXPECT_EQ(c.communication_data_type, Dtype::kBFloat16);
  EXPECT_EQ(c.grad_accum_dtype, Dtype::kFloat32);
  EXPECT_TRUE(c.bf16);
  EXPECT_EQ(c.no_weight_decay, (std::vector<std::string>{"bias", "ln_"}));
  EXPECT_EQ(c.seed, 18446744073709551615ull);
  EXPECT_FALSE(c.extra_bool("activation_checkpointing.partition_activations"));
  EXPECT_TRUE(c.extra_bool("activation_checkpointing.cpu_checkpointing"));
  EXPECT_EQ(c.extra_int("activation_checkpointing.number_checkpoints"), 4);
  ASSERT_EQ(c.warnings.size(), 1u);
  EXPECT_HAS(c.warnings[0], "t.yaml:8: 'activation_checkpointing.number_checkpoints'");
  EXPECT_STREQ(zero::dtype_name(Dtype::kFloat32), "fp32");
  EXPECT_STREQ(zero::dtype_name(Dtype::kBFloat16), "bf16");
  EXPECT_STREQ(zero::dtype_name(Dtype::kFloat16), "fp16");
}

TEST(Config, KeysWithoutEffectWarnNamingWhy) {
  // No-ops for DeepSpeed too in this setting: no model parallelism, no fp16 optimizer choice,
  // stage-3-only keys below stage 3.
  Config c = load(
      "activation_checkpointing: {partition_activations: true, contiguous_memory_optimization: "
      "true}\noptimizer: {type: AdamW, legacy_fusion: true}\n"
      "zero_optimization: {stage: 2, stage3_max_live_parameters: 1e9, sub_group_size: 1e9}\n"
      "zero_allow_untested_optimizer: true\n");
  ASSERT_EQ(c.warnings.size(), 5u);
  EXPECT_HAS(c.warnings[0],
             "t.yaml:1: 'activation_checkpointing.partition_activations' has no "
             "effect here and is ignored");
  EXPECT_HAS(c.warnings[0], "model-parallel");
  EXPECT_HAS(c.warnings[1], "'activation_checkpointing.contiguous_memory_optimization' has no");
  EXPECT_HAS(c.warnings[2], "t.yaml:2: 'optimizer.legacy_fusion' has no effect here");
  // The stage3_* keys DeepSpeed names warn once the stage is known, after the section's others.
  EXPECT_HAS(c.warnings[3], "'zero_optimization.sub_group_size'");
  EXPECT_HAS(c.warnings[4],
             "'zero_optimization.stage3_max_live_parameters' has no effect here "
             "and is ignored: only ZeRO stage 3 reads it");
  // Switched off, they say nothing.
  EXPECT_TRUE(load("activation_checkpointing: {partition_activations: false}\n"
                   "optimizer: {legacy_fusion: false}\nzero_allow_untested_optimizer: false\n")
                  .warnings.empty());
}

TEST(Config, DiagnosticKeysWarn) {
  Config c = load(
      "seed: 3\nwall_clock_breakdown: true\nflops_profiler:\n  enabled: true\n"
      "tensorboard: {enabled: false}\n");
  ASSERT_EQ(c.warnings.size(), 2u);
  EXPECT_EQ(c.warnings[0],
            "zero: t.yaml:2: 'wall_clock_breakdown' has no effect here and is ignored: it only "
            "affects DeepSpeed's diagnostics");
  EXPECT_HAS(c.warnings[1], "t.yaml:3: 'flops_profiler'");
}

TEST(Config, OverridesApplyAndAreChecked) {
  Config c = load("zero_optimization:\n  stage: 1\n",
                  {"zero_optimization.stage=2", "optimizer.params.betas=[0.8, 0.9]",
                   "trainer.steps=7", "bf16.enabled=true"});
  EXPECT_EQ(c.zero_optimization.stage, 2);
  EXPECT_DOUBLE_EQ(c.optimizer.beta1, 0.8);
  EXPECT_EQ(c.extra_int("trainer.steps"), 7);
  EXPECT_TRUE(c.bf16);

  std::string m = load_error("zero_optimization:\n  stage: 1\n", {"zero_optimization.stage=x"});
  EXPECT_HAS(m,
             "zero: --set zero_optimization.stage=x: 'zero_optimization.stage' must be an "
             "integer, got 'x'");
  m = load_error("", {"zero_optimization.stagee=2"});
  EXPECT_HAS(m,
             "zero: --set zero_optimization.stagee=2: unknown key 'zero_optimization.stagee'; "
             "did you mean 'zero_optimization.stage'?");
  m = load_error("", {"scheduler.params.warmup_num_steps=5"});
  EXPECT_HAS(m, "zero: --set scheduler.params.warmup_num_steps=5: 'scheduler.type' is required");
  m = load_error("seed: 1\n", {"seed.x=1"});
  EXPECT_HAS(m, "--set seed.x=1: 'seed' is '1' in t.yaml, not a section");
  c = load("", {"wall_clock_breakdown=true"});
  ASSERT_EQ(c.warnings.size(), 1u);
  EXPECT_HAS(c.warnings[0], "zero: --set wall_clock_breakdown=true: ");
}

TEST(Config, BadOverrideFormat) {
  std::string m = load_error("", {"zero_optimization.stage"});
  EXPECT_HAS(m, "override 'zero_optimization.stage' has no '='");
  EXPECT_HAS(m, "--set zero_optimization.stage=2");
  EXPECT_HAS(load_error("", {"zero..stage=1"}), "empty key segment");
  EXPECT_HAS(load_error("", {"seed=[1"}), "--set seed=[1: the value is not valid YAML");
}

TEST(Config, MissingFile) {
  const std::string m = error_of([] { Config::from_file("/nonexistent/zero.yaml"); });
  EXPECT_HAS(m,
             "zero: cannot read config file '/nonexistent/zero.yaml': No such file or directory");
  EXPECT_HAS(m, "--config");
  EXPECT_HAS(error_of([] { Config::from_file(kSrc + "/configs"); }), "Is a directory");
}

TEST(Config, YamlSyntaxErrorHasLine) {
  EXPECT_HAS(load_error("seed: 1\noptimizer:\n  type: AdamW\n  lr: 1: 2\n"),
             "zero: t.yaml:4:8: illegal map value");
  // A missing comma in JSON.
  EXPECT_HAS(
      error_of([] { Config::from_string("{\n  \"seed\": 1\n  \"bf16\": {}\n}", "ds.json"); }),
      "zero: ds.json:3:9: ");
}

TEST(Config, BatchDerivations) {
  const auto resolved = [](int64_t tbs, int64_t mb, int64_t ga, int world) {
    Config c;
    c.train_batch_size = tbs, c.train_micro_batch_size_per_gpu = mb,
    c.gradient_accumulation_steps = ga;
    c.resolve_batch(world);
    return std::vector<int64_t>{c.train_batch_size, c.train_micro_batch_size_per_gpu,
                                c.gradient_accumulation_steps};
  };
  using V = std::vector<int64_t>;
  EXPECT_EQ(resolved(16, 4, 2, 2), (V{16, 4, 2}));
  EXPECT_EQ(resolved(16, 4, 0, 2), (V{16, 4, 2}));  // ga derived
  EXPECT_EQ(resolved(16, 0, 2, 2), (V{16, 4, 2}));  // micro derived
  EXPECT_EQ(resolved(0, 4, 2, 2), (V{16, 4, 2}));   // tbs derived
  EXPECT_EQ(resolved(16, 0, 0, 4), (V{16, 4, 1}));  // only tbs
  EXPECT_EQ(resolved(0, 4, 0, 3), (V{12, 4, 1}));   // only micro
  EXPECT_EQ(resolved(0, 0, 0, 2), (V{2, 1, 1}));    // nothing
  EXPECT_EQ(resolved(0, 0, 4, 2), (V{8, 1, 4}));    // only ga: micro batch 1

  const auto err = [&](int64_t tbs, int64_t mb, int64_t ga, int world) {
    return error_of([&] { resolved(tbs, mb, ga, world); });
  };
  EXPECT_HAS(err(10, 4, 0, 2),
             "train_batch_size (10) is not divisible by "
             "train_micro_batch_size_per_gpu (4) x world size (2) = 8");
  EXPECT_HAS(err(10, 0, 2, 2), "train_micro_batch_size_per_gpu cannot be derived");
  EXPECT_HAS(err(10, 0, 0, 4), "train_batch_size (10) is not divisible by world size (4)");
  const std::string m = err(32, 4, 2, 3);
  EXPECT_HAS(m,
             "zero: <defaults>: train_batch_size (32) must equal train_micro_batch_size_per_gpu "
             "(4) x gradient_accumulation_steps (2) x world size (3) = 24; change one of them "
             "or launch with 4 ranks");
  EXPECT_EQ(err(30, 4, 2, 3).find("launch with"), std::string::npos);
  EXPECT_HAS(err(8, 4, 2, 0), "world size must be positive");
}

TEST(Config, ExtensionDefaultsAndTypedAccess) {
  using T = Config::Extension::Type;
  Config::Extension ext;
  ext.section = "app";
  ext.keys = {{"lr_scale", T::kFloat, "0.5", ""},
              {"verbose", T::kBool, "false", ""},
              {"name", T::kString, "x", ""},
              {"n", T::kInt, "3", ""}};
  Config c = Config::from_string("seed: 1\n", "t.yaml", {}, &ext);
  EXPECT_DOUBLE_EQ(c.extra_float("app.lr_scale"), 0.5);
  EXPECT_FALSE(c.extra_bool("app.verbose"));
  EXPECT_EQ(c.extra_string("app.name"), "x");
  EXPECT_EQ(c.extra_int("app.n"), 3);

  c = Config::from_string("app:\n  verbose: yes\n  n: 1e3\n  lr_scale: 2\n", "t.yaml", {}, &ext);
  EXPECT_TRUE(c.extra_bool("app.verbose"));
  EXPECT_EQ(c.extra_int("app.n"), 1000);
  EXPECT_DOUBLE_EQ(c.extra_float("app.lr_scale"), 2.0);
  EXPECT_HAS(error_of([&] { c.extra_int("app.name"); }), "'app.name' is 'x', not an integer");
  EXPECT_HAS(error_of([&] { Config::from_string("app: {verbose: 2}\n", "t.yaml", {}, &ext); }),
             "'app.verbose' must be true or false, got '2'");

  ext.section = "optimizer";
  EXPECT_HAS(error_of([&] { Config::from_string("", "t.yaml", {}, &ext); }),
             "section 'optimizer' is a DeepSpeed key");
}

TEST(Config, ExtraOnMissingKeyThrows) {
  Config c = load("");
  EXPECT_HAS(error_of([&] { c.extra_int("trainer.x"); }),
             "zero: config has no key 'trainer.x' (declare it in the application's "
             "Config::Extension)");
  EXPECT_HAS(error_of([&] { c.extra_string("nope"); }), "no key 'nope'");
  EXPECT_HAS(error_of([&] { c.extra_bool("trainer.y"); }), "no key 'trainer.y'");
  EXPECT_HAS(error_of([&] { c.extra_float("trainer.z"); }), "no key 'trainer.z'");
}

TEST(Config, Fp16AndBf16Conflict) {
  const std::string m = load_error("bf16:\n  enabled: true\nfp16:\n  enabled: true\n");
  EXPECT_HAS(m, "t.yaml:4:12: fp16.enabled and bf16.enabled are both true");
  Config c = load("fp16: {enabled: true, loss_scale: 0, initial_scale_power: 12, hysteresis: 1}\n");
  EXPECT_TRUE(c.fp16.enabled);
  EXPECT_EQ(c.fp16.initial_scale_power, 12);
  EXPECT_EQ(c.param_dtype(), Dtype::kFloat16);
  EXPECT_HAS(load_error("bf16: {enabled: true}\nbfloat16: {enabled: true}\n"), "give one");
}

TEST(Config, AutoMeansUnset) {
  Config c = Config::from_string(
      R"({"train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto",
          "gradient_accumulation_steps": "auto", "gradient_clipping": "auto",
          "optimizer": {"type": "AdamW", "params": {"lr": "auto", "weight_decay": "auto"}},
          "zero_optimization": {"stage": 2, "reduce_bucket_size": "auto"}})",
      "hf.json");
  EXPECT_EQ(c.train_batch_size, 0);
  EXPECT_EQ(c.train_micro_batch_size_per_gpu, 0);
  EXPECT_EQ(c.gradient_accumulation_steps, 0);
  EXPECT_EQ(c.gradient_clipping, 1.0);  // DeepSpeed's default
  EXPECT_DOUBLE_EQ(c.optimizer.lr, 1e-3);
  EXPECT_DOUBLE_EQ(c.optimizer.weight_decay, 0.0);  // FusedAdam's
  EXPECT_EQ(c.zero_optimization.reduce_bucket_size,
            zero::ZeroOptimizationConfig{}.reduce_bucket_size);
  // Each "auto" names the value it took, once.
  ASSERT_EQ(c.warnings.size(), 4u);
  EXPECT_HAS(c.warnings[0], "'gradient_clipping' is \"auto\": using 1.0 (DeepSpeed's default)");
  EXPECT_HAS(c.warnings[1], "'optimizer.params.lr' is \"auto\": using 1e-3");
  EXPECT_HAS(c.warnings[2], "'optimizer.params.weight_decay' is \"auto\": using 0");
  EXPECT_HAS(c.warnings[3], "'zero_optimization.reduce_bucket_size' is \"auto\": using 5e8");
  c.resolve_batch(4);
  EXPECT_EQ(c.train_batch_size, 4);
  EXPECT_EQ(c.train_micro_batch_size_per_gpu, 1);
  EXPECT_EQ(c.gradient_accumulation_steps, 1);
  ASSERT_EQ(c.warnings.size(), 5u);
  EXPECT_HAS(c.warnings[4],
             "train_batch_size, train_micro_batch_size_per_gpu, gradient_accumulation_steps "
             "\"auto\" resolved for 4 ranks: train_batch_size 4, train_micro_batch_size_per_gpu "
             "1, gradient_accumulation_steps 1");
  c.resolve_batch(4);
  EXPECT_EQ(c.warnings.size(), 5u);  // once

  // All "auto" except the accumulation (an HF Trainer config with --gradient_accumulation_steps).
  c = Config::from_string(
      R"({"train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto",
          "gradient_accumulation_steps": 4})",
      "hf.json");
  c.resolve_batch(2);
  EXPECT_EQ(c.train_batch_size, 8);
  EXPECT_EQ(c.train_micro_batch_size_per_gpu, 1);
  EXPECT_EQ(c.gradient_accumulation_steps, 4);
  // Only the micro batch "auto": derived from the other two.
  c = Config::from_string(
      R"({"train_batch_size": 16, "train_micro_batch_size_per_gpu": "auto",
          "gradient_accumulation_steps": 2})",
      "hf.json");
  c.resolve_batch(2);
  EXPECT_EQ(c.train_micro_batch_size_per_gpu, 4);
  // stage: auto is the planner's to resolve (test_auto_strategy.cpp), not an unset value.
  EXPECT_TRUE(Config::from_string("zero_optimization: {stage: auto}", "hf.json")
                  .zero_optimization.stage_auto);
  EXPECT_HAS(
      error_of([] { Config::from_string("zero_optimization: {stage: automatic}", "hf.json"); }),
      "'zero_optimization.stage' must be an integer, got 'automatic'");
}
