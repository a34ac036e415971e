// The `pipeline` section: DeepSpeed's keys (runtime/config.py get_pipeline_config: stages,
// partition, seed_layers, activation_checkpoint_interval, pipe_partitioned, grad_partitioned) and
// zero's schedule. DeepSpeed reads the section as a plain dict, key by key, so unknown keys are
// ignored here too (near misses of known ones are reported as typos).
#include <string>

#include "zero/config/config_sections.hpp"

namespace zero::config_detail {

void load_pipeline(Loader& l, const Entry& s, PipelineConfig& p) {
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
             } else if (v == "parameters" || v == "uniform") {
               p.partition = v;
             } else if (v.rfind("type:", 0) == 0) {
               l.fail(e, "'" + e.path + "' " + v +
                             ": partitioning by layer class name is not implemented; use "
                             "parameters or uniform");
             } else {
               l.fail(e, "'" + e.path + "' is '" + v + "'; use parameters or uniform");
             }
           }},
          {"activation_checkpoint_interval",
           [&](const Entry& e) {
             p.activation_checkpoint_interval = static_cast<int>(count(l, e, 0));
           }},
          {"schedule",
           [&](const Entry& e) {
             const std::string v = l.string(e);
             if (v == "interleaved") {
               l.fail(e, "'" + e.path +
                             "' interleaved: schedule only; not run yet (virtual stages are "
                             "built and simulated in zero/pipeline/, the engine runs 1f1b and "
                             "gpipe); use 1f1b or gpipe");
             }
             if (v != "1f1b" && v != "gpipe") {
               l.fail(e, "'" + e.path + "' is '" + v + "'; use 1f1b (the default) or gpipe");
             }
             p.schedule = v;
           }},
          // Megatron's virtual pipeline stages (chunks per stage), for the interleaved schedule.
          {"virtual_stages",
           [&](const Entry& e) {
             if (count(l, e, 1) > 1)
               l.fail(e, "'" + e.path +
                             "' > 1 needs the interleaved schedule: schedule only; not run yet "
                             "(zero/pipeline/ builds and simulates it); remove the key or set 1");
           }},
          // Seeds each layer from its index when DeepSpeed builds it; here the application builds
          // the layers (and seeds them).
          l.no_effect("seed_layers", "the application builds and seeds the layers"),
          // Split the tensors sent between stages across the tensor-parallel group: without
          // tensor parallelism in a pipeline (none here yet) that group is one rank.
          {"pipe_partitioned", [&](const Entry& e) { l.boolean(e); }},
          {"grad_partitioned", [&](const Entry& e) { l.boolean(e); }}},
         Loader::Unknown::kIgnore);
}

void check_pipeline(Loader& l, const Config& c) {
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
    l.fail(*at, "'zero_optimization.stage' 2 with pipeline.stages " + p +
                    " is not supported: ZeRO-2 keeps only this rank's shard of each gradient, so "
                    "every micro-batch's backward would have to reduce-scatter its gradients "
                    "over the data-parallel group, gradient_accumulation_steps times the "
                    "gradient traffic of ZeRO-1 (which accumulates the full gradient locally "
                    "and reduces once per step) for a saving of (1 - 1/dp) of one gradient per "
                    "stage. Use stage 1 (DeepSpeed allows only 0 and 1 with pipelines too)");
  }
}

}  // namespace zero::config_detail
