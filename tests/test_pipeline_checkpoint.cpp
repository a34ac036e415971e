// A pipelined checkpoint resumes at another pipeline.stages and data-parallel size
// (PipelineEngine::load_checkpoint, include/zero/pipeline_engine.hpp): the example GPT (6 layers:
// embedding, 4 blocks, head) trained k = 2 steps at P = a x D = a', saved (dir/stage<s>/ with
// pipeline.json), then loaded by a fresh pipeline of P = b x D = b' built from other weights and
// trained 2 more steps. The reference is independent: the whole model in one process, plain
// autograd, torch's clip_grad_norm_ and the same torch optimizer for all 4 steps, each step's
// batch in the same micro-batches and data-parallel groups (reference() says why). Every
// step's loss (before and after the load, every rank) and every parameter afterwards within
// 1e-5 relative, SGD with momentum and AdamW, tied head (its weight saved once, by its owner)
// and untied; P 2 -> 1, 1 -> 2 x D 2, 2 x D 2 -> 4, 4 -> 2. Also: what a load says when a
// stage's parameters are missing, when one stage cannot load, when the save predates
// pipeline.json, and when the model differs (layers, tying).
#include <gtest/gtest.h>

#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "comm/mesh.hpp"
#include "support/gpt_reference.hpp"
#include "support/pipeline_gpt.hpp"
#include "support/thread_group.hpp"
#include "support/tp_compare.hpp"
#include "zero/checkpoint_io.hpp"
#include "zero/models/gpt.hpp"
#include "zero/models/gpt_layers.hpp"
#include "zero/pipeline_engine.hpp"

