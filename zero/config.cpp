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

int64_t batch_value(const Loader& l, const Entry& e, Config& c) {
  if (Loader::is_auto(e)) {
    c.auto_batch_keys.push_back(e.path);
    return 0;
  }
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
                {"enabled",
                 [&](const Entry& e) {
                   if (Loader::is_auto(e)) {
                     l.note_auto(e, "false", "DeepSpeed's default");
                     c.bf16 = false;
                   } else {
                     c.bf16 = l.boolean(e);
                   }
                 }},
                {"immediate_grad_update",
                 [&](const Entry& e) {
                   // DeepSpeed's default (true) is what zero does: each bf16 gradient joins the
                   // fp32 accumulation as it arrives. false only defers that, same sums.
                   if (!l.boolean(e)) {
                     l.warn(e, "'" + e.path +
                                   "' has no effect here and is ignored: zero adds each bf16 "
                                   "gradient into fp32 as it arrives");
                   }
                 },
                 false},
                l.no_effect("check_grad_overflow",
                            "bf16 has fp32's range; zero checks the gradient norm for inf/NaN "
                            "on every step"),
            });
}

void load_fp16(Loader& l, const Entry& s, Fp16Config& f) {
  l.walk(s, {
                {"enabled",
                 [&](const Entry& e) {
                   if (Loader::is_auto(e)) {
                     l.note_auto(e, "false", "DeepSpeed's default");
                     f.enabled = false;
                   } else {
                     f.enabled = l.boolean(e);
                   }
                 }},
                {"loss_scale", [&](const Entry& e) { f.loss_scale = non_negative(l, e); }},
                {"initial_scale_power",
                 [&](const Entry& e) {
                   const int64_t v = l.integer(e);
                   l.require(e, v >= 0 && v <= 64, "an integer in [0, 64]");
                   f.initial_scale_power = static_cast<int>(v);
                 }},
                {"loss_scale_window",
                 [&](const Entry& e) { f.loss_scale_window = static_cast<int>(count(l, e, 1)); }},
                {"hysteresis",
                 [&](const Entry& e) { f.hysteresis = static_cast<int>(count(l, e, 1)); }},
                {"min_loss_scale",
                 [&](const Entry& e) {
                   f.min_loss_scale = l.number(e);
                   l.require(e, f.min_loss_scale > 0, "a number > 0");
                 }},
                only_bool(l, "auto_cast", false, "is not supported yet"),
                only_bool(l, "consecutive_hysteresis", false, "is not supported yet"),
                only_bool(l, "fp16_master_weights_and_grads", false,
                          "keeps master weights in fp16, which zero does not implement (its master "
                          "weights are fp32)"),
            });
}

// ZeRO-Offload of the optimizer (stages 1 and 2). Parameter offload is ZeRO-3's and refused.
void load_offload_keys(Loader& l, std::vector<Field>& f,
                       ZeroOptimizationConfig::OffloadOptimizerConfig& o) {
  f.push_back({"offload_optimizer", [&l, &o](const Entry& e) {
                 if (!e.value.IsMap() && !Loader::is_null(e)) {
                   l.fail(e, "'" + e.path + "' must be a section, got " + describe(e.value));
                 }
                 const std::string stage3 = "only ZeRO stage 3 reads it";
                 const std::string nvme = "it only applies to device: nvme";
                 l.walk(e, {
                               {"device",
                                [&](const Entry& d) {
                                  const std::string v = lower(l.string(d));
                                  if (v == "nvme") {
                                    l.fail(d, "'" + d.path +
                                                  "' nvme (ZeRO-Infinity) is not implemented by "
                                                  "zero; use device: cpu (host memory) or none");
                                  }
                                  l.require(d, v == "cpu" || v == "none", "cpu or none");
                                  o.enabled = v == "cpu";
                                }},
                               {"pin_memory", [&](const Entry& d) { o.pin_memory = l.boolean(d); }},
                               {"threads",
                                [&](const Entry& d) {
                                  const int64_t t = l.integer(d);
                                  l.require(d, t >= 0 && t <= 4096,
                                            "a thread count >= 0 (0: OMP_NUM_THREADS)");
                                  o.threads = static_cast<int>(t);
                                }},
                               l.no_effect("nvme_path", nvme),
                               l.no_effect("buffer_count", nvme),
                               l.no_effect("pipeline_read", nvme),
                               l.no_effect("pipeline_write", nvme),
                               l.no_effect("fast_init", nvme),
                               {"ratio",
                                [&](const Entry& d) {
                                  l.require(d, l.number(d) == 1.0,
                                            "1.0 (partial offload is ZeRO stage 3's)");
                                }},
                               only_bool(l, "super_offload", false, stage3),
                               l.no_effect("cpuadam_cores_perc", stage3),
                           });
               }});
  f.push_back({"cpu_offload", [&l, &o](const Entry& e) {
                 // DeepSpeed's deprecated spelling of offload_optimizer: {device: cpu}.
                 if (l.boolean(e)) o.enabled = true;
               }});
  f.push_back(
      {"cpu_offload_use_pin_memory", [&l, &o](const Entry& e) { o.pin_memory = l.boolean(e); }});
  f.push_back({"offload_param",
               [&l](const Entry& e) {
                 if (!e.value.IsMap() && !Loader::is_null(e)) {
                   l.fail(e, "'" + e.path + "' must be a section, got " + describe(e.value));
                 }
                 if (Loader::is_neutral(e.value)) return;
                 l.fail_at_key(e, "'" + e.path +
                                      "' is not implemented: parameter offload is ZeRO stage 3's, "
                                      "which zero does not implement; remove it or set device: "
                                      "none (zero offloads the optimizer with "
                                      "zero_optimization.offload_optimizer: {device: cpu})");
               },
               false});
  f.push_back(only_bool(l, "cpu_offload_params", false,
                        "offloads the parameters (ZeRO stage 3), which zero does not implement; "
                        "use zero_optimization.offload_optimizer: {device: cpu}"));
}

