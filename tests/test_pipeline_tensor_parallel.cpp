// Pipeline x tensor parallelism (3D, include/zero/pipeline_engine.hpp): the tensor-parallel
// example GPT (models::TpGpt, vocabulary-parallel embedding and cross-entropy, column/row
// parallel blocks) cut into P = 2 stages over T = 2 tensor-parallel ranks (and D = 2 replicas),
// Megatron's rank order from make_pipeline_grid, each stage's shards trained by the ZeRO engine
// (stage 1) over its data-parallel group, gradients clipped by the global norm (summed over dp,
// tp with the replicated norms counted once, and pp). The reference is independent: the plain
// models::Gpt with the same initial weights in one process, plain autograd, torch's optimizer
// and clip_grad_norm_, the whole global batch in one backward. Losses per step within 1e-5
// relative on every rank, the global norm within 1e-5, and every parameter afterwards, gathered
// from its tensor-parallel shards, within 1e-5 (AdamW: in L2, per element 1e-3; kAdamMaxTol
// says why), for GPipe, 1F1B and interleaved 1F1B (v = 2), SGD with momentum and AdamW, tied
// (vocabulary-parallel embedding shard reused as the head on the last stage) and untied, with
// and without sequence parallelism (Megatron-SP: each tensor-parallel rank holds and sends its
// 1/T of the sequence between the parallel regions and stages; the norms' partial gradients are
// summed over tp by each stage's engine).
#include <gtest/gtest.h>
#include <torch/nn/utils/clip_grad.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>
#include <unistd.h>

#include <ATen/CPUGeneratorImpl.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "support/pipeline_gpt.hpp"
#include "support/pipeline_tp_case.hpp"
#include "support/thread_group.hpp"
#include "support/tp_compare.hpp"
#include "zero/models/gpt.hpp"
#include "zero/models/tp_gpt.hpp"
#include "zero/models/tp_gpt_layers.hpp"
#include "zero/pipeline/schedule.hpp"
#include "zero/pipeline_engine.hpp"

