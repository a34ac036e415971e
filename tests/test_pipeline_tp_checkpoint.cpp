// Checkpoints under pipeline x tensor parallelism (PipelineEngine::save_checkpoint, include/zero/
// pipeline_engine.hpp): the tensor-parallel example GPT (models::TpGpt, tied vocabulary-parallel
// embedding and head, or untied) cut into P = 2 stages over T = 2 tensor-parallel ranks trains
// kSteps steps and saves after step kSaveAt (each stage's tensor-parallel rank r into
// dir/stage<s>/tp<r>/, so no two ranks write one file). Resumed from that save:
//   (a) at P2 x T2: every later loss and every final parameter bit-equal to the uninterrupted run;
//   (b) at P1 x T2, (c) at P2 x T1 and (d) at P1 x T2 x D2 (each replica half of every batch,
//       the optimizer states' dp shards cut anew): every loss within 1e-5 relative of the
//       independent reference, the plain models::Gpt trained in one process from the same weights
//       on the same batches (plain autograd, torch's clip_grad_norm_ and SGD with momentum or
//       AdamW), and the final parameters within the tolerances test_pipeline_tensor_parallel.cpp
//       uses.
// The save consolidated (read_consolidated of pipeline_save_dirs, what zero-consolidate reads)
// is the saving run's model bit for bit, under the plain GPT's names, and the reference's weights
// at step kSaveAt within 1e-5 (L2). A stage's tensor-parallel directory missing: the load fails on
// every rank naming it and the fix.
#include <gtest/gtest.h>
#include <torch/nn/utils/clip_grad.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "support/pipeline_gpt.hpp"
#include "support/pipeline_tp_case.hpp"
#include "support/thread_group.hpp"
#include "support/tp_compare.hpp"
#include "zero/checkpoint_io.hpp"
#include "zero/models/gpt.hpp"
#include "zero/models/gpt_layers.hpp"
#include "zero/models/tp_gpt.hpp"
#include "zero/models/tp_gpt_layers.hpp"
#include "zero/pipeline_engine.hpp"