namespace zero::pipeline {
namespace {

namespace fs = std::filesystem;
using models::Gpt;
using models::GptConfig;

constexpr double kTol = 1e-5;
constexpr double kClip = 0.5;
constexpr double kEps = 1e-6;  // AdamW's (engine_config says why)
// The global batch is the same at every D: kGlobalRows rows, micro-batches of kRows rows,
// kGlobalRows / (kRows * D) micro-batches per data-parallel rank.
constexpr int kSteps = 4, kSaveAt = 2, kRows = 2, kGlobalRows = 16, kSeq = 16;

using Opt = zero::testing::RefOpt;

struct Layout {
  int stages, dp;
  std::string partition = "parameters";  // pipeline.partition
};

std::string text(const Layout& l) {
  return "P=" + std::to_string(l.stages) + " x D=" + std::to_string(l.dp) +
         (l.partition != "parameters" ? " by " + l.partition : "");
}

Config engine_config(Opt o, const Layout& l) {
  Config c;
  c.zero_optimization.stage = 1;
  c.train_micro_batch_size_per_gpu = kRows;
  c.gradient_accumulation_steps = kGlobalRows / (kRows * l.dp);
  c.gradient_clipping = kClip;
  zero::testing::set_optimizer(c, o);
  c.pipeline.stages = l.stages;
  c.pipeline.partition = l.partition;
  // AdamW's first step moves every element by about lr * g / (|g| + eps): an element whose
  // gradient is ~0 (1e-11; the tied embedding has some) moves by a fraction of lr set by
  // rounding, which makes a straight P = 2 x D = 2 run differ from any reference by 5e-5
  // relative at eps 1e-8 (1.4e-6 at 1e-6), with or without a checkpoint in between.
  c.optimizer.eps = kEps;
  return c;
}

GptConfig model_config(bool tied, int blocks = 4, int64_t vocab = 0) {
  GptConfig c = models::gpt_preset("tiny");
  c.layers = blocks;
  c.tied = tied;
  if (vocab > 0) c.vocab = vocab;
  return c;
}

using Batch = zero::testing::StepBatch;
using Params = zero::testing::GptParams;
using zero::testing::load;
using zero::testing::snapshot;

std::vector<Batch> make_batches(const GptConfig& c) {
  return zero::testing::step_batches(c.vocab, kSteps, kGlobalRows, kSeq);
}

using Trained = zero::testing::RefTrained;
using zero::testing::draw_weights;

// The whole model in one process (support/gpt_reference.hpp): each step's batch in
// micro-batches of kRows rows, split into `groups[step]` data-parallel shares accumulated in
// order and averaged; torch's clipping and optimizer.
Trained reference(const GptConfig& c, const Params& init, const std::vector<Batch>& batches, Opt o,
                  const std::vector<int>& groups) {
  return zero::testing::reference_training(c, init, batches, o, groups,
                                           {kRows, kGlobalRows, kClip, kEps});
}

struct Phase {
  std::vector<std::vector<float>> losses;  // per world rank
  std::vector<Params> params;              // per world rank: its stage's layers' parameters
  std::vector<int64_t> steps_after_load;   // per world rank: optimizer_steps once loaded
};

// Steps [from, to) at `l` from weights `init`, after loading `dir` (when `resume`); saves at the
// end (when `save`).
Phase run_phase(const GptConfig& c, Opt o, const Layout& l, const Params& init,
                const std::vector<Batch>& batches, int from, int to, const std::string& dir,
                bool resume, bool save) {
  const int world = l.stages * l.dp;
  Phase out;
  out.losses.resize(world);
  out.params.resize(world);
  out.steps_after_load.resize(world, -1);
  testing::run_ranks(world, [&](std::shared_ptr<comm::Group> w) {
    comm::Mesh mesh = comm::Mesh::megatron(w, /*tp=*/1, /*pp=*/l.stages);
    const int rank = w->rank(), d = mesh.coord("dp");
    Gpt model(c);
    load(model, init);
    auto layers = models::gpt_pipeline_layers(model);
    const Config cfg = engine_config(o, l);
    PipelineEngine pipe(layers, models::gpt_loss, cfg, mesh["pp"], mesh["dp"]);
    if (resume) {
      EXPECT_EQ(pipe.load_checkpoint(dir), "step" + std::to_string(from));
      out.steps_after_load[rank] = pipe.engine().stats().optimizer_steps;
    }
    const int64_t rows = kGlobalRows / l.dp, m = pipe.micro_batches();
    for (int i = from; i < to; ++i) {
      const auto& b = batches[i];
      out.losses[rank].push_back(pipe.train_batch(b.inputs.narrow(0, d * rows, rows).chunk(m, 0),
                                                  b.targets.narrow(0, d * rows, rows).chunk(m, 0))
                                     .item<float>());
    }
    if (save) pipe.save_checkpoint(dir);
    std::set<const void*> mine;  // this stage's layers' parameters (a tied copy included)
    for (int i = pipe.bounds()[pipe.stage()]; i < pipe.bounds()[pipe.stage() + 1]; ++i)
      for (const auto& p : layers[i].module->parameters()) mine.insert(p.unsafeGetTensorImpl());
    for (const auto& p : model->named_parameters())
      if (mine.count(p.value().unsafeGetTensorImpl()))
        out.params[rank][p.key()] = p.value().detach().clone();
  });
  return out;
}

std::string fresh_dir(const std::string& what) {
  const std::string dir =
      (fs::temp_directory_path() / ("zero_pp_reshard_" + what + "_" + std::to_string(::getpid())))
          .string();
  fs::remove_all(dir);
  return dir;
}

// Trains kSaveAt steps at `a`, saves, resumes at `b` from other weights for the rest: every
// loss and every parameter as the single-process reference trained for all kSteps.
void check_reshard(const Layout& a, const Layout& b, Opt o, bool tied, int64_t vocab = 0,
                   const std::vector<int>& saved_bounds = {}) {
  const std::string what = text(a) + " -> " + text(b) + (o == Opt::SGD ? " SGD" : " AdamW") +
                           (tied ? " tied" : " untied");
  SCOPED_TRACE(what);
  const GptConfig c = model_config(tied, 4, vocab);
  const Params init = draw_weights(c, 1234), other = draw_weights(c, 77);
  const auto batches = make_batches(c);
  std::vector<int> groups(kSteps, a.dp);
  for (int i = kSaveAt; i < kSteps; ++i) groups[i] = b.dp;
  const Trained ref = reference(c, init, batches, o, groups);
  const std::string dir = fresh_dir(std::to_string(::getpid()));
  const Phase first = run_phase(c, o, a, init, batches, 0, kSaveAt, dir, false, true);
  const Phase second = run_phase(c, o, b, other, batches, kSaveAt, kSteps, dir, true, false);
  const PipelineSaveLayout saved = read_pipeline_save(dir);
  fs::remove_all(dir);
  EXPECT_EQ(saved.stages, a.stages);
  EXPECT_TRUE(saved.recorded);
  if (!saved_bounds.empty()) EXPECT_EQ(saved.bounds, saved_bounds);

  double worst_loss = 0, worst_param = 0;
  auto loss_ok = [&](float got, int step, size_t rank) {
    const double want = ref.losses[step];
    EXPECT_NEAR(got, want, kTol * std::abs(want)) << "rank " << rank << " step " << step;
    worst_loss = std::max(worst_loss, std::abs(got - want) / std::abs(want));
  };
  for (size_t r = 0; r < first.losses.size(); ++r) {
    ASSERT_EQ(first.losses[r].size(), static_cast<size_t>(kSaveAt));
    for (int i = 0; i < kSaveAt; ++i) loss_ok(first.losses[r][i], i, r);
  }
  std::set<std::string> covered;
  for (size_t r = 0; r < second.losses.size(); ++r) {
    EXPECT_EQ(second.steps_after_load[r], kSaveAt) << "rank " << r;
    ASSERT_EQ(second.losses[r].size(), static_cast<size_t>(kSteps - kSaveAt));
    for (int i = kSaveAt; i < kSteps; ++i) loss_ok(second.losses[r][i - kSaveAt], i, r);
    for (const auto& [key, t] : second.params[r]) {
      testing::expect_rel_close(t, ref.params.at(key), kTol,
                                "rank " + std::to_string(r) + " " + key);
      worst_param = std::max(worst_param, testing::max_rel_err(t, ref.params.at(key)));
      covered.insert(key);
    }
  }
  EXPECT_EQ(covered.size(), ref.params.size()) << "some parameter is on no stage";
  std::printf("  %s: losses %.6f .. %.6f, max rel. error loss %.2e, parameters %.2e\n",
              what.c_str(), second.losses[0].front(), second.losses[0].back(), worst_loss,
              worst_param);
}

TEST(PipelineCheckpoint, TwoStagesResumeOnOne) {
  for (Opt o : {Opt::SGD, Opt::AdamW}) check_reshard({2, 1}, {1, 1}, o, /*tied=*/true);
}

TEST(PipelineCheckpoint, OneStageResumesOnTwoTimesTwoReplicas) {
  for (Opt o : {Opt::SGD, Opt::AdamW}) check_reshard({1, 1}, {2, 2}, o, /*tied=*/true);
}

TEST(PipelineCheckpoint, TwoStagesTimesTwoReplicasResumeOnFour) {
  for (Opt o : {Opt::SGD, Opt::AdamW}) check_reshard({2, 2}, {4, 1}, o, /*tied=*/true);
}

TEST(PipelineCheckpoint, FourStagesResumeOnTwoUntied) {
  for (Opt o : {Opt::SGD, Opt::AdamW}) check_reshard({4, 1}, {2, 1}, o, /*tied=*/false);
}

// A save cut by parameters resumed cut by compute, and back: other bounds at the same P. The tiny
// GPT with V = 4096 and 4 blocks: by parameters (262144, 4 x 65664, 262208) 3 | 3 layers; by
// compute (64, 4 x 492288, 1606016 FLOPs per token at s = 128) embed + 4 blocks | the head.
TEST(PipelineCheckpoint, ASaveCutByParametersResumesCutByCompute) {
  check_reshard({2, 1, "parameters"}, {2, 1, "compute"}, Opt::AdamW, /*tied=*/true, 4096,
                {0, 3, 6});
  check_reshard({2, 1, "compute"}, {2, 1, "parameters"}, Opt::SGD, /*tied=*/true, 4096, {0, 5, 6});
}

// A save that does not hold what its pipeline.json says (here: stage 0's of a P = 2 save
// rewritten to claim that one stage held every layer, as a stage directory copied on its own
// would): the loading stage reads the directories that should hold its layers and names the
// first parameter none of them has, and the directories it read.
TEST(PipelineCheckpoint, AMissingParameterIsNamedWithTheDirectoriesRead) {
  const GptConfig c = model_config(true);
  const auto batches = make_batches(c);
  const std::string dir = fresh_dir("missing");
  run_phase(c, Opt::SGD, {2, 1}, draw_weights(c, 1234), batches, 0, 1, dir, false, true);
  const PipelineSaveLayout saved = read_pipeline_save(dir);
  ASSERT_EQ(saved.bounds.size(), 3u);
  const std::string path = dir + "/stage0/step1/pipeline.json";
  std::ifstream in(path);
  std::string json((std::istreambuf_iterator<char>(in)), {});
  for (const auto& [from, to] : std::vector<std::pair<std::string, std::string>>{
           {"\"stages\": 2", "\"stages\": 1"},
           {"[0, " + std::to_string(saved.bounds[1]) + ", 6]", "[0, 6]"}}) {
    const auto at = json.find(from);
    ASSERT_NE(at, std::string::npos) << from << " in " << json;
    json.replace(at, from.size(), to);
  }
  std::ofstream(path) << json;
  const std::string missing = std::to_string(saved.bounds[1]) + ".";  // saved stage 1's first
  testing::run_ranks(1, [&](std::shared_ptr<comm::Group> w) {
    comm::Mesh mesh = comm::Mesh::megatron(w, 1, 1);
    Gpt model(c);
    PipelineEngine pipe(models::gpt_pipeline_layers(model), models::gpt_loss,
                        engine_config(Opt::SGD, {1, 1}), mesh["pp"], mesh["dp"]);
    try {
      pipe.load_checkpoint(dir);
      ADD_FAILURE() << "loaded without layers " << saved.bounds[1] << "..5";
    } catch (const CheckpointError& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find("parameter '" + missing), std::string::npos) << msg;
      EXPECT_NE(msg.find("none of the directories read (" + dir + "/stage0/step1/manifest.json)"),
                std::string::npos)
          << msg;
      std::printf("  %s\n", msg.c_str());
    }
  });
  fs::remove_all(dir);
}

// One stage cannot load (its shard file is gone) while the other can: both throw, the failed
// one naming the file, the other saying that a stage failed, before any tied weight moves (the
// tied head's copy would otherwise wait for the embedding from a stage that sends nothing).
TEST(PipelineCheckpoint, AStageThatCannotLoadStopsEveryStage) {
  const GptConfig c = model_config(true);
  const auto batches = make_batches(c);
  const std::string dir = fresh_dir("stage");
  run_phase(c, Opt::SGD, {2, 1}, draw_weights(c, 1), batches, 0, 1, dir, false, true);
  int removed = 0;
  for (const auto& f : fs::directory_iterator(dir + "/stage1/step1"))
    if (f.path().extension() == ".bin") removed += fs::remove(f.path());
  ASSERT_EQ(removed, 1);
  testing::run_ranks(2, [&](std::shared_ptr<comm::Group> w) {
    comm::Mesh mesh = comm::Mesh::megatron(w, 1, 2);
    Gpt model(c);
    PipelineEngine pipe(models::gpt_pipeline_layers(model), models::gpt_loss,
                        engine_config(Opt::SGD, {2, 1}), mesh["pp"], mesh["dp"]);
    try {
      pipe.load_checkpoint(dir);
      ADD_FAILURE() << "stage " << pipe.stage() << " loaded";
    } catch (const CheckpointError& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find(pipe.stage() == 1 ? dir + "/stage1/step1/shard"
                                           : "pipeline stage 1 could not load its layers"),
                std::string::npos)
          << "stage " << pipe.stage() << ": " << msg;
    }
  });
  fs::remove_all(dir);
}