namespace zero::pipeline {
namespace {

using models::Gpt;
using models::GptConfig;

using namespace zero::testing::pipeline_tp;
using Batch = zero::testing::StepBatch;
using Params = zero::testing::GptParams;
using zero::testing::load;
using zero::testing::snapshot;

Config engine_config(Opt o, int stages, int tp, ScheduleKind schedule) {
  return zero::testing::pipeline_tp::engine_config(o, stages, tp,
                                                   std::string(schedule_name(schedule)));
}

std::vector<Batch> make_batches(const GptConfig& c, int rows) {
  return zero::testing::step_batches(c.vocab, kSteps, rows, kSeq);
}

struct Trained {
  std::vector<float> losses;
  Params params;
  std::vector<double> norms;
};

// The whole plain model in one process: `accumulate` micro-batches one after another (1: the
// whole batch in one backward), the global norm clipped by torch, one torch optimizer.
Trained reference(const GptConfig& c, const Params& init, const std::vector<Batch>& batches, Opt o,
                  int accumulate) {
  Gpt model(c);
  {
    at::NoGradGuard g;
    for (auto& p : model->named_parameters()) p.value().copy_(init.at(p.key()));
  }
  auto opt = torch_opt(o, model->parameters());
  Trained out;
  for (const auto& b : batches) {
    auto in = b.inputs.chunk(accumulate, 0);
    auto tg = b.targets.chunk(accumulate, 0);
    double loss = 0;
    for (int i = 0; i < accumulate; ++i) {
      at::Tensor l = model->loss(in[i], tg[i]) / accumulate;
      l.backward();
      loss += l.item<double>();
    }
    out.norms.push_back(torch::nn::utils::clip_grad_norm_(model->parameters(), kClip));
    opt->step();
    opt->zero_grad();
    out.losses.push_back(static_cast<float>(loss));
  }
  out.params = snapshot(model);
  return out;
}

struct Case {
  int stages, tp, dp;
  ScheduleKind schedule;
  Opt opt;
  bool tied;
  bool sp = false;         // tensor_parallel.sequence_parallel
  int virtual_stages = 1;  // pipeline.virtual_stages (ScheduleKind::Interleaved)
};

std::string name(const Case& k) {
  return "P=" + std::to_string(k.stages) + " x T=" + std::to_string(k.tp) +
         " x D=" + std::to_string(k.dp) + " " + std::string(schedule_name(k.schedule)) +
         (k.virtual_stages > 1 ? " v=" + std::to_string(k.virtual_stages) + " " : " ") +
         (k.opt == Opt::SGD ? "SGD" : "AdamW") + (k.tied ? " tied" : " untied") +
         (k.sp ? " SP" : "");
}

struct Trial {
  std::vector<std::vector<float>> losses;  // per world rank
  std::vector<Params> params;              // per world rank: its stage's parameters, gathered
  std::vector<double> norms;               // world rank 0's engine, per step
  std::vector<std::string> grids;          // per world rank: "stage s, tp rank r, dp rank d"
};

Trial run_case(const Case& k, const GptConfig& c, const Gpt& init,
               const std::vector<Batch>& batches) {
  const int world = k.stages * k.tp * k.dp;
  Trial run;
  run.losses.resize(world);
  run.params.resize(world);
  run.grids.resize(world);
  testing::run_ranks(world, [&](std::shared_ptr<comm::Group> w) {
    const PipelineGrid grid = make_pipeline_grid(w, k.stages, k.tp);
    const int rank = w->rank();
    // Megatron's order: tensor innermost, then data, then pipeline.
    EXPECT_EQ(rank, grid.tp_rank + k.tp * (grid.dp_rank + k.dp * grid.stage));
    run.grids[rank] = grid.describe();
    models::TpGpt model(grid.tp, c, k.sp);
    model->load_full(*init);  // this rank's shards of the reference's initial weights
    auto layers = models::tp_gpt_pipeline_layers(model);
    Config cfg = engine_config(k.opt, k.stages, k.tp, k.schedule);
    cfg.tensor_parallel.sequence_parallel = k.sp;
    cfg.pipeline.virtual_stages = k.virtual_stages;
    PipelineEngine pipe(layers, models::tp_gpt_loss(grid.tp), cfg, grid);
    ASSERT_EQ(pipe.stage(), grid.stage);
    ASSERT_EQ(pipe.engine().world_size(), k.dp);
    ASSERT_EQ(pipe.virtual_stages(), k.virtual_stages);
    ASSERT_EQ(pipe.bounds().size(), static_cast<size_t>(k.stages * k.virtual_stages + 1));
    // This stage's layers' parameters (a tied copy included): interleaved, chunks s, s + P, ...
    // of the P x v bounds.
    std::set<const void*> mine;
    for (int c = pipe.stage(); c + 1 < static_cast<int>(pipe.bounds().size()); c += k.stages)
      for (int i = pipe.bounds()[c]; i < pipe.bounds()[c + 1]; ++i)
        for (const auto& p : layers[i].module->parameters()) mine.insert(p.unsafeGetTensorImpl());
    const int64_t rows = kMicroBatches * kRowsPerMicroBatch, d = grid.dp_rank;
    for (const auto& b : batches) {
      auto in = b.inputs.narrow(0, d * rows, rows).chunk(kMicroBatches, 0);
      auto tg = b.targets.narrow(0, d * rows, rows).chunk(kMicroBatches, 0);
      run.losses[rank].push_back(pipe.train_batch(in, tg).item<float>());
      ASSERT_TRUE(pipe.last_step_applied());
      if (rank == 0) run.norms.push_back(pipe.engine().stats().last_grad_norm);
    }
    // Whole tensors from the tensor-parallel shards (a collective over tp); this stage's only.
    std::set<std::string> names;
    for (const auto& p : model->named_parameters())
      if (mine.count(p.value().unsafeGetTensorImpl())) names.insert(p.key());
    for (auto& [key, full] : model->gather_full())
      if (names.count(key)) run.params[rank][key] = full;
  });
  return run;
}

void check(const Case& k) {
  SCOPED_TRACE(name(k));
  GptConfig c = models::gpt_preset("tiny");
  c.tied = k.tied;
  at::manual_seed(1234);  // the main thread's draw of the initial weights, before any rank runs
  const Gpt init(c);
  const Params init_params = snapshot(init);
  const auto batches = make_batches(c, k.dp * kMicroBatches * kRowsPerMicroBatch);
  const Trained ref = reference(c, init_params, batches, k.opt, 1);
  const Trial run = run_case(k, c, init, batches);

  EXPECT_EQ(run.grids[0], "pp " + std::to_string(k.stages) + " x dp " + std::to_string(k.dp) +
                              " x tp " + std::to_string(k.tp));
  std::set<std::string> covered;
  double worst_loss = 0, worst_param = 0, worst_l2 = 0;
  for (size_t r = 0; r < run.losses.size(); ++r) {
    ASSERT_EQ(run.losses[r].size(), ref.losses.size());
    for (size_t i = 0; i < ref.losses.size(); ++i) {
      EXPECT_NEAR(run.losses[r][i], ref.losses[i], kTol * std::abs(ref.losses[i]))
          << "rank " << r << " step " << i;
      worst_loss =
          std::max(worst_loss, std::abs(double(run.losses[r][i]) - ref.losses[i]) / ref.losses[i]);
    }
    for (const auto& [key, t] : run.params[r]) {
      const at::Tensor& want = ref.params.at(key);
      const std::string what = "rank " + std::to_string(r) + " " + key;
      const double l2 = (t - want).norm().item<double>() / want.norm().item<double>();
      if (k.opt == Opt::SGD) {
        testing::expect_rel_close(t, want, kTol, what);
      } else {
        EXPECT_LE(l2, kTol) << what << ": L2 relative error";
        EXPECT_LE(testing::max_rel_err(t, want), kAdamMaxTol) << what << ": max relative error";
      }
      worst_param = std::max(worst_param, testing::max_rel_err(t, want));
      worst_l2 = std::max(worst_l2, l2);
      covered.insert(key);
    }
  }
  EXPECT_EQ(covered.size(), ref.params.size()) << "some parameter is on no stage";
  // The engine clipped by the global norm over dp, tp and pp (the reference's, before clipping).
  ASSERT_EQ(run.norms.size(), ref.norms.size());
  for (size_t i = 0; i < ref.norms.size(); ++i)
    EXPECT_NEAR(run.norms[i], ref.norms[i], kTol * ref.norms[i]) << "step " << i;
  EXPECT_GT(ref.norms.front(), kClip) << "the test should clip";
  std::printf(
      "  %s: losses %.6f .. %.6f (reference %.6f .. %.6f), worst loss rel err %.2g, worst "
      "parameter rel err %.2g (L2 %.2g), norm %.5f (reference %.5f)\n",
      name(k).c_str(), run.losses[0].front(), run.losses[0].back(), ref.losses.front(),
      ref.losses.back(), worst_loss, worst_param, worst_l2, run.norms.front(), ref.norms.front());
}

TEST(PipelineTensorParallel, TwoStagesTimesTwoTensorRanksMatchSingleProcessTraining) {
  for (auto schedule : {ScheduleKind::GPipe, ScheduleKind::OneFOneB})
    for (auto opt : {Opt::SGD, Opt::AdamW}) check({2, 2, 1, schedule, opt, false});
}

// The tied head on the last stage reads the embedding's vocabulary shard: each tensor-parallel
// rank's shard travels between stage 0 and the last stage's rank of the same tensor rank.
TEST(PipelineTensorParallel, TiedVocabParallelEmbeddingAndHeadAcrossStages) {
  check({2, 2, 1, ScheduleKind::OneFOneB, Opt::SGD, true});
  check({2, 2, 1, ScheduleKind::GPipe, Opt::AdamW, true});
}

// 3D: 8 ranks, two replicas of the P = 2 x T = 2 pipeline, each its half of every batch.
TEST(PipelineTensorParallel, TwoStagesTimesTwoTensorRanksTimesTwoReplicas) {
  check({2, 2, 2, ScheduleKind::OneFOneB, Opt::AdamW, true});
  check({2, 2, 2, ScheduleKind::GPipe, Opt::SGD, false});
}

// Sequence parallelism inside the pipeline: the embedding reduce-scatters its output along the
// sequence, each stage's tensor rank r sends its [b, s / T, h] to the next stage's rank r, the
// head all-gathers the sequence before the vocabulary-parallel logits, and each stage's engine
// sums the norms' partial gradients over tp after its dp reduction (Megatron's
// finalize_model_grads). Untied and tied (the last stage's head then holds a copy of the
// embedding's shard: its module is rebuilt without it and must still say its norm is partial).
TEST(PipelineTensorParallel, SequenceParallelStagesMatchSingleProcessTraining) {
  check({2, 2, 1, ScheduleKind::OneFOneB, Opt::SGD, false, true});
  check({2, 2, 1, ScheduleKind::GPipe, Opt::AdamW, true, true});
  check({2, 2, 2, ScheduleKind::OneFOneB, Opt::AdamW, false, true});
}

// Megatron's interleaved 1F1B under tensor parallelism, the layout a large run takes: P = 2 x
// v = 2 chunks (the tiny GPT's embedding, 2 blocks and head, one layer a chunk), tensor rank r of
// each chunk sending to rank r of the next (the last stage's chunk 0 to stage 0's chunk 1), with
// and without sequence parallelism (then [b, s / T, h] on every chunk boundary) and
// pipe_partitioned (without it: 1/T of the replicated activation), tied and untied, D 1 and 2.
TEST(PipelineTensorParallel, InterleavedStagesMatchSingleProcessTraining) {
  auto interleaved = [](int dp, Opt opt, bool tied, bool sp) {
    Case k{2, 2, dp, ScheduleKind::Interleaved, opt, tied, sp};
    k.virtual_stages = 2;
    return k;
  };
  check(interleaved(1, Opt::SGD, false, true));
  check(interleaved(1, Opt::AdamW, true, false));
  check(interleaved(2, Opt::AdamW, false, true));
}

// What the trainer's reports read: where each train_batch spent its time (the instructions'
// wall time, within the call's), and every stage's values gathered on every rank, by stage.
TEST(PipelineTensorParallel, StepTimesAndValuesGatheredOverTheStages) {
  GptConfig c = models::gpt_preset("tiny");
  const auto batches = make_batches(c, kMicroBatches * kRowsPerMicroBatch);
  testing::run_ranks(4, [&](std::shared_ptr<comm::Group> w) {
    const PipelineGrid grid = make_pipeline_grid(w, 2, 2);
    models::TpGpt model(grid.tp, c);
    PipelineEngine pipe(models::tp_gpt_pipeline_layers(model), models::tp_gpt_loss(grid.tp),
                        engine_config(Opt::SGD, 2, 2, ScheduleKind::OneFOneB), grid);
    for (const auto& b : batches) {
      const auto start = std::chrono::steady_clock::now();
      pipe.train_batch(b.inputs.chunk(kMicroBatches, 0), b.targets.chunk(kMicroBatches, 0));
      const double wall =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      const StepTimes& t = pipe.last_step_times();
      EXPECT_GT(t.forward_s, 0);
      EXPECT_GT(t.backward_s, 0);
      EXPECT_GT(t.step_s, 0);
      EXPECT_GT(t.comm_s, 0);
      // Disjoint intervals inside the call; between them only the loop's own statements.
      EXPECT_LE(t.total(), wall);
      EXPECT_GE(t.total(), 0.5 * wall);
    }
    const auto v = pipe.gather_over_stages(
        {static_cast<double>(grid.stage), static_cast<double>(grid.tp_rank), 7.5});
    ASSERT_EQ(v.size(), 2u);
    for (int s = 0; s < 2; ++s)
      EXPECT_EQ(v[s], (std::vector<double>{static_cast<double>(s),
                                           static_cast<double>(grid.tp_rank), 7.5}));
  });
}

TEST(PipelineTensorParallel, RefusesAnUnmarkedNormAndAGridNotDividingTheWorld) {
  GptConfig c = models::gpt_preset("tiny");
  c.tied = false;
  testing::run_ranks(4, [&](std::shared_ptr<comm::Group> w) {
    const PipelineGrid grid = make_pipeline_grid(w, 2, 2);
    models::TpGpt model(grid.tp, c, /*sequence_parallel=*/true);
    Config cfg = engine_config(Opt::SGD, 2, 2, ScheduleKind::OneFOneB);
    cfg.tensor_parallel.sequence_parallel = true;
    // The last layer's norm and head in a plain module, which says nothing of its norm.
    auto layers = models::tp_gpt_pipeline_layers(model);
    auto plain = std::make_shared<torch::nn::Module>();
    plain->register_module("norm", model->norm);
    plain->register_module("head", model->head);
    layers.back().module = plain;
    try {
      PipelineEngine(layers, models::tp_gpt_loss(grid.tp), cfg, grid);
      ADD_FAILURE() << "sequence parallelism accepted";
    } catch (const std::invalid_argument& e) {
      // The last stage's head holds the final norm without a sequence-parallel mark; the first
      // stage, whose blocks are marked, throws the same text instead of waiting for it.
      EXPECT_NE(std::string(e.what()).find("under sequence parallelism the replicated parameter"),
                std::string::npos)
          << e.what();
    }
    try {
      make_pipeline_grid(w, 2, 4);
      ADD_FAILURE() << "2 stages x tp 4 on 4 ranks accepted";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find("pipeline.stages = 2 x tensor_parallel.autotp_size = "
                                           "4 does not divide the world size 4"),
                std::string::npos)
          << e.what();
    }
    w->barrier("every rank checked");
  });
}

}  // namespace
}  // namespace zero::pipeline