// Offload moves what stages 1 and 2 shard (the fp32 master, its optimizer states and gradient
// shard) to the host; stage 0 has no shard to move, and "auto" must not pick one silently.
void check_offload_stage(const Loader& l, const Entry& s, const ZeroOptimizationConfig& z) {
  if (!z.offload_optimizer.enabled || (!z.stage_auto && (z.stage == 1 || z.stage == 2))) return;
  const Entry* at = l.seen(s.path + ".offload_optimizer");
  if (!at) at = l.seen(s.path + ".cpu_offload");
  const std::string key = at ? at->path : s.path + ".offload_optimizer";
  const std::string got = z.stage_auto ? std::string("\"auto\"") : std::to_string(z.stage);
  const std::string msg = "'" + key + "' offloads the optimizer of ZeRO stage 1 or 2, but " +
                          s.path + ".stage is " + got + "; set " + s.path +
                          ".stage: 2 (or 1), or remove the offload";
  if (at) l.fail_at_key(*at, msg);
  l.fail(s, msg);
}

void load_zero(Loader& l, const Entry& s, ZeroOptimizationConfig& z) {
  const auto bucket = [&l](int64_t& out) {
    return [&l, p = &out](const Entry& e) {
      if (Loader::is_auto(e)) {
        l.note_auto(e, "5e8", "DeepSpeed's default");
        return;
      }
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
  load_offload_keys(l, f, z.offload_optimizer);
  // Keys that only ZeRO stage 3 reads: DeepSpeed ignores them below stage 3 too, and zero
  // refuses stage 3 itself, so they can only be no-ops here.
  for (const std::string& k :
       words("sub_group_size stage3_* prefetch_bucket_size param_persistence_threshold "
             "model_persistence_threshold max_live_parameters max_reuse_distance "
             "gather_16bit_weights_on_model_save module_granularity_threshold "
             "use_all_reduce_for_fetch_params zero_hpz_partition_size zero_quantized_weights "
             "zero_quantized_nontrainable_weights zero_quantized_gradients mics_shard_size "
             "mics_hierarchical_params_gather memory_efficient_linear "
             "pipeline_loading_checkpoint override_module_apply log_trace_cache_warnings "
             "leaf_module")) {
    f.push_back({k, [&l](const Entry& e) {
                   l.warn(e, "'" + e.path +
                                 "' has no effect here and is ignored: only ZeRO stage 3 reads "
                                 "it");
                 }});
    f.back().listed = false;
  }
  f.push_back(only_bool(l, "load_from_fp32_weights", true,
                        "restores from 16-bit weights; zero checkpoints always hold fp32 master "
                        "weights"));
  f.push_back(only_bool(l, "compute_grad_norm", true,
                        "skips the gradient norm; zero needs it for clipping and overflow checks"));
  f.push_back(only_bool(l, "elastic_checkpoint", false, "is not implemented by zero"));
  f.push_back(l.no_effect("use_multi_rank_bucket_allreduce",
                          "it only changes how DeepSpeed issues MoE all-reduces"));
  // Unused parameters are found from the loss's graph and count as zero gradients, always.
  f.push_back(only_bool(l, "ignore_unused_parameters", true,
                        "would make an unused parameter an error; zero always accepts them"));
  for (const std::string& k : words("legacy_stage1 zenflow")) {
    f.push_back(l.unsupported(k));
  }
  l.walk(s, f);
  check_offload_stage(l, s, z);
}

void load_optimizer(Loader& l, const Entry& s, OptimizerConfig& o) {
  bool adam_w_mode = true, deepspeed_adam = false, torch_adam = false;
  // "auto" keys resolve after the walk, when the optimizer type (and so the default) is known.
  std::vector<const Entry*> autos;
  const auto unless_auto = [&l, &autos](double& out) {
    return [&l, &autos, p = &out](const Entry& e) {
      if (Loader::is_auto(e)) {
        autos.push_back(l.seen(e.path));
      } else {
        *p = non_negative(l, e);
      }
    };
  };
  const std::vector<Field> params = {
      {"lr", unless_auto(o.lr)},
      {"betas",
       [&](const Entry& e) {
         if (Loader::is_auto(e)) {
           autos.push_back(l.seen(e.path));
           return;
         }
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
      // DeepSpeed then builds torch.optim.AdamW/Adam instead of FusedAdam: the same update, but
      // torch.optim.AdamW's default weight_decay is 0.01 where FusedAdam's is 0.
      {"torch_adam", [&](const Entry& e) { torch_adam = l.boolean(e); }},
      l.no_effect("foreach", "it only selects torch.optim's multi-tensor kernel"),
      l.no_effect("fp32_optimizer_states", "it only applies to DeepSpeed's CPU Adam"),
      {"max_grad_norm",
       [&](const Entry& e) {
         // DeepSpeed's own answer (engine._configure_basic_optimizer raises the same).
         l.fail_at_key(e, "'" + e.path +
                              "' is not an optimizer parameter in DeepSpeed; use the top-level "
                              "'gradient_clipping' key instead");
       },
       false},
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
                l.no_effect("legacy_fusion",
                            "it only picks DeepSpeed's fused or unfused fp16 optimizer "
                            "implementation, which compute the same update"),
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
  const bool adamw = o.type == "AdamW";
  if (adamw && torch_adam && !l.seen("optimizer.params.weight_decay")) o.weight_decay = 0.01;
  for (const Entry* e : autos) {
    const std::string key = e->path.substr(e->path.rfind('.') + 1);
    std::string v;
    if (key == "lr") v = "1e-3";
    if (key == "eps") v = "1e-8";
    if (key == "betas") v = "[0.9, 0.999]";
    if (key == "weight_decay") {
      if (adamw && torch_adam) o.weight_decay = 0.01;
      v = adamw && torch_adam ? "0.01" : "0";
    }
    l.note_auto(*e, v,
                std::string("the default of ") +
                    (sgd          ? "torch.optim.SGD"
                     : torch_adam ? "torch.optim.AdamW, which torch_adam selects"
                                  : "DeepSpeed's FusedAdam"));
  }
  if (o.nesterov && (o.momentum <= 0 || o.dampening != 0)) {
    l.fail(*l.seen("optimizer.params.nesterov"),
           "'optimizer.params.nesterov' needs momentum > 0 and dampening 0");
  }
}

void load_scheduler(Loader& l, const Entry& s, SchedulerConfig& sc) {
  std::vector<const Entry*> autos;  // resolved once the type is known
  const auto or_auto = [&](const Entry& e, auto&& set) {
    if (Loader::is_auto(e)) {
      autos.push_back(l.seen(e.path));
    } else {
      set();
    }
  };
  const std::vector<Field> params = {
      {"warmup_min_lr",
       [&](const Entry& e) { or_auto(e, [&] { sc.warmup_min_lr = non_negative(l, e); }); }},
      {"warmup_max_lr",
       [&](const Entry& e) { or_auto(e, [&] { sc.warmup_max_lr = non_negative(l, e); }); }},
      // DeepSpeed raises for a non-positive warmup_num_steps.
      {"warmup_num_steps",
       [&](const Entry& e) { or_auto(e, [&] { sc.warmup_num_steps = count(l, e, 1); }); }},
      {"warmup_type",
       [&](const Entry& e) {
         sc.warmup_type = lower(l.string(e));
         l.require(e, sc.warmup_type == "log" || sc.warmup_type == "linear", "log or linear");
       }},
      {"total_num_steps",
       [&](const Entry& e) {
         if (Loader::is_auto(e)) {
           sc.total_num_steps_auto = true;
         } else {
           sc.total_num_steps = count(l, e, 0);
         }
       }},
      {"warmup_min_ratio",
       [&](const Entry& e) { or_auto(e, [&] { sc.warmup_min_ratio = ratio(l, e); }); }},
      {"cos_min_ratio",
       [&](const Entry& e) { or_auto(e, [&] { sc.cos_min_ratio = ratio(l, e); }); }},
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
  for (const Entry* e : autos) {
    const std::string key = e->path.substr(e->path.rfind('.') + 1);
    std::string v = key == "warmup_num_steps" ? "1000" : key == "cos_min_ratio" ? "0.0001" : "0";
    if (key == "warmup_max_lr") {
      v = sc.type == "WarmupDecayLR" ? "0.001" : "optimizer.params.lr";
    }
    l.note_auto(*e, v, "the default of DeepSpeed's " + sc.type);
  }
  if (sc.type == "WarmupLR") return;
  if (const Entry* e = l.seen("scheduler.params.total_num_steps")) {
    if (!sc.total_num_steps_auto) {
      l.require(*e, sc.total_num_steps > 0, "a positive integer for " + sc.type);
    }
  } else {
    l.fail(*type, "'scheduler.params.total_num_steps' (> 0) is required for " + sc.type);
  }
  if (!sc.total_num_steps_auto && sc.warmup_num_steps > sc.total_num_steps) {
    l.warn(*type,
           "'scheduler.params.warmup_num_steps' (" + std::to_string(sc.warmup_num_steps) +
               ") exceeds 'scheduler.params.total_num_steps' (" +
               std::to_string(sc.total_num_steps) +
               "): after the warmup the lr falls straight to the schedule's floor (DeepSpeed "
               "warns too)");
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
                   // DeepSpeed partitions activations across the model-parallel group; with no
                   // model parallelism (zero has none) that group is one rank, so it is a no-op
                   // there as here. The contiguous buffers are a DeepSpeed memory layout.
                   if (on && key == "partition_activations") {
                     l.warn(e,
                            "'activation_checkpointing.partition_activations' has no effect "
                            "here and is ignored: it splits activations over model-parallel "
                            "ranks, and without model parallelism (zero has none) there is one");
                   } else if (on && key != "cpu_checkpointing") {
                     l.warn(e, "'" + e.path +
                                   "' has no effect here and is ignored: it only tunes "
                                   "DeepSpeed's checkpoint buffers/profiling");
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
      {"communication_data_type", dtype(c.communication_data_type)},
      {"data_types",
       [&](const Entry& s) {
         l.walk(s, {{"grad_accum_dtype", [&](const Entry& e) {
                       if (Loader::is_null(e)) return;
                       c.grad_accum_dtype = l.dtype(e);
                       if (c.grad_accum_dtype != Dtype::kFloat32) {
                         l.fail(e, std::string("'data_types.grad_accum_dtype' ") +
                                       dtype_name(c.grad_accum_dtype) +
                                       " is not implemented: zero accumulates gradients in "
                                       "fp32; set it to fp32 or remove it");
                       }
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
      {"prescale_gradients", [&](const Entry& e) { c.prescale_gradients = l.boolean(e); }},
      // DeepSpeed asks for it before using SGD (or any optimizer outside its ZeRO list) under
      // ZeRO; zero's ZeRO supports every optimizer it has, so the key only grants permission.
      {"zero_allow_untested_optimizer", [&](const Entry& e) { l.boolean(e); }},
      // DeepSpeed: whether an offloaded run must use its CPU optimizer; zero always uses its own.
      {"zero_force_ds_cpu_optimizer", [&](const Entry& e) { l.boolean(e); }},
      l.no_effect("dataloader_drop_last",
                  "zero does not build the data loader; the application feeds the batches"),
      {"gradient_predivide_factor",
       [&](const Entry& e) {
         const double f = l.number(e);
         l.require(e, std::isfinite(f) && f > 0, "a positive number");
         c.gradient_predivide_factor = f;
       }},
  };
  for (const std::string& k :
       words("wall_clock_breakdown dump_state flops_profiler tensorboard wandb "
             "csv_monitor comms_logger memory_breakdown timers")) {
    f.push_back(l.diagnostic(k));
  }
  for (const std::string& k :
       words("amp sparse_gradients pipeline curriculum_learning "
             "data_efficiency compression_training elasticity autotuning checkpoint "
             "aio sparse_attention eigenvalue progressive_layer_drop "
             "quantize_training nebula hybrid_engine weight_quantization compile "
             "disable_allgather fp32_allreduce torch_autocast")) {
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
