// zero_optimization (stage, buckets, overlap) and activation_checkpointing.
#include <algorithm>
#include <cmath>
#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

#include "zero/memory_plan.hpp"

#include "zero/config/config_sections.hpp"

namespace zero::config_detail {

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
                                  l.require(
                                      d, t >= 0 && t <= 4096,
                                      "a thread count >= 0 (0: the cores per rank on this node)");
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
                                      "' is not implemented: zero does not offload ZeRO stage "
                                      "3's parameters; remove it or set device: none (zero "
                                      "offloads the optimizer at stages 1 and 2 with "
                                      "zero_optimization.offload_optimizer: {device: cpu})");
               },
               false});
  f.push_back(only_bool(l, "cpu_offload_params", false,
                        "offloads the parameters (ZeRO stage 3), which zero does not implement; "
                        "use zero_optimization.offload_optimizer: {device: cpu}"));
}

// Offload moves what stages 1-3 shard (the fp32 master, its optimizer states and gradient
// shard) to the host; stage 0 has no shard to move, and "auto" must not pick one silently.
void check_offload_stage(const Loader& l, const Entry& s, const ZeroOptimizationConfig& z) {
  if (!z.offload_optimizer.enabled || (!z.stage_auto && z.stage >= 1 && z.stage <= 3)) return;
  const Entry* at = l.seen(s.path + ".offload_optimizer");
  if (!at) at = l.seen(s.path + ".cpu_offload");
  const std::string key = at ? at->path : s.path + ".offload_optimizer";
  const std::string got = z.stage_auto ? std::string("\"auto\"") : std::to_string(z.stage);
  const std::string msg = "'" + key + "' offloads the optimizer of ZeRO stage 1, 2 or 3, but " +
                          s.path + ".stage is " + got + "; set " + s.path +
                          ".stage: 2 (or 1 or 3), or remove the offload";
  if (at) l.fail_at_key(*at, msg);
  l.fail(s, msg);
}

// Quantized reduction replaces the reduce-scatter of stages 1-3; stage 0 all-reduces whole
// gradients (1-bit Adam's territory, not implemented). int4 packs two codes per byte, so its
// block must be even.
void check_quantized_gradients(const Loader& l, const Entry& s, const ZeroOptimizationConfig& z) {
  const auto& q = z.quantized_gradients;
  const Entry* at = l.seen(s.path + ".zero_quantized_gradients");
  if (!q.enabled || !at) return;
  if (!z.stage_auto && z.stage == 0) {
    l.fail_at_key(*at, "'" + at->path + "' compresses the gradient reduce-scatter of ZeRO stages " +
                           "1, 2 and 3, but " + s.path + ".stage is " + std::to_string(z.stage) +
                           "; set " + s.path +
                           ".stage: 1, 2 or 3, or zero_quantized_gradients: false");
  }
  if (q.bits == 4 && q.block % 2 != 0) {
    const Entry* b = l.seen(s.path + ".zero_quantized_gradients_block");
    l.fail_at_key(b ? *b : *at, "'" + s.path + ".zero_quantized_gradients_block' " +
                                    std::to_string(q.block) +
                                    " is odd, but int4 packs two codes per byte; use an even "
                                    "block such as " +
                                    std::to_string(q.block + 1));
  }
}

