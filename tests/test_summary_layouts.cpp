// One summary for every layout (examples/train_summary.hpp, pp_summary.hpp): the parameter
// checksum and norm are the whole model's whether it trains whole (T = 1), split over
// tensor-parallel ranks (T = 2), over pipeline stages (P = 2) or both, for the same weights.
// The reference is the unsplit model's own parameters summed in one process. Under T = 2 the
// summary used to sum this rank's shards alone (tensor-parallel rank 0's: 54.11 against 57.93
// at T = 1 for the same trained weights); the test shows that sum is off too.
#include <gtest/gtest.h>

#include <ATen/CPUGeneratorImpl.h>

#include <cmath>
#include <vector>

#include "comm/group.hpp"
#include "pp_summary.hpp"
#include "support/thread_group.hpp"
#include "support/token_batch.hpp"
#include "train_summary.hpp"
#include "zero/models/gpt.hpp"
#include "zero/models/gpt_layers.hpp"
#include "zero/models/tp_gpt.hpp"
#include "zero/models/tp_gpt_layers.hpp"
#include "zero/pipeline_engine.hpp"
#include "zero/tensor_parallel.hpp"

namespace zero::testing {
namespace {

using examples::ParamStats;

constexpr double kRel = 1e-12;  // fp64 sums of fp32 values in another order

// The tiny GPT (tied head) with its norms moved off 1, so that a replicated weight counted
// twice, or not at all, shows in the sums.
models::Gpt weights() {
  models::Gpt gpt(tiny_gpt(16));
  at::Generator gen = at::detail::createCPUGenerator(5);
  at::NoGradGuard no_grad;
  for (auto& p : gpt->named_parameters()) p.value().copy_(at::randn(p.value().sizes(), gen));
  return gpt;
}

void expect_same(const ParamStats& got, const ParamStats& ref, const std::string& what) {
  EXPECT_NEAR(got.norm, ref.norm, kRel * ref.norm) << what;
  EXPECT_NEAR(got.checksum, ref.checksum, kRel * std::abs(ref.norm)) << what;
}

Config pipeline_config() {
  Config c;
  c.zero_optimization.stage = 1;
  c.train_micro_batch_size_per_gpu = 1;
  c.gradient_accumulation_steps = 2;
  c.pipeline.stages = 2;
  return c;
}

TEST(SummaryLayouts, ParamNormAndChecksumAreTheWholeModelsUnderEveryLayout) {
  const models::Gpt gpt = weights();
  const ParamStats ref = examples::parameter_stats(gpt->parameters());
  ASSERT_GT(ref.norm, 0);

  // T = 2.
  std::vector<ParamStats> tp(2), shards(2);
  run_ranks(2, [&](std::shared_ptr<comm::Group> world) {
    const auto groups = tensor_parallel::make_groups(world, 2);
    models::TpGpt model(groups.tp, tiny_gpt(16));
    model->load_full(*gpt);
    tp[world->rank()] = examples::whole_model_stats(*model, groups.tp);
    shards[world->rank()] = examples::parameter_stats(model->parameters());
  });
  for (int r = 0; r < 2; ++r) expect_same(tp[r], ref, "T = 2, rank " + std::to_string(r));
  EXPECT_GT(std::abs(shards[0].norm - ref.norm), 1e-3 * ref.norm)
      << "one rank's shards happen to have the whole model's norm: the test shows nothing";

  // P = 2, and P = 2 x T = 2.
  for (int t : {1, 2}) {
    std::vector<ParamStats> got(2 * t);
    run_ranks(2 * t, [&](std::shared_ptr<comm::Group> world) {
      const auto grid = pipeline::make_pipeline_grid(world, 2, t);
      std::vector<pipeline::Layer> layers;
      pipeline::LossFn loss = models::gpt_loss;
      models::Gpt whole{nullptr};
      models::TpGpt split{nullptr};
      if (t == 1) {
        whole = models::Gpt(tiny_gpt(16));
        at::NoGradGuard no_grad;
        auto src = gpt->named_parameters();
        for (auto& p : whole->named_parameters()) p.value().copy_(src[p.key()]);
        layers = models::gpt_pipeline_layers(whole);
      } else {
        split = models::TpGpt(grid.tp, tiny_gpt(16));
        split->load_full(*gpt);
        layers = models::tp_gpt_pipeline_layers(split);
        loss = models::tp_gpt_loss(grid.tp);
      }
      pipeline::PipelineEngine pipe(std::move(layers), loss, pipeline_config(), grid);
      got[world->rank()] = examples::pipeline_model_stats(pipe, grid.tp);
    });
    for (size_t r = 0; r < got.size(); ++r)
      expect_same(got[r], ref, "P = 2 x T = " + std::to_string(t) + ", rank " + std::to_string(r));
  }
}

}  // namespace
}  // namespace zero::testing
