// Checkpoints of the pipeline x data parallel engine (include/zero/pipeline_engine.hpp), per
// stage under dir/stage<s>: the example GPT (tiny preset, tied head) at P = 2 x D = 2 on the host,
// and at P = 2 x D = 1 with every rank on its own device of the fake accelerator, trained 2 steps,
// saved, and loaded by a fresh pipeline built from other weights that trains 2 more steps: the
// losses of the uninterrupted run exactly, and (on the host) its parameters bit for bit, the tied
// head's copy on the last stage included. Resharding (another P or D on load):
// test_pipeline_checkpoint.cpp; training against one process: test_pipeline_engine.cpp.
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "comm/mesh.hpp"
#include "support/fake_device.hpp"
#include "support/pipeline_engine_case.hpp"
#include "support/pipeline_gpt.hpp"
#include "support/thread_group.hpp"
#include "zero/models/gpt.hpp"
#include "zero/models/gpt_layers.hpp"
#include "zero/pipeline_engine.hpp"

namespace zero::pipeline {
namespace {

using namespace engine_test;  // NOLINT: the shared set-up (support/pipeline_engine_case.hpp)
using models::Gpt;
using models::GptConfig;
using zero::testing::load;
using zero::testing::snapshot;

// Checkpoints per stage: 2 steps, save (each stage under dir/stage<s>), then a fresh pipeline
// built from other weights loads it and trains 2 more: the losses and parameters of the
// uninterrupted 4 steps, the tied head's copy on the last stage included (it is not in that
// stage's engine: the owner sends it after the load).
TEST(PipelineEngine, CheckpointPerStageResumes) {
  GptConfig c = models::gpt_preset("tiny");
  c.tied = true;
  at::manual_seed(1234);
  const Params init = snapshot(Gpt(c));
  at::manual_seed(77);
  const Params other = snapshot(Gpt(c));
  const auto batches = make_batches(c, 2 * kMicroBatches * kRowsPerMicroBatch);
  const std::string dir =
      (std::filesystem::temp_directory_path() / ("zero_pp_ckpt_" + std::to_string(::getpid())))
          .string();
  std::filesystem::remove_all(dir);
  std::vector<std::vector<float>> straight(4), resumed(4);
  std::vector<Params> straight_params(4), resumed_params(4);
  testing::run_ranks(4, [&](std::shared_ptr<comm::Group> w) {
    comm::Mesh mesh = comm::Mesh::megatron(w, 1, 2);
    const int rank = w->rank(), d = mesh.coord("dp");
    const int64_t rows = kMicroBatches * kRowsPerMicroBatch;
    const Config cfg = engine_config(Opt::AdamW, 1, 2, ScheduleKind::OneFOneB);
    auto train = [&](PipelineEngine& pipe, size_t from, size_t to, std::vector<float>& out) {
      for (size_t i = from; i < to; ++i) {
        const auto& b = batches[i];
        out.push_back(pipe.train_batch(b.inputs.narrow(0, d * rows, rows).chunk(kMicroBatches, 0),
                                       b.targets.narrow(0, d * rows, rows).chunk(kMicroBatches, 0))
                          .item<float>());
      }
    };
    {
      Gpt model(c);
      load(model, init);
      PipelineEngine pipe(models::gpt_pipeline_layers(model), models::gpt_loss, cfg, mesh["pp"],
                          mesh["dp"]);
      train(pipe, 0, 2, straight[rank]);
      pipe.save_checkpoint(dir);
      train(pipe, 2, 4, straight[rank]);
      straight_params[rank] = snapshot(model);
    }
    Gpt model(c);
    load(model, other);
    PipelineEngine pipe(models::gpt_pipeline_layers(model), models::gpt_loss, cfg, mesh["pp"],
                        mesh["dp"]);
    EXPECT_EQ(pipe.load_checkpoint(dir), "step2");
    train(pipe, 2, 4, resumed[rank]);
    resumed_params[rank] = snapshot(model);
  });
  std::filesystem::remove_all(dir);
  const int last_stage_rank = 2;  // Megatron order: ranks 2, 3 are stage 1
  for (int r = 0; r < 4; ++r) {
    SCOPED_TRACE("rank " + std::to_string(r));
    ASSERT_EQ(resumed[r].size(), 2u);
    EXPECT_EQ(resumed[r][0], straight[r][2]);
    EXPECT_EQ(resumed[r][1], straight[r][3]);
  }
  // The last stage's tied copy and its own layers; the first stage's embedding.
  for (const auto& [key, t] : straight_params[last_stage_rank])
    if (key.rfind("embed", 0) == 0 || key.rfind("norm", 0) == 0)
      EXPECT_TRUE(at::equal(resumed_params[last_stage_rank].at(key), t)) << key;
  EXPECT_TRUE(
      at::equal(resumed_params[0].at("embed.weight"), straight_params[0].at("embed.weight")));
}

// A checkpoint per stage with one data-parallel rank per stage, every rank on its own device of
// the fake accelerator: the agreement that ends save and load runs on the stage's device (a
// data-parallel group of one has no bound device to take it from; review 2026-12-05b, B2), and a
// resumed run continues the uninterrupted one's losses exactly.
TEST(PipelineEngine, CheckpointOnAnAcceleratorWithOneReplicaPerStage) {
  GptConfig c = models::gpt_preset("tiny");
  at::manual_seed(1234);
  const Params init = snapshot(Gpt(c));
  at::manual_seed(77);
  const Params other = snapshot(Gpt(c));
  const auto batches = make_batches(c, kMicroBatches * kRowsPerMicroBatch);
  const std::string dir =
      (std::filesystem::temp_directory_path() / ("zero_pp_fake_ckpt_" + std::to_string(::getpid())))
          .string();
  std::filesystem::remove_all(dir);
  std::vector<std::vector<float>> straight(2), resumed(2);
  testing::run_ranks(
      2,
      [&](std::shared_ptr<comm::Group> w) {
        comm::Mesh mesh = comm::Mesh::megatron(w, 1, 2);
        const c10::Device device = testing::fake::device(w->rank());
        const Config cfg = engine_config(Opt::AdamW, 1, 2, ScheduleKind::OneFOneB);
        auto train = [&](PipelineEngine& pipe, size_t from, size_t to, std::vector<float>& out) {
          train_on(pipe, batches, from, to, device, out);
        };
        auto make = [&](const Params& weights, Gpt& model) {
          load(model, weights);
          model->to(device);
          return PipelineEngine(models::gpt_pipeline_layers(model), models::gpt_loss, cfg,
                                mesh["pp"], mesh["dp"]);
        };
        {
          Gpt model(c);
          PipelineEngine pipe = make(init, model);
          train(pipe, 0, 2, straight[w->rank()]);
          pipe.save_checkpoint(dir);
          train(pipe, 2, 4, straight[w->rank()]);
        }
        Gpt model(c);
        PipelineEngine pipe = make(other, model);
        EXPECT_EQ(pipe.load_checkpoint(dir), "step2");
        train(pipe, 2, 4, resumed[w->rank()]);
      },
      std::chrono::seconds(60), testing::fake::device().type());
  std::filesystem::remove_all(dir);
  for (int r = 0; r < 2; ++r) {
    SCOPED_TRACE("rank " + std::to_string(r));
    ASSERT_EQ(straight[r].size(), 4u);
    ASSERT_EQ(resumed[r].size(), 2u);
    EXPECT_EQ(resumed[r][0], straight[r][2]);
    EXPECT_EQ(resumed[r][1], straight[r][3]);
  }
}

}  // namespace
}  // namespace zero::pipeline