namespace {

const std::string kOnlyStage3 = "' has no effect here and is ignored: only ZeRO stage 3 reads it";

// One stage-3 key under both of DeepSpeed's spellings ("stage3_max_live_parameters", the alias
// used in every published config, and the field name "max_live_parameters"). Giving both is an
// error rather than a silent choice of one.
void both_spellings(Loader& l, std::vector<Field>& f, const std::string& field,
                    const std::function<void(const Entry&)>& read) {
  const std::string alias = "stage3_" + field;
  for (const std::string& name : {alias, field}) {
    const std::string other = name == alias ? field : alias;
    f.push_back({name, [&l, read, other](const Entry& e) {
                   const std::string parent = e.path.substr(0, e.path.rfind('.') + 1);
                   if (l.seen(parent + other) != nullptr) {
                     l.fail_at_key(e, "'" + e.path + "' and '" + parent + other +
                                          "' are the same DeepSpeed setting; keep one");
                   }
                   read(e);
                 }});
  }
}

// ZeRO-3's keys, parsed and checked as DeepSpeed's DeepSpeedZeroConfig does (non-negative
// integers; "auto" where transformers fills one in) and kept for stage 3.
void load_stage3_keys(Loader& l, std::vector<Field>& f, ZeroOptimizationConfig::Stage3Config& z3) {
  const auto elements = [&l](int64_t* out, bool* is_auto) {
    return [&l, out, is_auto](const Entry& e) {
      if (Loader::is_auto(e)) {
        if (is_auto == nullptr) {
          l.fail(e, "'" + e.path +
                        "' is \"auto\", which transformers fills in only for "
                        "stage3_prefetch_bucket_size and stage3_param_persistence_threshold; "
                        "give a number of elements");
        }
        *is_auto = true;
        return;
      }
      const int64_t v = l.integer(e);
      l.require(e, v >= 0, "a number of elements >= 0");
      *out = v;
      if (is_auto != nullptr) *is_auto = false;
    };
  };
  both_spellings(l, f, "prefetch_bucket_size",
                 elements(&z3.prefetch_bucket_size, &z3.prefetch_bucket_size_auto));
  both_spellings(l, f, "param_persistence_threshold",
                 elements(&z3.param_persistence_threshold, &z3.param_persistence_threshold_auto));
  both_spellings(l, f, "model_persistence_threshold",
                 elements(&z3.model_persistence_threshold, nullptr));
  both_spellings(l, f, "max_live_parameters", elements(&z3.max_live_parameters, nullptr));
  both_spellings(l, f, "max_reuse_distance", elements(&z3.max_reuse_distance, nullptr));
  const auto save16 = [&l, &z3](const Entry& e) {
    // accelerate's zero3_save_16bit_model defaults to false.
    z3.gather_16bit_weights_on_model_save = Loader::is_auto(e) ? false : l.boolean(e);
  };
  both_spellings(l, f, "gather_16bit_weights_on_model_save", save16);
  f.push_back({"stage3_gather_fp16_weights_on_model_save",
               [&l, save16](const Entry& e) { save16(e); }, false});
}

// What the stage-3 keys do at the stage the file asks for: below 3 nothing (DeepSpeed ignores
// them too); at 3 the persistence thresholds shape the units, the 16-bit-save key adds the
// gathered weights to each checkpoint, and the prefetch, live-parameter and reuse-distance keys
// are accepted but not applied yet.
void warn_stage3_keys(Loader& l, const Entry& s, const ZeroOptimizationConfig& z) {
  const bool stage3 = !z.stage_auto && z.stage == 3;
  const std::string no_prefetch =
      "' is accepted but has no effect yet: zero's stage 3 gathers each unit when it is used, "
      "without prefetching, and releases it after its forward and after its last gradient";
  const std::vector<std::pair<std::string, std::string>> at3 = {
      {"prefetch_bucket_size", no_prefetch},
      {"param_persistence_threshold", ""},
      {"model_persistence_threshold", ""},
      {"max_live_parameters", no_prefetch},
      {"max_reuse_distance", no_prefetch},
      {"gather_16bit_weights_on_model_save", ""},
  };
  for (const auto& [field, msg] : at3) {
    for (const std::string& name : {"stage3_" + field, field}) {
      const Entry* e = l.seen(s.path + "." + name);
      if (e == nullptr) continue;
      if (!stage3) {
        l.warn(*e, "'" + e->path + kOnlyStage3);
      } else if (!msg.empty()) {
        l.warn(*e, "'" + e->path + msg);
      }
    }
  }
  if (const Entry* e = l.seen(s.path + ".stage3_gather_fp16_weights_on_model_save")) {
    l.warn(*e, "'" + e->path +
                   "' is DeepSpeed's deprecated spelling of "
                   "stage3_gather_16bit_weights_on_model_save; " +
                   (stage3 ? std::string("read as that key (rename it)")
                           : std::string("it has no effect here and is ignored: only ZeRO "
                                         "stage 3 reads it")));
  }
}

}  // namespace

