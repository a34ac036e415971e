// The key table: every key zero reads, with DeepSpeed's names and meanings, plus the DeepSpeed
// keys it recognises but refuses (they would change training) or ignores with a warning (they
// only affect DeepSpeed's diagnostics).
#include "zero/config.hpp"

#include <algorithm>
#include <cmath>
#include <iterator>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "zero/config_schema.hpp"
#include "zero/memory_plan.hpp"

namespace zero {
namespace {

using config_detail::describe;
using config_detail::Loader;
using config_detail::lower;
using Entry = Loader::Entry;
using Field = Loader::Field;

const char* const kSchedulerList = "WarmupLR, WarmupDecayLR, WarmupCosineLR";

std::vector<std::string> words(const char* s) {
  std::istringstream in(s);
  return {std::istream_iterator<std::string>(in), std::istream_iterator<std::string>()};
}

// A boolean DeepSpeed key whose only value zero implements is `neutral`.
Field only_bool(Loader& l, std::string name, bool neutral, std::string why, bool listed = false) {
  return {std::move(name),
          [&l, neutral, why = std::move(why)](const Entry& e) {
            if (l.boolean(e) != neutral) {
              l.fail(e, "'" + e.path + "' " + why + "; only " + (neutral ? "true" : "false") +
                            " is supported");
            }
          },
          listed};
}

int64_t batch_value(const Loader& l, const Entry& e) {
  if (Loader::is_auto(e)) return 0;
  const int64_t v = l.integer(e);
  l.require(e, v >= 1, "a positive integer (or \"auto\" to derive it)");
  return v;
}

double non_negative(const Loader& l, const Entry& e) {
  const double v = l.number(e);
  l.require(e, v >= 0, "a number >= 0");
  return v;
}

double ratio(const Loader& l, const Entry& e) {
  const double v = l.number(e);
  l.require(e, v >= 0 && v <= 1, "a number in [0, 1]");
  return v;
}

int64_t count(const Loader& l, const Entry& e, int64_t lo) {
  const int64_t v = l.integer(e);
  l.require(e, v >= lo, "an integer >= " + std::to_string(lo));
  return v;
}

void load_bf16(Loader& l, const Entry& s, Config& c) {
  l.walk(s, {
                {"enabled", [&](const Entry& e) { c.bf16 = !Loader::is_auto(e) && l.boolean(e); }},
                l.unsupported("immediate_grad_update"),
            });
}

void load_fp16(Loader& l, const Entry& s, Fp16Config& f) {
  l.walk(
      s,
      {
          {"enabled", [&](const Entry& e) { f.enabled = !Loader::is_auto(e) && l.boolean(e); }},
          {"loss_scale", [&](const Entry& e) { f.loss_scale = non_negative(l, e); }},
          {"initial_scale_power",
           [&](const Entry& e) {
             const int64_t v = l.integer(e);
             l.require(e, v >= 0 && v <= 64, "an integer in [0, 64]");
             f.initial_scale_power = static_cast<int>(v);
           }},
          {"loss_scale_window",
           [&](const Entry& e) { f.loss_scale_window = static_cast<int>(count(l, e, 1)); }},
          {"hysteresis", [&](const Entry& e) { f.hysteresis = static_cast<int>(count(l, e, 1)); }},
          {"min_loss_scale",
           [&](const Entry& e) {
             f.min_loss_scale = l.number(e);
             l.require(e, f.min_loss_scale > 0, "a number > 0");
           }},
          only_bool(l, "auto_cast", false, "is not supported yet"),
          only_bool(l, "consecutive_hysteresis", false, "is not supported yet"),
          l.unsupported("fp16_master_weights_and_grads"),
      });
}

void load_zero(Loader& l, const Entry& s, ZeroOptimizationConfig& z) {
  const auto bucket = [&l](int64_t& out) {
    return [&l, p = &out](const Entry& e) {
      if (Loader::is_auto(e)) return;
      *p = l.integer(e);
      l.require(e, *p > 0, "a positive number of elements");
    };
  };
  std::vector<Field> f = {
      {"stage",
       [&](const Entry& e) {
         z.stage_auto = Loader::is_auto(e);
         if (z.stage_auto) return;
         const int64_t v = l.integer(e);
         if (v == 3) {
           l.fail(e, "'" + e.path +
                         "' 3 (partitioned parameters) is not implemented by zero; use 0, 1 or 2");
         }
         l.require(e, v >= 0 && v <= 2, "0, 1 or 2");
         z.stage = static_cast<int>(v);
       }},
      {"auto_device_memory",
       [&](const Entry& e) {
         try {
           z.auto_device_memory = parse_byte_size(l.string(e));
         } catch (const std::invalid_argument& x) {
           l.fail(e, "'" + e.path + "': " + x.what());
         }
         l.require(e, z.auto_device_memory > 0, "a memory size such as 24GB");
       }},
      {"reduce_bucket_size", bucket(z.reduce_bucket_size)},
      {"allgather_bucket_size", bucket(z.allgather_bucket_size)},
      {"overlap_comm", [&](const Entry& e) { z.overlap_comm = l.boolean(e); }},
      {"contiguous_gradients", [&](const Entry& e) { z.contiguous_gradients = l.boolean(e); }},
      {"reduce_scatter", [&](const Entry& e) { z.reduce_scatter = l.boolean(e); }},
      only_bool(l, "allgather_partitions", true, "selects all-reduce based gathering", true),
      {"round_robin_gradients",
       [&](const Entry& e) {
         if (l.boolean(e)) {
           l.warn(e, "'" + e.path + "' only changes DeepSpeed's gradient layout and is ignored");
         }
       }},
  };
  for (const std::string& k :
       words("offload_optimizer offload_param sub_group_size stage3_* cpu_offload "
             "cpu_offload_params cpu_offload_use_pin_memory elastic_checkpoint "
             "load_from_fp32_weights ignore_unused_parameters legacy_stage1 "
             "zero_hpz_partition_size zero_quantized_weights "
             "zero_quantized_gradients zero_quantized_nontrainable_weights "
             "mics_shard_size mics_hierarchical_params_gather "
             "memory_efficient_linear use_multi_rank_bucket_allreduce "
             "param_persistence_threshold model_persistence_threshold "
             "max_live_parameters max_reuse_distance prefetch_bucket_size "
             "gather_16bit_weights_on_model_save module_granularity_threshold "
             "use_all_reduce_for_fetch_params pipeline_loading_checkpoint "
             "override_module_apply log_trace_cache_warnings")) {
    f.push_back(l.unsupported(k));
  }
  l.walk(s, f);
}

void load_optimizer(Loader& l, const Entry& s, OptimizerConfig& o) {
  bool adam_w_mode = true, deepspeed_adam = false;
  const auto unless_auto = [&l](double& out) {
    return [&l, p = &out](const Entry& e) {
      if (!Loader::is_auto(e)) *p = non_negative(l, e);
    };
  };
  const std::vector<Field> params = {
      {"lr", unless_auto(o.lr)},
      {"betas",
       [&](const Entry& e) {
         if (Loader::is_auto(e)) return;
         const auto b = l.numbers(e);
         if (b.size() != 2) {
           l.fail(e, "'" + e.path + "' must be a list of two numbers [beta1, beta2]");
         }
         for (double v : b) {
           if (!(v >= 0 && v < 1)) {
             l.fail(e, "'" + e.path + "' values must be in [0, 1), got " + std::to_string(v));
           }
         }
         o.beta1 = b[0], o.beta2 = b[1];
       }},
      {"eps", unless_auto(o.eps)},
      {"weight_decay", unless_auto(o.weight_decay)},
      {"momentum", [&](const Entry& e) { o.momentum = non_negative(l, e); }},
      {"dampening", [&](const Entry& e) { o.dampening = non_negative(l, e); }},
      {"nesterov", [&](const Entry& e) { o.nesterov = l.boolean(e); }},
      {"adam_w_mode", [&](const Entry& e) { adam_w_mode = l.boolean(e); }},
      {"torch_adam",
       [&](const Entry& e) {
         l.boolean(e);
         l.warn(e, "'" + e.path + "' only selects DeepSpeed's Adam kernel and is ignored");
       }},
      only_bool(l, "amsgrad", false, "is not supported yet"),
      only_bool(l, "bias_correction", true, "turns off Adam's bias correction"),
      l.unsupported("max_coeff"),
      l.unsupported("min_coeff"),
      l.unsupported("freeze_step"),
      l.unsupported("cuda_aware"),
      l.unsupported("comm_backend_name"),
  };
  l.walk(s, {
                {"type",
                 [&](const Entry& e) {
                   const std::string t = lower(l.string(e));
                   if (t == "adamw" || t == "adam") {
                     o.type = "AdamW";
                     deepspeed_adam = t == "adam";
                   } else if (t == "sgd") {
                     o.type = "SGD";
                   } else {
                     l.fail(e, "'" + e.path + "' " + describe(e.value) +
                                   " is not supported by zero; use AdamW, Adam or SGD");
                   }
                 }},
                {"params", [&](const Entry& e) { l.walk(e, params); }},
                l.unsupported("legacy_fusion"),
            });
  if (deepspeed_adam && !adam_w_mode) {
    l.fail(*l.seen("optimizer.params.adam_w_mode"),
           "Adam with L2-coupled weight decay (adam_w_mode: false) is not supported; use "
           "adam_w_mode: true (AdamW)");
  }
  const bool sgd = o.type == "SGD";
  for (const char* k : sgd ? std::vector<const char*>{"betas", "eps", "adam_w_mode", "torch_adam",
                                                      "amsgrad", "bias_correction"}
                           : std::vector<const char*>{"momentum", "dampening", "nesterov"}) {
    if (const Entry* e = l.seen(std::string("optimizer.params.") + k)) {
      l.fail_at_key(*e, "'" + e->path + "' does not apply to optimizer type " + o.type);
    }
  }
  if (o.nesterov && (o.momentum <= 0 || o.dampening != 0)) {
    l.fail(*l.seen("optimizer.params.nesterov"),
           "'optimizer.params.nesterov' needs momentum > 0 and dampening 0");
  }
}

void load_scheduler(Loader& l, const Entry& s, SchedulerConfig& sc) {
  const auto steps = [&l](int64_t& out) {
    return [&l, p = &out](const Entry& e) {
      if (!Loader::is_auto(e)) *p = count(l, e, 0);
    };
  };
  const std::vector<Field> params = {
      {"warmup_min_lr",
       [&](const Entry& e) {
         if (!Loader::is_auto(e)) sc.warmup_min_lr = non_negative(l, e);
       }},
      {"warmup_max_lr",
       [&](const Entry& e) {
         if (!Loader::is_auto(e)) sc.warmup_max_lr = non_negative(l, e);
       }},
      {"warmup_num_steps", steps(sc.warmup_num_steps)},
      {"warmup_type",
       [&](const Entry& e) {
         sc.warmup_type = lower(l.string(e));
         l.require(e, sc.warmup_type == "log" || sc.warmup_type == "linear", "log or linear");
       }},
      {"total_num_steps", steps(sc.total_num_steps)},
      {"warmup_min_ratio", [&](const Entry& e) { sc.warmup_min_ratio = ratio(l, e); }},
      {"cos_min_ratio", [&](const Entry& e) { sc.cos_min_ratio = ratio(l, e); }},
      l.unsupported("last_batch_iteration"),
  };
  l.walk(s, {
                {"type",
                 [&](const Entry& e) {
                   const std::string t = lower(l.string(e));
                   for (const char* known : {"WarmupLR", "WarmupDecayLR", "WarmupCosineLR"}) {
                     if (t == lower(known)) sc.type = known;
                   }
                   if (!sc.type.empty()) return;
                   const bool deepspeed = t == "onecycle" || t == "lrrangetest";
                   const std::string near =
                       config_detail::nearest(t, {"WarmupLR", "WarmupDecayLR", "WarmupCosineLR"});
                   l.fail(e, "'" + e.path + "' " + describe(e.value) +
                                 (deepspeed ? " is not supported by zero" : " is unknown") +
                                 (near.empty() ? "" : "; did you mean '" + near + "'?") +
                                 "; supported: " + kSchedulerList);
                 }},
                {"params", [&](const Entry& e) { l.walk(e, params); }},
            });
  const Entry* type = l.seen("scheduler.type");
  if (!type) l.fail_at_key(s, std::string("'scheduler.type' is required: ") + kSchedulerList);
  // DeepSpeed passes params to the scheduler's constructor, which rejects foreign ones.
  std::vector<const char*> foreign = {"warmup_min_ratio", "cos_min_ratio"};
  if (sc.type == "WarmupLR") foreign.push_back("total_num_steps");
  if (sc.type == "WarmupCosineLR") foreign = {"warmup_min_lr", "warmup_max_lr"};
  for (const char* k : foreign) {
    if (const Entry* e = l.seen(std::string("scheduler.params.") + k)) {
      l.fail_at_key(*e, "'" + e->path + "' does not apply to scheduler type " + sc.type);
    }
  }
  if (sc.type == "WarmupLR") return;
  if (const Entry* e = l.seen("scheduler.params.total_num_steps")) {
    l.require(*e, sc.total_num_steps > 0, "a positive integer for " + sc.type);
  } else {
    l.fail(*type, "'scheduler.params.total_num_steps' (> 0) is required for " + sc.type);
  }
  if (sc.warmup_num_steps > sc.total_num_steps) {
    l.warn(*type, "'scheduler.params.warmup_num_steps' (" + std::to_string(sc.warmup_num_steps) +
                      ") exceeds 'scheduler.params.total_num_steps' (" +
                      std::to_string(sc.total_num_steps) + "): the learning rate never decays");
  }
}

void load_activation_checkpointing(Loader& l, const Entry& s, Config& c) {
  const std::string p = "activation_checkpointing.";
  std::vector<Field> f;
  for (const char* k :
       {"partition_activations", "cpu_checkpointing", "contiguous_memory_optimization",
        "synchronize_checkpoint_boundary", "profile"}) {
    f.push_back({k, [&, k](const Entry& e) {
                   const bool on = l.boolean(e);
                   c.extra[p + k] = on ? "true" : "false";
                   const std::string key = k;
                   // Partitioning splits activations across tensor-parallel ranks; without model
                   // parallelism there is nothing to split it over, and pretending would hide it.
                   if (on && key == "partition_activations") {
                     l.fail(e,
                            "'activation_checkpointing.partition_activations' needs tensor "
                            "model parallelism, which zero does not have; set it to false");
                   }
                   if (on && key != "cpu_checkpointing" && key != "partition_activations") {
                     l.warn(e, "'" + e.path +
                                   "' only tunes DeepSpeed's buffers/profiling and is "
                                   "ignored");
                   }
                 }});
  }
  f.push_back({"number_checkpoints", [&](const Entry& e) {
                 if (!Loader::is_null(e)) {
                   c.extra[p + "number_checkpoints"] = std::to_string(count(l, e, 1));
                   // DeepSpeed sizes its contiguous checkpoint buffers with it; which blocks
                   // are checkpointed is the model's choice, here as in DeepSpeed.
                   l.warn(e, "'" + e.path +
                                 "' only sizes DeepSpeed's contiguous buffers and is "
                                 "ignored; the model decides which blocks are checkpointed");
                 }
               }});
  l.walk(s, f);
}

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

}  // namespace

namespace config_detail {

void load(Loader& l, const YAML::Node& root, const Config::Extension* ext, Config& c) {
  const auto dtype = [&l](std::optional<Dtype>& out) {
    return [&l, p = &out](const Entry& e) {
      if (!Loader::is_null(e)) *p = l.dtype(e);
    };
  };
  std::vector<Field> f = {
      {"train_batch_size", [&](const Entry& e) { c.train_batch_size = batch_value(l, e); }},
      {"train_micro_batch_size_per_gpu",
       [&](const Entry& e) {
         c.micro_batch_auto = Loader::is_auto(e);
         c.train_micro_batch_size_per_gpu = batch_value(l, e);
       }},
      {"gradient_accumulation_steps",
       [&](const Entry& e) { c.gradient_accumulation_steps = batch_value(l, e); }},
      {"gradient_clipping",
       [&](const Entry& e) {
         if (!Loader::is_auto(e)) c.gradient_clipping = non_negative(l, e);
       }},
      {"steps_per_print",
       [&](const Entry& e) { c.steps_per_print = static_cast<int>(count(l, e, 1)); }},
      {"bf16", [&](const Entry& e) { load_bf16(l, e, c); }},
      {"bfloat16", [&](const Entry& e) { load_bf16(l, e, c); }, false},
      {"fp16", [&](const Entry& e) { load_fp16(l, e, c.fp16); }},
      {"zero_optimization", [&](const Entry& e) { load_zero(l, e, c.zero_optimization); }},
      {"optimizer", [&](const Entry& e) { load_optimizer(l, e, c.optimizer); }},
      {"scheduler", [&](const Entry& e) { load_scheduler(l, e, c.scheduler); }},
      {"communication_data_type", dtype(c.communication_data_type)},
      {"data_types",
       [&](const Entry& s) {
         l.walk(s, {{"grad_accum_dtype", [&](const Entry& e) {
                       if (!Loader::is_null(e)) c.grad_accum_dtype = l.dtype(e);
                     }}});
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
      only_bool(l, "prescale_gradients", false, "changes gradient scaling"),
      {"gradient_predivide_factor",
       [&](const Entry& e) {
         if (l.number(e) != 1.0) {
           l.fail(e, "'gradient_predivide_factor' " + describe(e.value) +
                         " changes gradient scaling; only 1.0 is supported");
         }
       },
       false},
  };
  for (const std::string& k :
       words("wall_clock_breakdown dump_state flops_profiler tensorboard wandb "
             "csv_monitor comms_logger memory_breakdown timers")) {
    f.push_back(l.diagnostic(k));
  }
  for (const std::string& k :
       words("amp sparse_gradients zero_allow_untested_optimizer "
             "zero_force_ds_cpu_optimizer pipeline curriculum_learning "
             "data_efficiency compression_training elasticity autotuning checkpoint "
             "aio sparse_attention eigenvalue progressive_layer_drop "
             "quantize_training nebula hybrid_engine weight_quantization compile "
             "disable_allgather dataloader_drop_last fp32_allreduce torch_autocast")) {
    f.push_back(l.unsupported(k));
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
  l.walk(Entry{"", YAML::Node(), root}, f);

  if (l.seen("bf16") && l.seen("bfloat16")) {
    l.fail_at_key(*l.seen("bfloat16"), "'bfloat16' is DeepSpeed's old name for 'bf16'; give one");
  }
  if (c.bf16 && c.fp16.enabled) {
    l.fail(*l.seen("fp16.enabled"), "fp16.enabled and bf16.enabled are both true; enable one");
  }
}

}  // namespace config_detail
}  // namespace zero