// A save from before pipeline.json (here: the files removed): it loads at the P that wrote it
// (the stage directories holding the tag), and at another P the error says which P it needs.
TEST(PipelineCheckpoint, ASaveWithoutItsLayoutLoadsAtItsOwnStagesOnly) {
  const GptConfig c = model_config(true);
  const auto batches = make_batches(c);
  const std::string dir = fresh_dir("legacy");
  run_phase(c, Opt::SGD, {2, 1}, draw_weights(c, 1), batches, 0, 1, dir, false, true);
  for (int s = 0; s < 2; ++s)
    ASSERT_TRUE(fs::remove(dir + "/stage" + std::to_string(s) + "/step1/pipeline.json"));
  const PipelineSaveLayout saved = read_pipeline_save(dir);
  EXPECT_FALSE(saved.recorded);
  EXPECT_EQ(saved.stages, 2);
  EXPECT_EQ(saved.tag, "step1");
  for (int stages : {2, 1}) {
    testing::run_ranks(stages, [&](std::shared_ptr<comm::Group> w) {
      comm::Mesh mesh = comm::Mesh::megatron(w, 1, stages);
      Gpt model(c);
      PipelineEngine pipe(models::gpt_pipeline_layers(model), models::gpt_loss,
                          engine_config(Opt::SGD, {stages, 1}), mesh["pp"], mesh["dp"]);
      if (stages == 2) {
        EXPECT_EQ(pipe.load_checkpoint(dir), "step1");
        EXPECT_EQ(pipe.engine().stats().optimizer_steps, 1);
        return;
      }
      try {
        pipe.load_checkpoint(dir);
        ADD_FAILURE() << "a save without its layout loaded at another P";
      } catch (const CheckpointError& e) {
        const std::string msg = e.what();
        EXPECT_NE(msg.find("loads at pipeline.stages 2 only; this run has 1"), std::string::npos)
            << msg;
      }
    });
  }
  fs::remove_all(dir);
}