void load_zero(Loader& l, const Entry& s, ZeroOptimizationConfig& z) {
  // DeepSpeed takes reduce_bucket_size >= 0 (0: each parameter reduced on its own, the layout's
  // rule gives that) but divides by allgather_bucket_size, so that one must be positive.
  const auto bucket = [&l](int64_t& out, bool zero_allowed) {
    return [&l, p = &out, zero_allowed](const Entry& e) {
      if (Loader::is_auto(e)) {
        l.note_auto(e, "5e8", "DeepSpeed's default");
        return;
      }
      *p = l.integer(e);
      if (zero_allowed)
        l.require(e, *p >= 0, "a number of elements >= 0");
      else
        l.require(e, *p > 0, "a positive number of elements");
    };
  };
  std::vector<Field> f = {
      {"stage",
       [&](const Entry& e) {
         z.stage_auto = Loader::is_auto(e);
         if (z.stage_auto) return;
         const int64_t v = l.integer(e);
         l.require(e, v >= 0 && v <= 3, "0, 1, 2 or 3");
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
      {"reduce_bucket_size", bucket(z.reduce_bucket_size, true)},
      {"allgather_bucket_size", bucket(z.allgather_bucket_size, false)},
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
  auto& q = z.quantized_gradients;
  f.push_back({"zero_quantized_gradients", [&](const Entry& e) { q.enabled = l.boolean(e); }});
  f.push_back({"zero_quantized_gradients_bits", [&](const Entry& e) {
                 const int64_t v = l.integer(e);
                 l.require(e, v == 8 || v == 4, "8 (int8) or 4 (int4 codes, two per byte)");
                 q.bits = static_cast<int>(v);
               }});
  f.push_back({"zero_quantized_gradients_block", [&](const Entry& e) {
                 q.block = l.integer(e);
                 l.require(e, q.block > 0 && q.block <= (int64_t{1} << 24),
                           "a positive number of elements per fp32 scale (e.g. 2048)");
               }});
  f.push_back({"zero_quantized_gradients_error_feedback",
               [&](const Entry& e) { q.error_feedback = l.boolean(e); }});
  f.push_back({"zero_quantized_gradients_error_feedback_dtype", [&](const Entry& e) {
                 const std::string v = l.string(e);
                 l.require(e,
                           v == "auto" || v == "fp32" || v == "bf16" || v == "fp16" ||
                               v == "int8",
                           "auto (the gradients' communication dtype), fp32, bf16, fp16 or int8");
                 q.error_feedback_dtype = v;
               }});
  f.push_back({"zero_quantized_gradients_hierarchical",
               [&](const Entry& e) { q.hierarchical = l.boolean(e); }});
  load_stage3_keys(l, f, z.stage3);
  // Other keys that only ZeRO stage 3 reads: DeepSpeed ignores them below stage 3 too, and
  // zero's stage 3 does not implement what they tune, so they are no-ops here.
  for (const std::string& k :
       words("sub_group_size stage3_* module_granularity_threshold "
             "use_all_reduce_for_fetch_params zero_hpz_partition_size zero_quantized_weights "
             "zero_quantized_nontrainable_weights mics_shard_size "
             "mics_hierarchical_params_gather memory_efficient_linear "
             "pipeline_loading_checkpoint override_module_apply log_trace_cache_warnings "
             "leaf_module")) {
    f.push_back({k, [&l](const Entry& e) {
                   l.warn(e, "'" + e.path +
                                 "' has no effect here and is ignored: only ZeRO stage 3 reads "
                                 "it");
                 }});
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
  const size_t errors_before = l.error_count();
  l.walk(s, f);
  if (l.error_count() == errors_before) check_offload_stage(l, s, z);
  if (l.error_count() == errors_before) check_quantized_gradients(l, s, z);
  if (l.error_count() == errors_before) warn_stage3_keys(l, s, z);
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
  // DeepSpeed reads this section key by key (not a pydantic model): others are ignored.
  l.walk(s, f, Loader::Unknown::kIgnore);
}

}  // namespace zero::config_detail

namespace zero {

void ZeroOptimizationConfig::Stage3Config::resolve_auto(int64_t hidden) {
  if (hidden <= 0) {
    throw std::invalid_argument("zero: stage-3 \"auto\" values need the model's hidden size, got " +
                                std::to_string(hidden));
  }
  if (prefetch_bucket_size_auto) {
    // transformers' int(0.9 * hidden_size * hidden_size), evaluated as Python does it (doubles,
    // left to right, truncated): the same number a Python run of the same config gets.
    prefetch_bucket_size =
        static_cast<int64_t>(0.9 * static_cast<double>(hidden) * static_cast<double>(hidden));
    prefetch_bucket_size_auto = false;
  }
  if (param_persistence_threshold_auto) {
    param_persistence_threshold = 10 * hidden;
    param_persistence_threshold_auto = false;
  }
}

}  // namespace zero
