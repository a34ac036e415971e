// The key table: every key zero reads, with DeepSpeed's names, meanings and defaults (0.19),
// sorted by the key policy of config_schema.hpp: honoured, no effect here (a warning saying
// why), or not honoured (an error with the fix). "auto" (HF Trainer / Accelerate) means
// DeepSpeed's default; the value chosen is noted in Config::warnings.
#include "zero/config.hpp"

#include <algorithm>
#include <cmath>
#include <iterator>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "zero/config/config_sections.hpp"

namespace zero::config_detail {
namespace {

void load_extension(Loader& l, const Entry& s, const Config::Extension& ext, Config& c) {
  using T = Config::Extension::Type;
  std::vector<Field> f;
  for (const auto& k : ext.keys) {
    f.push_back({k.name, [&l, &c, &ext, key = &k](const Entry& e) {
                   std::string text;
                   switch (key->type) {
                     case T::kInt:
                       text = std::to_string(l.integer(e));
                       break;
                     case T::kFloat:
                       l.number(e);
                       text = e.value.Scalar();
                       break;
                     case T::kBool:
                       text = l.boolean(e) ? "true" : "false";
                       break;
                     case T::kString:
                       text = l.string(e);
                       break;
                   }
                   c.extra[ext.section + "." + key->name] = text;
                 }});
  }
  l.walk(s, f);
}

// DeepSpeed's monitors (TensorBoardConfig / CSVConfig: its model forbids other keys, and so
// does zero). The engine writes nothing: the values go to Config::extra as "tensorboard.enabled"
// etc. for the application's training loop (the example trainer: examples/monitor.hpp).
void load_monitor(Loader& l, const Entry& s, Config& c) {
  const std::string p = s.path + ".";
  l.walk(s, {{"enabled",
              [&](const Entry& e) { c.extra[p + "enabled"] = l.boolean(e) ? "true" : "false"; }},
             {"output_path",
              [&](const Entry& e) {
                c.extra[p + "output_path"] = Loader::is_null(e) ? "" : l.string(e);
              }},
             {"job_name", [&](const Entry& e) { c.extra[p + "job_name"] = l.string(e); }}});
}

}  // namespace

void load(Loader& l, const YAML::Node& root, const Config::Extension* ext, Config& c) {
  const auto dtype = [&l](std::optional<Dtype>& out) {
    return [&l, p = &out](const Entry& e) {
      if (!Loader::is_null(e)) *p = l.dtype(e);
    };
  };
  std::vector<Field> f = {
      {"train_batch_size", [&](const Entry& e) { c.train_batch_size = batch_value(l, e, c); }},
      {"train_micro_batch_size_per_gpu",
       [&](const Entry& e) {
         c.micro_batch_auto = Loader::is_auto(e);
         c.train_micro_batch_size_per_gpu = batch_value(l, e, c);
       }},
      {"gradient_accumulation_steps",
       [&](const Entry& e) { c.gradient_accumulation_steps = batch_value(l, e, c); }},
      {"gradient_clipping",
       [&](const Entry& e) {
         if (Loader::is_auto(e)) {
           l.note_auto(e, "1.0", "DeepSpeed's default");
         } else {
           c.gradient_clipping = non_negative(l, e);
         }
       }},
      {"steps_per_print",
       [&](const Entry& e) { c.steps_per_print = static_cast<int>(count(l, e, 1)); }},
      {"bf16", [&](const Entry& e) { load_bf16(l, e, c); }},
      {"bfloat16", [&](const Entry& e) { load_bf16(l, e, c); }, false},
      {"fp16", [&](const Entry& e) { load_fp16(l, e, c.fp16); }},
      {"zero_optimization", [&](const Entry& e) { load_zero(l, e, c.zero_optimization); }},
      {"optimizer", [&](const Entry& e) { load_optimizer(l, e, c.optimizer); }},
      {"scheduler", [&](const Entry& e) { load_scheduler(l, e, c.scheduler); }},
      {"tensor_parallel", [&](const Entry& e) { load_tensor_parallel(l, e, c); }},
      {"pipeline", [&](const Entry& e) { load_pipeline(l, e, c); }},
      {"communication_data_type", dtype(c.communication_data_type)},
      {"data_types",
       [&](const Entry& s) {
         l.walk(s,
                {{"grad_accum_dtype",
                  [&](const Entry& e) {
                    if (Loader::is_null(e)) return;
                    c.grad_accum_dtype = l.dtype(e);
                  }}},
                Loader::Unknown::kIgnore);
       }},
      {"activation_checkpointing", [&](const Entry& e) { load_activation_checkpointing(l, e, c); }},
      {"seed", [&](const Entry& e) { c.seed = l.unsigned_integer(e); }},
      {"comm_timeout_s",
       [&](const Entry& e) {
         const double s = l.number(e);
         l.require(e, s > 0 && s <= 1e9, "a positive number of seconds");
         c.comm_timeout = std::chrono::milliseconds(std::max<int64_t>(1, std::llround(s * 1000)));
       }},
      {"no_weight_decay",
       [&](const Entry& e) {
         c.no_weight_decay = l.strings(e);
         for (const auto& s : c.no_weight_decay) {
           // An empty substring matches every parameter name.
           if (s.empty()) l.fail(e, "'no_weight_decay' entries must be non-empty name substrings");
         }
       }},
      {"prescale_gradients", [&](const Entry& e) { c.prescale_gradients = l.boolean(e); }},
      // DeepSpeed asks for it before using SGD (or any optimizer outside its ZeRO list) under
      // ZeRO; zero's ZeRO supports every optimizer it has, so the key only grants permission.
      {"zero_allow_untested_optimizer", [&](const Entry& e) { l.boolean(e); }},
      // DeepSpeed: whether an offloaded run must use its CPU optimizer; zero always uses its own.
      {"zero_force_ds_cpu_optimizer", [&](const Entry& e) { l.boolean(e); }},
      l.no_effect("dataloader_drop_last",
                  "zero does not build the data loader; the application feeds the batches"),
      {"tensorboard", [&](const Entry& e) { load_monitor(l, e, c); }},
      {"csv_monitor", [&](const Entry& e) { load_monitor(l, e, c); }},
      l.no_effect("wandb",
                  "wandb is not available in C++; use tensorboard (zero writes "
                  "DeepSpeed's TensorBoard events) or csv_monitor"),
      l.no_effect("comet",
                  "comet is not available in C++; use tensorboard (zero writes "
                  "DeepSpeed's TensorBoard events) or csv_monitor"),
      // torch.compile / DeepCompile settings: DeepSpeed applies them only when the script calls
      // engine.compile() on a Python module.
      l.no_effect("compile",
                  "it configures torch.compile (DeepCompile) of a Python model, and a C++ "
                  "model is not compiled by torch.compile"),
      {"gradient_predivide_factor",
       [&](const Entry& e) {
         const double f = l.number(e);
         l.require(e, std::isfinite(f) && f > 0, "a positive number");
         c.gradient_predivide_factor = f;
       }},
  };
  for (const std::string& k :
       words("wall_clock_breakdown dump_state flops_profiler comms_logger memory_breakdown "
             "timers")) {
    f.push_back(l.diagnostic(k));
  }
  for (const std::string& k :
       words("amp sparse_gradients curriculum_learning "
             "data_efficiency compression_training elasticity autotuning checkpoint "
             "aio sparse_attention eigenvalue progressive_layer_drop "
             "quantize_training nebula hybrid_engine weight_quantization "
             "disable_allgather fp32_allreduce torch_autocast")) {
    f.push_back(l.unsupported(k));
  }
  for (const char* m : {"tensorboard", "csv_monitor"}) {  // DeepSpeed's defaults
    c.extra[std::string(m) + ".enabled"] = "false";
    c.extra[std::string(m) + ".output_path"] = "";
    c.extra[std::string(m) + ".job_name"] = "DeepSpeedJobName";
  }
  for (const char* k :
       {"partition_activations", "cpu_checkpointing", "contiguous_memory_optimization",
        "synchronize_checkpoint_boundary", "profile"}) {
    c.extra[std::string("activation_checkpointing.") + k] = "false";
  }
  if (ext) {
    for (const auto& k : f) {
      if (k.name == ext->section) {
        throw ConfigError("zero: Config::Extension section '" + ext->section +
                          "' is a DeepSpeed key; the application must pick another name");
      }
    }
    for (const auto& k : ext->keys) c.extra[ext->section + "." + k.name] = k.default_value;
    f.push_back({ext->section, [&](const Entry& e) { load_extension(l, e, *ext, c); }});
  }
  // DeepSpeed reads the top level key by key and ignores the rest (LLaMA-Factory's configs carry
  // comms_config and monitor_config, which it never reads).
  const size_t errors_before = l.error_count();
  l.walk(Entry{"", YAML::Node(), root}, f, Loader::Unknown::kIgnore);
  if (l.error_count() != errors_before) return;  // finish() reports them

  if (l.seen("bf16") && l.seen("bfloat16")) {
    l.fail_at_key(*l.seen("bfloat16"), "'bfloat16' is DeepSpeed's old name for 'bf16'; give one");
  }
  if (c.bf16 && c.fp16.enabled) {
    l.fail(*l.seen("fp16.enabled"), "fp16.enabled and bf16.enabled are both true; enable one");
  }
  // DeepSpeed accumulates in fp32 or in the model dtype; other mixes are its "unsupported mix".
  if (c.grad_accum_dtype && *c.grad_accum_dtype != Dtype::kFloat32 &&
      *c.grad_accum_dtype != c.param_dtype()) {
    l.fail(*l.seen("data_types.grad_accum_dtype"),
           std::string("'data_types.grad_accum_dtype' ") + dtype_name(*c.grad_accum_dtype) +
               " needs " + dtype_name(*c.grad_accum_dtype) + " parameters (the model is " +
               dtype_name(c.param_dtype()) +
               "): gradients accumulate in fp32 or in the model dtype; set fp32, enable " +
               (*c.grad_accum_dtype == Dtype::kBFloat16 ? "bf16" : "fp16") + " or remove it");
  }
  check_pipeline(l, c);
  if (c.fp16.auto_cast && !c.fp16.enabled) {
    // DeepSpeed casts whenever auto_cast is set; into a model that is not fp16 that only
    // makes the first layer's dtypes disagree.
    l.warn(*l.seen("fp16.auto_cast"),
           "'fp16.auto_cast' has no effect here and is ignored: fp16 is not enabled, so the "
           "model is not fp16 (DeepSpeed would still cast floating-point inputs to fp16)");
    c.fp16.auto_cast = false;
  } else if (c.fp16.auto_cast) {
    l.warn(*l.seen("fp16.auto_cast"),
           "'fp16.auto_cast': floating-point inputs the application passes through "
           "Engine::cast_input become fp16, as DeepSpeed casts its forward's positional "
           "inputs; integer inputs (token ids) stay as they are, as in DeepSpeed 0.19");
  }
  const Entry* torch_adam = l.seen("optimizer.params.torch_adam");
  if (torch_adam && c.optimizer.torch_adam && c.zero_optimization.offload_optimizer.enabled) {
    l.warn(*torch_adam,
           "'optimizer.params.torch_adam' asks for torch.optim.AdamW's op-by-op arithmetic, but "
           "an offloaded optimizer steps with zero's one-pass CPU AdamW: the same update, "
           "rounded differently in the last bits");
  }
}

}  // namespace zero::config_detail
