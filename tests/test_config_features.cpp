// The config sections of what zero adds to plain ZeRO-1/2, and what it refuses: stage 3,
// optimizer offload, unsupported DeepSpeed features, quantized gradients, tensor and pipeline
// parallelism. Loading in general: test_config.cpp.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "support/config_helpers.hpp"
#include "zero/comm_overlap.hpp"
#include "zero/config.hpp"

using zero::Config;
using zero::ConfigError;
using zero::Dtype;
using namespace zero::testing;

// Stage 3 loads from YAML and from DeepSpeed JSON; what it does not support yet is refused
// naming the key and what to use instead (each check runs on every rank: the file is the same).
TEST(Config, StageThreeLoadsAndRefusesWhatItDoesNotSupportYet) {
  EXPECT_EQ(load("zero_optimization:\n  stage: 3\n").zero_optimization.stage, 3);
  EXPECT_EQ(load("zero_optimization: {stage: 2}\n", {"zero_optimization.stage=3"})
                .zero_optimization.stage,
            3);
  EXPECT_HAS(load_error("zero_optimization:\n  stage: 4\n"),
             "t.yaml:2:10: 'zero_optimization.stage' must be 0, 1, 2 or 3");
  // Optimizer offload at stage 3 (tests/test_stage3_equivalence.cpp trains it).
  EXPECT_TRUE(load("zero_optimization: {stage: 3, offload_optimizer: {device: cpu}}\n")
                  .zero_optimization.offload_optimizer.enabled);
  // And quantized gradients (tests/test_stage3_quantized.cpp).
  EXPECT_TRUE(load("zero_optimization: {stage: 3, zero_quantized_gradients: true}\n")
                  .zero_optimization.quantized_gradients.enabled);
  // And tensor parallelism (tests/test_tensor_parallel_gpt_training.cpp, *_stage3_*).
  EXPECT_EQ(load("zero_optimization: {stage: 3}\ntensor_parallel: {autotp_size: 2}\n")
                .tensor_parallel.autotp_size,
            2);
  std::string m = load_error("pipeline: {stages: 2}\nzero_optimization: {stage: 3}\n");
  EXPECT_HAS(m, "'zero_optimization.stage' 3 with pipeline.stages 2 is not supported");
  EXPECT_HAS(m, "Use stage 1");
  EXPECT_HAS(load_error("zero_optimization: {stage: 3, offload_param: {device: cpu}}\n"),
             "'zero_optimization.offload_param' is not implemented: zero does not offload ZeRO "
             "stage 3's parameters");
}

