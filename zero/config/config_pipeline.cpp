// The `pipeline` section: DeepSpeed's keys (runtime/config.py get_pipeline_config: stages,
// partition, seed_layers, activation_checkpoint_interval, pipe_partitioned, grad_partitioned) and
// zero's schedule with Megatron-LM's virtual pipeline stages. DeepSpeed reads the section as a
// plain dict, key by key, so unknown keys are ignored here too (near misses of known ones are
// reported as typos).
#include <string>

#include "zero/config/config_sections.hpp"

namespace zero::config_detail {
namespace {

constexpr const char* kVirtualStages = "pipeline.virtual_stages";

}  // namespace

void load_pipeline(Loader& l, const Entry& s, Config& c) {
  PipelineConfig& p = c.pipeline;
  l.walk(s,
         {{"stages",
           [&](const Entry& e) {
             if (Loader::is_auto(e)) {
               l.note_auto(e, "1", "no pipeline unless the stages are given");
               p.stages = 1;
               return;
             }
             p.stages = static_cast<int>(count(l, e, 1));
           }},
          {"partition",
           [&](const Entry& e) {
             const std::string v = l.string(e);
             if (v == "best") {
               // DeepSpeed's config default; its PipelineModule partitions by "parameters".
               l.note_auto(e, "parameters", "DeepSpeed PipelineModule's partition_method");
               p.partition = "parameters";
             } else if (v == "parameters" || v == "compute" || v == "uniform") {
               p.partition = v;
             } else if (v.rfind("type:", 0) == 0) {
               l.fail(e, "'" + e.path + "' " + v +
                             ": partitioning by layer class name is not implemented; use "
                             "parameters, compute or uniform");
             } else {
               l.fail(e, "'" + e.path + "' is '" + v + "'; use parameters, compute or uniform");
             }
           }},
          {"activation_checkpoint_interval",
           [&](const Entry& e) {
             p.activation_checkpoint_interval = static_cast<int>(count(l, e, 0));
           }},
          {"schedule",
           [&](const Entry& e) {
             const std::string v = l.string(e);
             if (v != "1f1b" && v != "gpipe" && v != "interleaved") {
               l.fail(e, "'" + e.path + "' is '" + v +
                             "'; use 1f1b (the default), gpipe or interleaved (with "
                             "pipeline.virtual_stages)");
             }
             p.schedule = v;
           }},
          // Megatron's virtual pipeline stages (model chunks per stage, its
          // virtual_pipeline_model_parallel_size), for the interleaved schedule.
          {"virtual_stages",
           [&](const Entry& e) { p.virtual_stages = static_cast<int>(count(l, e, 1)); }},
          // Megatron-LM's overlap_p2p_comm: receives posted early (RuntimeOptions::early_receives),
          // in Config::extra (zero/comm_overlap.hpp).
          {"overlap_p2p_comm",
           [&](const Entry& e) { c.extra[e.path] = l.boolean(e) ? "true" : "false"; }},
          // Seeds each layer from its index when DeepSpeed builds it; here the application builds
          // the layers (and seeds them).
          l.no_effect("seed_layers", "the application builds and seeds the layers"),
          // Split the activations (gradients) sent between stages across the tensor-parallel
          // group, all-gathered by the receiving stage: under tensor parallelism without
          // sequence parallelism (with it each rank already sends its 1/T of the sequence).
          // Kept in Config::extra ("true" / "false"; absent: DeepSpeed's default, true), read by
          // the pipeline engine (pipeline_partitioned() in include/zero/pipeline_engine.hpp).
          {"pipe_partitioned",
           [&](const Entry& e) { c.extra[e.path] = l.boolean(e) ? "true" : "false"; }},
          {"grad_partitioned",
           [&](const Entry& e) { c.extra[e.path] = l.boolean(e) ? "true" : "false"; }}},
         Loader::Unknown::kIgnore);
}

namespace {

// Megatron-LM's rules for its interleaved schedule (virtual_pipeline_model_parallel_size), each
// naming the key to change.
void check_interleaved(Loader& l, const Config& c) {
  const int v = c.pipeline.virtual_stages;
  const PipelineConfig& p = c.pipeline;
  const Entry* vs = l.seen(kVirtualStages);
  const Entry* sched = l.seen("pipeline.schedule");
  const std::string n = std::to_string(v);
  if (p.schedule == "interleaved" && v < 2 && sched)
    l.fail(*sched, "'pipeline.schedule' interleaved needs pipeline.virtual_stages of 2 or more "
                   "(the model chunks each stage holds: its bubble is (P - 1) / (v x m)); set "
                   "pipeline.virtual_stages, or use 1f1b");
  if (v < 2 || !vs) return;
  if (p.schedule != "interleaved")
    l.fail(*vs, "'pipeline.virtual_stages' " + n + " needs pipeline.schedule: interleaved (" +
                    p.schedule + " runs one model chunk per stage); set it, or remove the key");
  if (p.stages < 2)
    l.fail(*vs, "'pipeline.virtual_stages' " + n +
                    " needs pipeline.stages of at least 2 (the chunks pass between stages); set "
                    "pipeline.stages, or remove the key");
  const Entry* ga = l.seen("gradient_accumulation_steps");
  if (ga && c.gradient_accumulation_steps > 0 && c.gradient_accumulation_steps % p.stages != 0)
    l.fail(*ga, "'gradient_accumulation_steps' " + std::to_string(c.gradient_accumulation_steps) +
                    " (the micro-batches of a step) must be a multiple of pipeline.stages " +
                    std::to_string(p.stages) +
                    " under the interleaved schedule, as Megatron-LM requires (micro-batches go "
                    "through the chunks in groups of P); use " +
                    std::to_string((c.gradient_accumulation_steps / p.stages + 1) * p.stages) +
                    ", or pipeline.schedule: 1f1b");
}

}  // namespace

void check_pipeline(Loader& l, const Config& c) {
  check_interleaved(l, c);
  if (c.pipeline.stages <= 1) return;
  const ZeroOptimizationConfig& z = c.zero_optimization;
  const Entry* at = l.seen("zero_optimization.stage");
  if (!at) at = l.seen("pipeline.stages");
  if (!at) return;
  const std::string p = std::to_string(c.pipeline.stages);
  if (z.stage_auto) {
    l.fail(*at, "'zero_optimization.stage' \"auto\" with pipeline.stages " + p +
                    ": the planner does not model pipeline stages yet; set 0 or 1");
  }
  if (z.stage >= 2) {
    // DeepSpeed's PipelineEngine asserts the same ("ZeRO-2 and ZeRO-3 are incompatible with
    // pipeline parallelism").
    l.fail(*at, "'zero_optimization.stage' " + std::to_string(z.stage) + " with pipeline.stages " +
                    p +
                    " is not supported: ZeRO-2 keeps only this rank's shard of each gradient, so "
                    "every micro-batch's backward would have to reduce-scatter its gradients "
                    "over the data-parallel group, gradient_accumulation_steps times the "
                    "gradient traffic of ZeRO-1 (which accumulates the full gradient locally "
                    "and reduces once per step) for a saving of (1 - 1/dp) of one gradient per "
                    "stage. Use stage 1 (DeepSpeed allows only 0 and 1 with pipelines too)");
  }
}

}  // namespace zero::config_detail