// Another model: more blocks (the load says how many layers the save holds and how it was cut),
// or a tied head where the save's was untied (at another P too: the stage reading the head's
// layer finds the untied head's weight, which its model does not have).
TEST(PipelineCheckpoint, AnotherModelIsRefused) {
  const GptConfig c = model_config(/*tied=*/false);
  const auto batches = make_batches(c);
  const std::string dir = fresh_dir("model");
  run_phase(c, Opt::SGD, {2, 1}, draw_weights(c, 1), batches, 0, 1, dir, false, true);
  auto refused = [&](const GptConfig& other, const std::vector<std::string>& says) {
    testing::run_ranks(1, [&](std::shared_ptr<comm::Group> w) {
      comm::Mesh mesh = comm::Mesh::megatron(w, 1, 1);
      Gpt model(other);
      PipelineEngine pipe(models::gpt_pipeline_layers(model), models::gpt_loss,
                          engine_config(Opt::SGD, {1, 1}), mesh["pp"], mesh["dp"]);
      try {
        pipe.load_checkpoint(dir);
        ADD_FAILURE() << "loaded into another model";
      } catch (const CheckpointError& e) {
        const std::string msg = e.what();
        for (const auto& s : says) EXPECT_NE(msg.find(s), std::string::npos) << msg;
        std::printf("  %s\n", msg.c_str());
      }
    });
  };
  refused(model_config(false, 6),
          {"holds a model of 6 layers (pipeline.stages 2", "this one has 8"});
  refused(model_config(true), {"parameter '5.head.weight'", "is not in this model"});
  fs::remove_all(dir);
}

}  // namespace
}  // namespace zero::pipeline
