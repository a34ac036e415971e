// The planner's stage-3 row (plan_model_states(in, 3), stage3_units) against the engine: the
// units zero::initialize cuts from a real example GPT (its modules marked by models/gpt.cpp), and
// the model states its memory report measures per rank after training steps at stage 3, on real
// gloo ranks. Before this row the planner priced stage 3 with no root unit and stage 2's bucket
// buffer (zero-train's phase predictions at stage 3 used it).
#include <gtest/gtest.h>
#include <torch/nn/module.h>

#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "support/thread_group.hpp"
#include "zero/memory_plan.hpp"
#include "zero/models/gpt.hpp"
#include "zero/units/unit_plan.hpp"
#include "zero/units/unit_registry.hpp"
#include "zero/zero.hpp"

namespace zero {
namespace {

PlanInput plan_of(const models::GptConfig& c, int world, int param_bytes, int64_t threshold) {
  PlanInput in;
  in.shape = {c.layers, c.dim, c.heads, c.ffn_dim(), c.vocab, c.tied, c.kv_heads};
  in.num_params = c.num_params();
  in.world_size = world;
  in.param_bytes = param_bytes;
  in.comm_bytes = param_bytes;
  // data_types.grad_accum_dtype left at DeepSpeed's default, the model's dtype (Config).
  in.grad_accum_bytes = param_bytes;
  in.bucket_elements = 3000;
  in.param_persistence_threshold = threshold;
  return in;
}

// The unit plan the engine makes (zero/units/unit_plan.cpp) from the module's names, sizes and
// marks, against the planner's from the shape alone.
TEST(MemoryPlanStage3, UnitsAreTheEnginesForTheExampleGpt) {
  for (const bool tied : {true, false}) {
    for (const int64_t threshold : {int64_t{0}, int64_t{100}, int64_t{100000}}) {
      models::GptConfig c = models::gpt_preset("tiny");
      c.tied = tied;
      c.kv_heads = 2;
      models::Gpt gpt(c);
      units::PlanInput ui;
      for (const auto& item : gpt->named_parameters()) {
        ui.params.push_back({item.key(), item.value().numel()});
      }
      ui.marked = units::marked_names(*gpt);
      ui.param_persistence_threshold = threshold;
      const units::UnitPlan engine = units::plan_units(ui);
      std::vector<int64_t> engine_sizes(engine.units(), 0);
      for (size_t i = 0; i < ui.params.size(); ++i) {
        engine_sizes[engine.unit_of[i]] += ui.params[i].numel;
      }
      const PlanInput in = plan_of(c, 2, 4, threshold);
      const auto planned = stage3_units(in);
      std::vector<int64_t> planned_sizes;
      for (const auto& u : planned) {
        int64_t n = 0;
        for (int64_t s : u) n += s;
        planned_sizes.push_back(n);
      }
      EXPECT_EQ(planned_sizes, engine_sizes) << "tied " << tied << ", threshold " << threshold;
      EXPECT_EQ(stage3_root_params(in), engine_sizes[0]);
    }
  }
}

// The formula zero-memory prints: the root whole, the rest over N (the gradient shard exists
// only from backward to the step, FSDP2's set_to_none). gpt-25m at DeepSpeed's
// persistence threshold: the root keeps only the 25 norms (9,600 of 24,388,992 parameters); the
// tied embedding is a unit of its own (it was the root's, 3,155,328 with the norms, 4.518Ψ).
TEST(MemoryPlanStage3, FormulaKeepsOnlyThePersistentParametersWhole) {
  const PlanInput in = plan_of(models::gpt_preset("gpt-25m"), 4, 4, 100000);
  EXPECT_EQ(stage3_root_params(in), 25 * 384);
  EXPECT_EQ(model_state_formula(in, 3), "4Ψ_root (Ψ_root = 0.000394Ψ) + 4Ψ/4 + 8Ψ/4 = 3.002Ψ");
  // The gradient shard is a model state between steps only where optimizer offload keeps its
  // fp32 host copy.
  PlanInput off = in;
  off.offload_optimizer = true;
  EXPECT_EQ(model_state_formula(off, 3),
            "4Ψ_root (Ψ_root = 0.000394Ψ) + 4Ψ/4 + 4Ψ/4 + 8Ψ/4 = 4.002Ψ");
  EXPECT_EQ(stage3_root_params(plan_of(models::gpt_preset("gpt-25m"), 4, 4, 0)), 0);
}

// One model state of the memory report against the planner's: equal up to the engine's padding
// (each bucket padded to a multiple of 64 x N elements, at most 64 x N per bucket).
void expect_close(const char* what, int64_t measured, int64_t planned, int64_t slack) {
  EXPECT_LE(std::llabs(measured - planned), slack)
      << what << ": measured " << measured << ", planned " << planned;
}

TEST(MemoryPlanStage3, ModelStatesAreWhatTheEngineMeasures) {
  struct Case {
    int world;
    bool bf16;
    int64_t threshold;
    bool offload = false;
  };
  for (const Case k : {Case{2, false, 0}, Case{2, true, 0}, Case{4, false, 100000},
                       Case{2, false, 100}, Case{2, false, 0, true}, Case{2, true, 0, true}}) {
    models::GptConfig c = models::gpt_preset("tiny");
    Config cfg;
    cfg.zero_optimization.stage = 3;
    cfg.zero_optimization.reduce_bucket_size = 3000;
    cfg.zero_optimization.stage3.param_persistence_threshold = k.threshold;
    cfg.train_micro_batch_size_per_gpu = 2;
    cfg.bf16 = k.bf16;
    cfg.optimizer.type = "AdamW";
    cfg.zero_optimization.offload_optimizer.enabled = k.offload;
    PlanInput in = plan_of(c, k.world, k.bf16 ? 2 : 4, k.threshold);
    in.offload_optimizer = k.offload;
    const MemoryBreakdown plan = plan_model_states(in, 3);
    std::vector<MemoryReport> reports(k.world);
    testing::run_ranks(k.world, [&](std::shared_ptr<comm::Group> group) {
      at::manual_seed(7);
      auto gpt = std::make_shared<models::GptImpl>(c);
      auto engine = initialize(gpt, cfg, group);
      for (int s = 0; s < 2; ++s) {  // the optimizer states exist after the first step
        const at::Tensor tokens = at::randint(c.vocab, {2, 17}, at::kLong);
        engine.backward(gpt->loss(tokens.narrow(1, 0, 16), tokens.narrow(1, 1, 16)));
        engine.step();
      }
      reports[engine.rank()] = engine.memory_report();
    });
    const std::string name = "N=" + std::to_string(k.world) + (k.bf16 ? " bf16" : " fp32") +
                             " threshold " + std::to_string(k.threshold) +
                             (k.offload ? " offload" : "");
    SCOPED_TRACE(name);
    const int64_t units = static_cast<int64_t>(stage3_units(in).size());
    // Padding: under a bucket per 3000 elements, at most one pad of 64 x N per bucket.
    const int64_t buckets = in.num_params / in.bucket_elements + 2 * units;
    const int64_t pad = buckets * 64 * k.world;
    for (const MemoryReport& r : reports) {
      const MemoryBreakdown& m = r.measured;
      expect_close("parameters", m.params, plan.params, pad * in.param_bytes);
      expect_close("gradients", m.grads, plan.grads, pad * 4 / k.world);
      expect_close("fp32 master", m.master, plan.master, pad * 4 / k.world);
      expect_close("optimizer", m.optimizer, plan.optimizer, pad * 8 / k.world);
      if (k.offload) {
        // The compute-dtype staging of the CPU step covers the padded shard.
        expect_close("bucket buffers", m.comm_buffers, plan.comm_buffers,
                     pad * in.param_bytes / k.world);
      } else {
        EXPECT_EQ(m.comm_buffers, plan.comm_buffers);
      }
      // The blocks are sharded: far below stage 2's parameters (every block, whole) unless the
      // threshold keeps them (bf16 too: no compute-dtype shard; under offload the device
      // shard is a tensor of its own, 1/N of them, fp32 included).
      if (k.threshold < 1000) {
        EXPECT_LT(m.params, plan_model_states(in, 2).params * (k.offload ? 3 : 1) / 4);
      }
    }
  }
}

}  // namespace
}  // namespace zero