namespace zero::pipeline {
namespace {

namespace fs = std::filesystem;
using models::Gpt;
using models::GptConfig;
using zero::testing::GptParams;

using namespace zero::testing::pipeline_tp;
constexpr int kSaveAt = 2;
constexpr int64_t kRows = kRowsPerMicroBatch * kMicroBatches;

struct TempDir {
  std::string path;
  explicit TempDir(const std::string& what)
      : path((fs::temp_directory_path() /
              ("zero_pp_tp_ckpt_" + what + "_" + std::to_string(::getpid())))
                 .string()) {
    fs::remove_all(path);
  }
  ~TempDir() { fs::remove_all(path); }
};

struct Reference {
  std::vector<double> losses;
  GptParams at_save, end;
};

// The whole plain model in one process, the whole batch in one backward.
Reference reference(const GptConfig& c, const GptParams& init,
                    const std::vector<testing::StepBatch>& batches, Opt o) {
  Gpt model(c);
  testing::load(model, init);
  auto opt = torch_opt(o, model->parameters());
  Reference out;
  for (int step = 0; step < kSteps; ++step) {
    const auto& b = batches[step];
    at::Tensor loss = model->loss(b.inputs, b.targets);
    loss.backward();
    torch::nn::utils::clip_grad_norm_(model->parameters(), kClip);
    opt->step();
    opt->zero_grad();
    out.losses.push_back(loss.item<double>());
    if (step + 1 == kSaveAt) out.at_save = testing::snapshot(model);
  }
  out.end = testing::snapshot(model);
  return out;
}

struct Run {
  std::map<int, double> losses;  // by step: world rank 0's (every rank returns the same loss)
  GptParams end;                 // the whole model at the end, gathered over tp, every stage's
  GptParams at_save;             // the same right after the save
};

// Trains steps [from, kSteps) at P = stages x T = tp x D = dp from `init`, or from the save in
// `load_dir`; saves into `save_dir` after step kSaveAt when it is not empty. Each replica takes
// its 1/D of every batch as kMicroBatches / D micro-batches of the same size.
Run train(const GptConfig& c, const Gpt& init, Opt o, int stages, int tp,
          const std::vector<testing::StepBatch>& batches, int from, const std::string& load_dir,
          const std::string& save_dir, int dp = 1) {
  Run run;
  std::mutex mu;
  const int micro_batches = kMicroBatches / dp;
  const int64_t rows = kRows / dp;
  testing::run_ranks(stages * tp * dp, [&](std::shared_ptr<comm::Group> w) {
    const PipelineGrid grid = make_pipeline_grid(w, stages, tp);
    models::TpGpt model(grid.tp, c);
    model->load_full(*init);
    const auto layers = models::tp_gpt_pipeline_layers(model);
    Config cfg = engine_config(o, stages, tp);
    cfg.gradient_accumulation_steps = micro_batches;
    PipelineEngine pipe(layers, models::tp_gpt_loss(grid.tp), cfg, grid);
    ASSERT_EQ(pipe.engine().world_size(), dp);
    if (!load_dir.empty()) pipe.load_checkpoint(load_dir);
    std::set<const void*> mine;  // this stage's layers' parameters
    for (int i = pipe.bounds()[pipe.stage()]; i < pipe.bounds()[pipe.stage() + 1]; ++i)
      for (const auto& p : layers[i].module->parameters()) mine.insert(p.unsafeGetTensorImpl());
    // Whole tensors of this stage's parameters (a collective over tp), kept by tp rank 0 (of
    // every replica: the same values).
    auto gather = [&](GptParams& into) {
      std::set<std::string> names;
      for (const auto& p : model->named_parameters())
        if (mine.count(p.value().unsafeGetTensorImpl())) names.insert(p.key());
      auto full = model->gather_full();
      if (grid.tp_rank != 0) return;
      std::lock_guard<std::mutex> lock(mu);
      for (auto& [key, t] : full)
        if (names.count(key)) into[key] = t;
    };
    for (int step = from; step < kSteps; ++step) {
      const auto& b = batches[step];
      const int64_t first = grid.dp_rank * rows;
      const at::Tensor loss =
          pipe.train_batch(b.inputs.narrow(0, first, rows).chunk(micro_batches, 0),
                           b.targets.narrow(0, first, rows).chunk(micro_batches, 0));
      ASSERT_TRUE(pipe.last_step_applied());
      if (w->rank() == 0) run.losses[step] = loss.item<double>();
      if (step + 1 == kSaveAt && !save_dir.empty()) {
        pipe.save_checkpoint(save_dir);
        gather(run.at_save);
      }
    }
    gather(run.end);
  });
  return run;
}

void expect_params(const GptParams& got, const GptParams& want, Opt o, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what << ": some parameter is on no stage";
  double worst = 0;
  for (const auto& [key, t] : want) {
    ASSERT_TRUE(got.count(key)) << what << " " << key;
    const at::Tensor& g = got.at(key);
    const double l2 = (g - t).norm().item<double>() / t.norm().item<double>();
    if (o == Opt::SGD) {
      testing::expect_rel_close(g, t, kTol, what + " " + key);
    } else {
      EXPECT_LE(l2, kTol) << what << " " << key << ": L2 relative error";
      EXPECT_LE(testing::max_rel_err(g, t), kAdamMaxTol) << what << " " << key;
    }
    worst = std::max(worst, l2);
  }
  std::printf("  %s: parameters within %.2g (L2, worst tensor)\n", what.c_str(), worst);
}

void check(Opt o, bool tied) {
  const std::string name = std::string(o == Opt::SGD ? "SGD" : "AdamW") + (tied ? "_tied" : "");
  SCOPED_TRACE(name);
  GptConfig c = models::gpt_preset("tiny");
  c.tied = tied;
  at::manual_seed(4321);  // the initial weights, drawn here before any rank runs
  const Gpt init(c);
  const GptParams init_params = testing::snapshot(init);
  const auto batches = testing::step_batches(c.vocab, kSteps, kRows, kSeq);
  const Reference ref = reference(c, init_params, batches, o);
  // Training moves the weights far beyond the tolerances: a resume that loaded nothing (or the
  // wrong blocks) would show.
  double moved = 0;
  for (const auto& [key, t] : ref.at_save)
    moved = std::max(moved, testing::max_rel_err(t, init_params.at(key)));
  ASSERT_GT(moved, 1e-2);

  TempDir dir(name);
  // The uninterrupted P2 x T2 run, saving after step kSaveAt on its way.
  const Run whole = train(c, init, o, 2, 2, batches, 0, "", dir.path);
  for (int step = 0; step < kSteps; ++step)
    EXPECT_NEAR(whole.losses.at(step), ref.losses[step], kTol * ref.losses[step]) << step;
  for (int s = 0; s < 2; ++s)
    for (int r = 0; r < 2; ++r) {
      const std::string sub = dir.path + "/stage" + std::to_string(s) + "/tp" + std::to_string(r);
      EXPECT_TRUE(checkpoint_complete(sub, "step" + std::to_string(kSaveAt))) << sub;
    }
  EXPECT_FALSE(fs::exists(dir.path + "/stage0/latest")) << "a file outside stage<s>/tp<r>/";

  // Consolidated: the saving run's model bit for bit, under the plain GPT's names.
  const PipelineSaveLayout saved = read_pipeline_save(dir.path);
  EXPECT_EQ(saved.stages, 2);
  EXPECT_EQ(saved.tp, 2);
  const std::vector<std::string> dirs = pipeline_save_dirs(dir.path, saved);
  ASSERT_EQ(dirs.size(), 4u);
  EXPECT_EQ(dirs[3], dir.path + "/stage1/tp1");
  GptParams consolidated;
  for (auto& [key, t] : read_consolidated(dirs, saved.tag)) {
    const std::string plain = models::gpt_name_of_layer_param(key, saved.bounds.back());
    ASSERT_FALSE(plain.empty()) << key;
    consolidated[plain] = t;
  }
  ASSERT_EQ(consolidated.size(), whole.at_save.size());
  for (const auto& [key, t] : whole.at_save) {
    ASSERT_TRUE(consolidated.count(key)) << key;
    EXPECT_TRUE(at::equal(consolidated.at(key), t)) << "consolidated " << key;
  }
  expect_params(consolidated, ref.at_save, o, name + " consolidated P2xT2 save vs reference");

  // (a) exact resume.
  const Run exact = train(c, init, o, 2, 2, batches, kSaveAt, dir.path, "");
  for (int step = kSaveAt; step < kSteps; ++step)
    EXPECT_EQ(exact.losses.at(step), whole.losses.at(step)) << "P2xT2 resume, step " << step;
  ASSERT_EQ(exact.end.size(), whole.end.size());
  for (const auto& [key, t] : whole.end)
    EXPECT_TRUE(at::equal(exact.end.at(key), t)) << "P2xT2 resume: " << key;

  // (b), (c), (d) resumed at another P, T and D: the reference's losses.
  for (const auto [stages, tp, dp] :
       {std::tuple{1, 2, 1}, std::tuple{2, 1, 1}, std::tuple{1, 2, 2}}) {
    const std::string what = name + " P2xT2 save resumed at P" + std::to_string(stages) + "xT" +
                             std::to_string(tp) + (dp > 1 ? "xD" + std::to_string(dp) : "");
    const Run other = train(c, init, o, stages, tp, batches, kSaveAt, dir.path, "", dp);
    double worst = 0;
    for (int step = kSaveAt; step < kSteps; ++step) {
      const double got = other.losses.at(step), want = ref.losses[step];
      EXPECT_NEAR(got, want, kTol * want) << what << ", step " << step;
      worst = std::max(worst, std::abs(got - want) / want);
      std::printf("  %s: step %d loss %.7f, uninterrupted %.7f, reference %.7f\n", what.c_str(),
                  step, got, whole.losses.at(step), want);
    }
    std::printf("  %s: worst loss rel err %.2g\n", what.c_str(), worst);
    expect_params(other.end, ref.end, o, what);
  }
}

TEST(PipelineTensorParallelCheckpoint, ResumesExactlyAndAtAnotherPAndTSgd) {
  check(Opt::SGD, /*tied=*/false);
}

TEST(PipelineTensorParallelCheckpoint, ResumesExactlyAndAtAnotherPAndTAdamWTied) {
  check(Opt::AdamW, /*tied=*/true);
}

// A stage's tensor-parallel directory missing from a copied save: every rank fails the load,
// naming the directory and the fix, before any engine reads a shard.
TEST(PipelineTensorParallelCheckpoint, AMissingTensorParallelDirectoryIsNamedOnEveryRank) {
  GptConfig c = models::gpt_preset("tiny");
  at::manual_seed(5);
  const Gpt init(c);
  const auto batches = testing::step_batches(c.vocab, kSteps, kRows, kSeq);
  TempDir dir("missing");
  train(c, init, Opt::SGD, 2, 2, batches, 0, "", dir.path);
  fs::remove_all(dir.path + "/stage1/tp1");
  std::vector<std::string> errors(4);
  testing::run_ranks(4, [&](std::shared_ptr<comm::Group> w) {
    const PipelineGrid grid = make_pipeline_grid(w, 2, 2);
    models::TpGpt model(grid.tp, c);
    PipelineEngine pipe(models::tp_gpt_pipeline_layers(model), models::tp_gpt_loss(grid.tp),
                        engine_config(Opt::SGD, 2, 2), grid);
    try {
      pipe.load_checkpoint(dir.path);
    } catch (const CheckpointError& e) {
      errors[w->rank()] = e.what();
    }
  });
  for (int r = 0; r < 4; ++r) {
    EXPECT_NE(errors[r].find(dir.path + "/stage1/tp1/step" + std::to_string(kSaveAt) + ": missing"),
              std::string::npos)
        << "rank " << r << ": " << errors[r];
    EXPECT_NE(errors[r].find("copy every one of them"), std::string::npos) << errors[r];
  }
}

}  // namespace
}  // namespace zero::pipeline