// ZeRO-3's keys are read with DeepSpeed's defaults, aliases and checks (config.py
// DeepSpeedZeroConfig), kept for stage 3, and warned about below it, where DeepSpeed ignores
// them too.
TEST(Config, StageThreeKeysHaveDeepSpeedsDefaults) {
  const auto z3 = load("zero_optimization: {stage: 2}\n").zero_optimization.stage3;
  EXPECT_EQ(z3.prefetch_bucket_size, 50'000'000);
  EXPECT_EQ(z3.param_persistence_threshold, 100'000);
  EXPECT_EQ(z3.model_persistence_threshold, 9223372036854775807);  // sys.maxsize
  EXPECT_EQ(z3.max_live_parameters, 1'000'000'000);
  EXPECT_EQ(z3.max_reuse_distance, 1'000'000'000);
  EXPECT_FALSE(z3.gather_16bit_weights_on_model_save);
  EXPECT_FALSE(z3.prefetch_bucket_size_auto);
  EXPECT_FALSE(z3.param_persistence_threshold_auto);
}

TEST(Config, StageThreeKeysAreReadUnderBothSpellings) {
  Config c = load(
      "zero_optimization:\n  stage: 2\n  stage3_prefetch_bucket_size: 2e7\n"
      "  param_persistence_threshold: 4096\n  stage3_model_persistence_threshold: 123456\n"
      "  max_live_parameters: 3e8\n  stage3_max_reuse_distance: 0\n"
      "  gather_16bit_weights_on_model_save: true\n");
  const auto& z3 = c.zero_optimization.stage3;
  EXPECT_EQ(z3.prefetch_bucket_size, 20'000'000);
  EXPECT_EQ(z3.param_persistence_threshold, 4096);
  EXPECT_EQ(z3.model_persistence_threshold, 123456);
  EXPECT_EQ(z3.max_live_parameters, 300'000'000);
  EXPECT_EQ(z3.max_reuse_distance, 0);
  EXPECT_TRUE(z3.gather_16bit_weights_on_model_save);
  // Below stage 3 each one says it has no effect (DeepSpeed ignores them there too).
  ASSERT_EQ(c.warnings.size(), 6u);
  EXPECT_HAS(c.warnings[0], "'zero_optimization.stage3_prefetch_bucket_size' has no effect");
  EXPECT_HAS(c.warnings[1], "'zero_optimization.param_persistence_threshold' has no effect");
  EXPECT_HAS(c.warnings[5], "only ZeRO stage 3 reads it");
  // DeepSpeed's deprecated spelling of the save key.
  c = load("zero_optimization: {stage: 1, stage3_gather_fp16_weights_on_model_save: true}\n");
  EXPECT_TRUE(c.zero_optimization.stage3.gather_16bit_weights_on_model_save);
  ASSERT_EQ(c.warnings.size(), 1u);
  EXPECT_HAS(c.warnings[0], "deprecated spelling of stage3_gather_16bit_weights_on_model_save");
  // At stage 3 every key takes effect: no warning.
  c = load(
      "zero_optimization:\n  stage: 3\n  stage3_prefetch_bucket_size: 2e7\n"
      "  param_persistence_threshold: 4096\n  stage3_model_persistence_threshold: 123456\n"
      "  max_live_parameters: 3e8\n  stage3_max_reuse_distance: 0\n"
      "  gather_16bit_weights_on_model_save: true\n");
  EXPECT_EQ(c.zero_optimization.stage3.param_persistence_threshold, 4096);
  EXPECT_EQ(c.zero_optimization.stage3.prefetch_bucket_size, 20'000'000);
  EXPECT_EQ(c.zero_optimization.stage3.max_live_parameters, 300'000'000);
  EXPECT_EQ(c.zero_optimization.stage3.max_reuse_distance, 0);
  EXPECT_TRUE(c.warnings.empty()) << c.warnings.front();
  EXPECT_TRUE(c.zero_optimization.stage3.gather_16bit_weights_on_model_save);
  // The deprecated spelling counts at stage 3 too.
  c = load("zero_optimization: {stage: 3, stage3_gather_fp16_weights_on_model_save: true}\n");
  EXPECT_TRUE(c.zero_optimization.stage3.gather_16bit_weights_on_model_save);
  ASSERT_EQ(c.warnings.size(), 1u);
  EXPECT_HAS(c.warnings[0],
             "deprecated spelling of stage3_gather_16bit_weights_on_model_save; "
             "read as that key");
}

TEST(Config, StageThreeKeysRefuseBadValuesNamingTheKey) {
  EXPECT_HAS(load_error("zero_optimization: {stage: 2, stage3_max_live_parameters: -1}\n"),
             "'zero_optimization.stage3_max_live_parameters' must be a number of elements >= 0");
  EXPECT_HAS(load_error("zero_optimization: {stage: 2, stage3_prefetch_bucket_size: 1.5}\n"),
             "'zero_optimization.stage3_prefetch_bucket_size' must be an integer");
  EXPECT_HAS(load_error("zero_optimization: {stage: 2, stage3_max_reuse_distance: auto}\n"),
             "transformers fills in only for stage3_prefetch_bucket_size and "
             "stage3_param_persistence_threshold");
  EXPECT_HAS(load_error("zero_optimization: {stage: 2, stage3_gather_16bit_weights_on_model_save: "
                        "3}\n"),
             "must be true or false");
  // One setting under two names: which one counts would be a guess.
  EXPECT_HAS(load_error("zero_optimization: {stage: 2, stage3_max_live_parameters: 1, "
                        "max_live_parameters: 2}\n"),
             "'zero_optimization.max_live_parameters' and "
             "'zero_optimization.stage3_max_live_parameters' are the same DeepSpeed setting");
}

// transformers' HfTrainerDeepSpeedConfig fills "auto" from the hidden size: 0.9 * hidden^2 and
// 10 * hidden (trainer_config_finalize); the 16-bit save's "auto" is accelerate's false.
TEST(Config, StageThreeAutoIsFilledFromTheHiddenSizeAsTransformersDoes) {
  Config c = Config::from_file(kSrc + "/tests/data/ds_corpus/hf_zero3_auto.json",
                               {"zero_optimization.stage=2"});
  auto z3 = c.zero_optimization.stage3;
  EXPECT_TRUE(z3.prefetch_bucket_size_auto);
  EXPECT_TRUE(z3.param_persistence_threshold_auto);
  EXPECT_EQ(z3.max_live_parameters, 1'000'000'000);
  EXPECT_EQ(z3.max_reuse_distance, 1'000'000'000);
  EXPECT_TRUE(z3.gather_16bit_weights_on_model_save);
  z3.resolve_auto(4096);
  EXPECT_EQ(z3.prefetch_bucket_size, 15'099'494);  // floor(0.9 * 4096^2 = 15099494.4)
  EXPECT_EQ(z3.param_persistence_threshold, 40'960);
  EXPECT_FALSE(z3.prefetch_bucket_size_auto);
  z3.prefetch_bucket_size_auto = true;
  z3.resolve_auto(1000);
  EXPECT_EQ(z3.prefetch_bucket_size, 900'000);
  EXPECT_EQ(z3.param_persistence_threshold, 40'960);  // no longer "auto": kept
  EXPECT_THROW(z3.resolve_auto(0), std::invalid_argument);
  EXPECT_FALSE(load("zero_optimization: {stage: 2, stage3_gather_16bit_weights_on_model_save: "
                    "auto}\n")
                   .zero_optimization.stage3.gather_16bit_weights_on_model_save);
  // The same file as written loads at stage 3, "auto" left for the application to fill.
  c = Config::from_file(kSrc + "/tests/data/ds_corpus/hf_zero3_auto.json");
  EXPECT_EQ(c.zero_optimization.stage, 3);
  EXPECT_TRUE(c.zero_optimization.stage3.param_persistence_threshold_auto);
}

TEST(Config, OptimizerOffloadAtStagesOneAndTwo) {
  Config c = load(
      "zero_optimization:\n  stage: 2\n  offload_optimizer:\n    device: cpu\n"
      "    pin_memory: false\n    threads: 4\n    buffer_count: 4\n");
  EXPECT_TRUE(c.zero_optimization.offload_optimizer.enabled);
  EXPECT_FALSE(c.zero_optimization.offload_optimizer.pin_memory);
  EXPECT_EQ(c.zero_optimization.offload_optimizer.threads, 4);
  // DeepSpeed 0.19's default pins; the legacy spelling and its pin key.
  EXPECT_TRUE(load("zero_optimization: {stage: 1, offload_optimizer: {device: cpu}}\n")
                  .zero_optimization.offload_optimizer.pin_memory);
  c = load("zero_optimization: {stage: 1, cpu_offload: true, cpu_offload_use_pin_memory: false}\n");
  EXPECT_TRUE(c.zero_optimization.offload_optimizer.enabled);
  EXPECT_FALSE(c.zero_optimization.offload_optimizer.pin_memory);
  EXPECT_FALSE(load("zero_optimization: {stage: 2, offload_optimizer: {device: none}}\n")
                   .zero_optimization.offload_optimizer.enabled);
  EXPECT_FALSE(load("zero_optimization: {stage: 0}\n").zero_optimization.offload_optimizer.enabled);
}

TEST(Config, OptimizerOffloadErrorsNameTheKeyAndTheFix) {
  std::string m =
      load_error("zero_optimization:\n  stage: 2\n  offload_optimizer:\n    device: nvme\n");
  EXPECT_HAS(m, "t.yaml:4:13: 'zero_optimization.offload_optimizer.device' nvme");
  EXPECT_HAS(m, "use device: cpu");
  m = load_error("zero_optimization:\n  stage: 0\n  offload_optimizer:\n    device: cpu\n");
  EXPECT_HAS(m,
             "t.yaml:3:3: 'zero_optimization.offload_optimizer' offloads the optimizer of ZeRO "
             "stage 1, 2 or 3, but zero_optimization.stage is 0");
  EXPECT_HAS(m, "set zero_optimization.stage: 2 (or 1 or 3)");
  EXPECT_HAS(load_error("zero_optimization: {cpu_offload: true}\n"),
             "'zero_optimization.cpu_offload' offloads the optimizer of ZeRO stage 1, 2 or 3");
  EXPECT_HAS(load_error("zero_optimization: {stage: auto, cpu_offload: true}\n"),
             "zero_optimization.stage is \"auto\"");
  EXPECT_HAS(
      load_error("zero_optimization: {stage: 2, offload_optimizer: {device: cpu, ratio: 0.5}}\n"),
      "'zero_optimization.offload_optimizer.ratio' must be 1.0");
  EXPECT_HAS(load_error("zero_optimization: {stage: 2, offload_optimizer: {device: gpu}}\n"),
             "must be cpu or none");
  EXPECT_HAS(load_error("zero_optimization: {stage: 2, offload_optimizer: cpu}\n"),
             "must be a section");
  EXPECT_HAS(
      load_error("zero_optimization: {stage: 2, offload_optimizer: {device: cpu, threads: -1}}\n"),
      "'zero_optimization.offload_optimizer.threads' must be a thread count");
}

TEST(Config, UnsupportedDeepSpeedKeysAreErrors) {
  EXPECT_HAS(load_error("zero_optimization: {offload_param: {device: nvme}}\n"),
             "'zero_optimization.offload_param' is not implemented");
  EXPECT_HAS(load_error("zero_optimization: {cpu_offload_params: true}\n"),
             "offloads the parameters (ZeRO stage 3)");
  EXPECT_HAS(load_error("fp16: {enabled: true, fp16_master_weights_and_grads: true}\n"),
             "'fp16.fp16_master_weights_and_grads' keeps master weights in fp16");
  EXPECT_HAS(load_error("optimizer: {type: AdamW, params: {max_grad_norm: 1.0}}\n"),
             "use the top-level 'gradient_clipping' key instead");
  // DeepSpeed accumulates in fp32 or in the model dtype (engine.py _do_optimizer_sanity_check).
  EXPECT_HAS(load_error("data_types: {grad_accum_dtype: bf16}\n"),
             "'data_types.grad_accum_dtype' bf16 needs bf16 parameters (the model is fp32): "
             "gradients accumulate in fp32 or in the model dtype; set fp32, enable bf16 or "
             "remove it");
  EXPECT_HAS(load_error("bf16: {enabled: true}\ndata_types: {grad_accum_dtype: fp16}\n"),
             "'data_types.grad_accum_dtype' fp16 needs fp16 parameters (the model is bf16)");
  EXPECT_EQ(load("bf16: {enabled: true}\ndata_types: {grad_accum_dtype: bf16}\n").accum_dtype(),
            Dtype::kBFloat16);
  EXPECT_HAS(load_error("zero_optimization: {allgather_partitions: false}\n"),
             "only true is supported");
  // Gradient pre-division is supported (tests/test_mixed_precision.cpp), with checked values.
  EXPECT_TRUE(load("prescale_gradients: true\n").prescale_gradients);
  EXPECT_EQ(load("gradient_predivide_factor: 2\n").gradient_predivide_factor, 2.0);
  EXPECT_FALSE(load("bf16: {enabled: true}\n").gradient_predivide_factor.has_value());
  EXPECT_HAS(load_error("gradient_predivide_factor: 0\n"), "gradient_predivide_factor");
  EXPECT_HAS(load_error("gradient_predivide_factor: -2\n"), "a positive number");
  EXPECT_HAS(load_error("fp16: {enabled: true, auto_cast: 2}\n"),
             "'fp16.auto_cast' must be true or false");
  EXPECT_HAS(load_error("optimizer: {type: Lamb}\n"),
             "'optimizer.type' 'Lamb' is not supported by zero; use AdamW, Adam or SGD");
  EXPECT_HAS(load_error("optimizer: {type: Adam, params: {adam_w_mode: false}}\n"),
             "adam_w_mode: false");
  EXPECT_HAS(load_error("optimizer: {type: SGD, params: {betas: [0.9, 0.9]}}\n"),
             "'optimizer.params.betas' does not apply to optimizer type SGD");
  std::string m = load_error("scheduler:\n  type: OneCycle\n");
  EXPECT_HAS(m,
             "'scheduler.type' 'OneCycle' is not supported by zero; supported: WarmupLR, "
             "WarmupDecayLR, WarmupCosineLR");
  EXPECT_HAS(load_error("scheduler: {type: WarmupCosineLR, params: {warmup_num_steps: 5}}\n"),
             "'scheduler.params.total_num_steps' (> 0) is required for WarmupCosineLR");
  EXPECT_HAS(load_error("scheduler: {type: WarmupDecayLR, params: {total_num_steps: 0}}\n"),
             "'scheduler.params.total_num_steps' must be a positive integer for WarmupDecayLR");
  EXPECT_HAS(load_error("scheduler: {type: WarmupLR, params: {cos_min_ratio: 0.1}}\n"),
             "does not apply to scheduler type WarmupLR");
}

// Under optimizer offload zero's own CPU kernel steps: torch_adam's arithmetic is not what runs,
// and the user is told so.
TEST(Config, TorchAdamWithOffloadWarns) {
  const Config c = load(
      "optimizer: {type: AdamW, params: {torch_adam: true}}\n"
      "zero_optimization: {stage: 2, offload_optimizer: {device: cpu}}\n");
  ASSERT_EQ(c.warnings.size(), 1u);
  EXPECT_HAS(c.warnings[0], "'optimizer.params.torch_adam'");
  EXPECT_HAS(c.warnings[0], "zero's one-pass CPU AdamW");
}

namespace {

// zero_quantized_gradients means ZeRO++'s quantized gradient reduction at stages 1 and 2 (no
// longer a stage-3 no-op), with zero's companions for the bits, the block and error feedback.
TEST(Config, QuantizedGradientsKeys) {
  Config c = load(
      "zero_optimization: {stage: 2, zero_quantized_gradients: true, "
      "zero_quantized_gradients_bits: 4, zero_quantized_gradients_block: 256, "
      "zero_quantized_gradients_error_feedback: false}\n");
  const auto& q = c.zero_optimization.quantized_gradients;
  EXPECT_TRUE(q.enabled);
  EXPECT_EQ(q.bits, 4);
  EXPECT_EQ(q.block, 256);
  EXPECT_FALSE(q.error_feedback);
  EXPECT_TRUE(c.warnings.empty()) << c.warnings.front();
  const Config d = load("zero_optimization: {stage: 1, zero_quantized_gradients: true}\n");
  EXPECT_TRUE(d.zero_optimization.quantized_gradients.enabled);
  EXPECT_EQ(d.zero_optimization.quantized_gradients.bits, 8);
  EXPECT_TRUE(d.zero_optimization.quantized_gradients.error_feedback);
  EXPECT_EQ(d.zero_optimization.quantized_gradients.error_feedback_dtype, "auto");
  for (const char* v : {"fp32", "bf16", "fp16", "int8", "auto"}) {
    const Config e = load(std::string("zero_optimization: {stage: 2, zero_quantized_gradients: "
                                      "true, zero_quantized_gradients_error_feedback_dtype: ") +
                          v + "}\n");
    EXPECT_EQ(e.zero_optimization.quantized_gradients.error_feedback_dtype, v);
  }
  const std::string bad = load_error(
      "zero_optimization: {stage: 2, zero_quantized_gradients_error_feedback_dtype: int4}\n");
  EXPECT_NE(bad.find("zero_quantized_gradients_error_feedback_dtype"), std::string::npos) << bad;
  EXPECT_NE(bad.find("int8"), std::string::npos) << bad;

  std::string m = load_error(
      "zero_optimization: {stage: 2, zero_quantized_gradients: true, "
      "zero_quantized_gradients_bits: 2}\n");
  EXPECT_HAS(m, "zero_quantized_gradients_bits");
  EXPECT_HAS(m, "8 (int8) or 4");
  m = load_error(
      "zero_optimization: {stage: 2, zero_quantized_gradients: true, "
      "zero_quantized_gradients_block: 0}\n");
  EXPECT_HAS(m, "zero_quantized_gradients_block");
  m = load_error("zero_optimization: {stage: 0, zero_quantized_gradients: true}\n");
  EXPECT_HAS(m, "stages 1, 2 and 3");
  EXPECT_HAS(m, "stage: 1, 2 or 3");
  m = load_error(
      "zero_optimization: {stage: 2, zero_quantized_gradients: true, "
      "zero_quantized_gradients_bits: 4, zero_quantized_gradients_block: 31}\n");
  EXPECT_HAS(m, "is odd");
  EXPECT_HAS(m, "32");
}

}  // namespace

// tensor_parallel: DeepSpeed's autotp_size, the YAML alias size, Megatron's sequence_parallel.
TEST(Config, TensorParallelSizeAndAlias) {
  EXPECT_EQ(Config().tensor_parallel.autotp_size, 1);
  const auto ext = trainer_ext();
  EXPECT_EQ(Config::from_string("tensor_parallel: {autotp_size: 2}\n", "t", {}, &ext)
                .tensor_parallel.autotp_size,
            2);
  const Config c = Config::from_string("tensor_parallel:\n  size: 4\n  sequence_parallel: true\n",
                                       "t", {}, &ext);
  EXPECT_EQ(c.tensor_parallel.autotp_size, 4);
  EXPECT_TRUE(c.tensor_parallel.sequence_parallel);
  // DeepSpeed's 0: no tensor parallelism.
  EXPECT_EQ(Config::from_string("{\"tensor_parallel\": {\"autotp_size\": 0}}", "ds.json", {}, &ext)
                .tensor_parallel.autotp_size,
            1);
  EXPECT_EQ(
      Config::from_string("", "t", {"tensor_parallel.size=2"}, &ext).tensor_parallel.autotp_size,
      2);
}

// The two overlap switches (Megatron-LM's overlap_p2p_comm; the column-parallel backward's
// overlap): on by default, off from YAML, DeepSpeed JSON and --set; anything but a boolean is
// refused naming the key. test_pipeline_p2p_overlap and test_tensor_parallel_overlap check that
// the value reaches the runtime and the layers.
TEST(Config, OverlapSwitches) {
  const auto ext = trainer_ext();
  Config c;
  EXPECT_TRUE(overlap_p2p_comm(Config()));
  EXPECT_TRUE(tensor_parallel_overlap_comm(Config()));
  c = load("pipeline: {stages: 2, overlap_p2p_comm: true}\ntensor_parallel: {autotp_size: 2}\n");
  EXPECT_TRUE(overlap_p2p_comm(c));
  EXPECT_TRUE(tensor_parallel_overlap_comm(c));
  c = load(
      "pipeline: {stages: 2, overlap_p2p_comm: false}\n"
      "tensor_parallel: {autotp_size: 2, overlap_comm: false}\n");
  EXPECT_FALSE(overlap_p2p_comm(c));
  EXPECT_FALSE(tensor_parallel_overlap_comm(c));
  c = Config::from_string(
      "{\"pipeline\": {\"stages\": 2, \"overlap_p2p_comm\": false}, "
      "\"tensor_parallel\": {\"autotp_size\": 2, \"overlap_comm\": false}}",
      "ds.json", {}, &ext);
  EXPECT_FALSE(overlap_p2p_comm(c));
  EXPECT_FALSE(tensor_parallel_overlap_comm(c));
  c = load("", {"pipeline.overlap_p2p_comm=false", "tensor_parallel.overlap_comm=false"});
  EXPECT_FALSE(overlap_p2p_comm(c));
  EXPECT_FALSE(tensor_parallel_overlap_comm(c));
  EXPECT_HAS(load_error("pipeline: {overlap_p2p_comm: sometimes}\n"),
             "'pipeline.overlap_p2p_comm' must be true or false");
  EXPECT_HAS(load_error("tensor_parallel: {overlap_comm: 2}\n"),
             "'tensor_parallel.overlap_comm' must be true or false");
  EXPECT_HAS(load_error("tensor_parallel: {overlap_com: false}\n"), "overlap_comm");
}

TEST(Config, TensorParallelBadValuesNameTheKey) {
  EXPECT_HAS(load_error("tensor_parallel: {autotp_size: -2}\n"),
             "'tensor_parallel.autotp_size' must be the number of ranks per tensor-parallel group");
  EXPECT_HAS(load_error("tensor_parallel: {size: two}\n"),
             "'tensor_parallel.size' must be an integer, got 'two'");
  EXPECT_HAS(load_error("tensor_parallel: {autotp_size: 2, size: 2}\n"),
             "'tensor_parallel.size' is the YAML alias of 'tensor_parallel.autotp_size'; give one");
  EXPECT_HAS(load_error("tensor_parallel: {autotp_sise: 2}\n"), "autotp_size");
}

// DeepSpeed's `pipeline` section and zero's pipeline.schedule: the same keys from YAML and
// --set, DeepSpeed's defaults, and errors that name the key and the fix.
TEST(Config, PipelineSection) {
  Config c = load("");
  EXPECT_EQ(c.pipeline.stages, 1);
  EXPECT_EQ(c.pipeline.partition, "parameters");
  EXPECT_EQ(c.pipeline.activation_checkpoint_interval, 0);
  EXPECT_EQ(c.pipeline.schedule, "1f1b");

  c = load(
      "pipeline: {stages: 4, partition: uniform, activation_checkpoint_interval: 2, "
      "schedule: gpipe}\n");
  EXPECT_EQ(c.pipeline.stages, 4);
  EXPECT_EQ(c.pipeline.partition, "uniform");
  EXPECT_EQ(c.pipeline.activation_checkpoint_interval, 2);
  EXPECT_EQ(c.pipeline.schedule, "gpipe");

  c = load("pipeline: {stages: 4}\n",
           {"pipeline.stages=2", "pipeline.schedule=gpipe", "pipeline.partition=uniform"});
  EXPECT_EQ(c.pipeline.stages, 2);
  EXPECT_EQ(c.pipeline.schedule, "gpipe");
  EXPECT_EQ(c.pipeline.partition, "uniform");
  EXPECT_EQ(load("pipeline: {stages: 2, partition: compute}\n").pipeline.partition, "compute");

  // DeepSpeed's config defaults (stages "auto", partition "best") load, with a note each.
  c = load(
      "pipeline: {stages: auto, partition: best, seed_layers: false, pipe_partitioned: true, "
      "grad_partitioned: true}\n");
  EXPECT_EQ(c.pipeline.stages, 1);
  EXPECT_EQ(c.pipeline.partition, "parameters");

  EXPECT_HAS(load_error("pipeline: {stages: 0}\n"), "'pipeline.stages' must be an integer >= 1");
  EXPECT_HAS(load_error("", {"pipeline.schedule=zb"}),
             "--set pipeline.schedule=zb: 'pipeline.schedule' is 'zb'; use 1f1b (the default), "
             "gpipe or interleaved (with pipeline.virtual_stages)");
  // The interleaved schedule (Megatron-LM's virtual pipeline stages): accepted with v >= 2 and
  // P >= 2; each broken rule names its key.
  c = load("pipeline: {stages: 2, schedule: interleaved, virtual_stages: 2}\n"
           "gradient_accumulation_steps: 4\n");
  EXPECT_EQ(c.pipeline.schedule, "interleaved");
  // A field of PipelineConfig (it was an entry of Config::extra, which nothing checked).
  EXPECT_EQ(c.pipeline.virtual_stages, 2);
  EXPECT_EQ(c.extra.count("pipeline.virtual_stages"), 0u);
  EXPECT_EQ(load("pipeline: {stages: 2}\n").pipeline.virtual_stages, 1);
  EXPECT_EQ(load("", {"pipeline.stages=2", "pipeline.schedule=interleaved",
                      "pipeline.virtual_stages=3", "gradient_accumulation_steps=6"})
                .pipeline.virtual_stages,
            3);
  EXPECT_HAS(load_error("pipeline: {stages: 2, schedule: interleaved}\n"),
             "'pipeline.schedule' interleaved needs pipeline.virtual_stages of 2 or more");
  EXPECT_HAS(load_error("pipeline: {stages: 2, virtual_stages: 2}\n"),
             "'pipeline.virtual_stages' 2 needs pipeline.schedule: interleaved (1f1b runs one "
             "model chunk per stage)");
  EXPECT_HAS(load_error("pipeline: {schedule: interleaved, virtual_stages: 2}\n"),
             "'pipeline.virtual_stages' 2 needs pipeline.stages of at least 2");
  EXPECT_HAS(load_error("pipeline: {stages: 2, schedule: interleaved, virtual_stages: 2}\n"
                        "gradient_accumulation_steps: 3\n"),
             "'gradient_accumulation_steps' 3 (the micro-batches of a step) must be a multiple "
             "of pipeline.stages 2 under the interleaved schedule");
  // Recomputation under interleaving: the engine learns each chunk's gradients apart (issue 34).
  c = load(
      "pipeline: {stages: 2, schedule: interleaved, virtual_stages: 2, "
      "activation_checkpoint_interval: 1}\n");
  EXPECT_EQ(c.pipeline.virtual_stages, 2);
  EXPECT_EQ(c.pipeline.activation_checkpoint_interval, 1);
  EXPECT_EQ(load("pipeline: {virtual_stages: 1}\n").pipeline.stages, 1);
  EXPECT_HAS(load_error("pipeline: {partition: 'type:Block'}\n"),
             "partitioning by layer class name is not implemented; use parameters, compute or "
             "uniform");
  EXPECT_HAS(load_error("pipeline: {partition: balanced}\n"),
             "'pipeline.partition' is 'balanced'; use parameters, compute or uniform");
  EXPECT_HAS(load_error("pipeline: {activation_checkpoint_interval: -1}\n"),
             "'pipeline.activation_checkpoint_interval' must be an integer >= 0");

  // ZeRO-1 composes with a pipeline (each stage's data-parallel group); ZeRO-2 is refused with
  // what it would cost, as DeepSpeed refuses it.
  EXPECT_EQ(load("pipeline: {stages: 2}\nzero_optimization: {stage: 1}\n").zero_optimization.stage,
            1);
  const std::string m = load_error("pipeline: {stages: 2}\nzero_optimization: {stage: 2}\n");
  EXPECT_HAS(m, "'zero_optimization.stage' 2 with pipeline.stages 2 is not supported");
  EXPECT_HAS(m, "gradient_accumulation_steps times the gradient traffic of ZeRO-1");
  EXPECT_HAS(m, "Use stage 1");
  EXPECT_HAS(load_error("zero_optimization: {stage: 2}\n", {"pipeline.stages=4"}),
             "with pipeline.stages 4 is not supported");
  EXPECT_HAS(load_error("pipeline: {stages: 2}\nzero_optimization: {stage: auto}\n"),
             "the planner does not model pipeline stages yet; set 0 or 1");
}

namespace {

bool any_warning_has(const Config& c, const std::string& text) {
  for (const auto& w : c.warnings) {
    if (w.find(text) != std::string::npos) return true;
  }
  return false;
}

}  // namespace

// DeepSpeed casts the floating-point inputs of its forward to fp16 (engine._cast_inputs_half,
// 0.19); zero applies it through Engine::cast_input (tests/test_mixed_precision.cpp).
TEST(Config, Fp16AutoCastIsAcceptedAndSaysWhatItCasts) {
  Config c = load("fp16: {enabled: true, auto_cast: true}\n");
  EXPECT_TRUE(c.fp16.auto_cast);
  EXPECT_TRUE(any_warning_has(c, "t.yaml:1: 'fp16.auto_cast': floating-point inputs"));
  EXPECT_TRUE(any_warning_has(c, "integer inputs (token ids) stay as they are"));
  EXPECT_FALSE(load("fp16: {enabled: true, auto_cast: false}\n").fp16.auto_cast);
  EXPECT_TRUE(load("fp16: {enabled: true, auto_cast: false}\n").warnings.empty());
  // Without fp16 the model is not fp16: nothing to cast to, said so.
  for (const char* y :
       {"fp16: {enabled: false, auto_cast: true}\n", "fp16: {enabled: auto, auto_cast: true}\n",
        "bf16: {enabled: true}\nfp16: {auto_cast: true}\n"}) {
    SCOPED_TRACE(y);
    c = load(y);
    EXPECT_FALSE(c.fp16.auto_cast);
    EXPECT_TRUE(any_warning_has(c,
                                "'fp16.auto_cast' has no effect here and is ignored: fp16 is "
                                "not enabled"));
  }
}

// torch.compile / DeepCompile settings: accepted with a warning, as DeepSpeed accepts them and
// applies them only to a Python module it is asked to compile.
TEST(Config, CompileBlockHasNoEffectAndSaysWhy) {
  Config c = load("compile:\n  deepcompile: true\n  offload_activation: false\n");
  ASSERT_EQ(c.warnings.size(), 1u);
  EXPECT_HAS(c.warnings[0], "t.yaml:1: 'compile' has no effect here and is ignored");
  EXPECT_HAS(c.warnings[0], "torch.compile");
  EXPECT_TRUE(load("compile: {enabled: false}\n").warnings.empty());
  EXPECT_TRUE(load("compile: false\n").warnings.empty());
}

// total_num_steps "auto" stays for the application to fill (zero-train fills it from
// trainer.steps: tests/e2e/deepspeed_keys.sh); the load does not invent a horizon.
TEST(Config, TotalNumStepsAutoIsLeftForTheApplication) {
  const Config c = load(
      "scheduler: {type: WarmupDecayLR, params: {total_num_steps: auto, warmup_num_steps: 5}}\n");
  EXPECT_TRUE(c.scheduler.total_num_steps_auto);
  EXPECT_EQ(c.scheduler.total_num_steps, 0);
  EXPECT_EQ(c.scheduler.warmup_num_steps, 5);
}
