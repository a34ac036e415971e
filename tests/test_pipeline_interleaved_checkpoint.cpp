// Checkpoints under the interleaved schedule (issue 34; PipelineEngine::save_checkpoint /
// load_checkpoint, include/zero/pipeline_engine.hpp): a stage's v model chunks are saved by its
// one engine into dir/stage<s>/, their parameters named by global layer index, and pipeline.json
// records P, v and the P x v chunk bounds. The example GPT (6 layers: embedding, 4 blocks, tied
// head) trains 4 steps at layout a, saving after step 2 (the uninterrupted run); a fresh
// pipeline at layout b, built from other weights, loads that save and trains steps 3-4.
//
// Against the uninterrupted run: at the same P, v and D the resumed losses and parameters are
// the same bits; at another layout (interleaved P2 v2 -> 1F1B P2, -> P1, -> P2 v3; 1F1B P2 ->
// interleaved) the losses within 1e-6 relative (the same arithmetic up to the norm's summation
// order over other stages). Against an independent reference, the whole model in one process
// (torch autograd, clip_grad_norm_, the torch optimizer; support/gpt_reference.hpp), every
// loss and every parameter within 1e-5, SGD with momentum and AdamW. The save consolidated
// (read_consolidated over pipeline_save_dirs, what zero-consolidate reads) is the saving run's
// model bit for bit, and each stage's files hold its own chunks' layers only, one shard file per
// data-parallel rank of each stage (no file written by two ranks). Once loaded, before any step,
// every rank holds the saved model bit for bit, the tied embedding / head weight on its owner
// and on the last stage's copy alike (interleaved -> 1F1B and back included).
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
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

constexpr double kTol = 1e-5;   // against the single-process reference
constexpr double kSame = 1e-6;  // resumed at another layout against the uninterrupted run
constexpr double kClip = 0.5;
constexpr double kEps = 1e-6;  // AdamW's (test_pipeline_checkpoint.cpp says why)
constexpr int kSteps = 4, kSaveAt = 2, kRows = 2, kGlobalRows = 16, kSeq = 16, kLayers = 6;

using Opt = zero::testing::RefOpt;

struct Layout {
  int stages, dp, v = 1;  // v > 1: the interleaved schedule with v chunks per stage
};

std::string text(const Layout& l) {
  return "P" + std::to_string(l.stages) + (l.v > 1 ? " v" + std::to_string(l.v) : " 1f1b") +
         " x D" + std::to_string(l.dp);
}

Config engine_config(Opt o, const Layout& l) {
  Config c;
  c.zero_optimization.stage = 1;
  c.train_micro_batch_size_per_gpu = kRows;
  c.gradient_accumulation_steps = kGlobalRows / (kRows * l.dp);
  c.gradient_clipping = kClip;
  zero::testing::set_optimizer(c, o);
  c.optimizer.eps = kEps;
  c.pipeline.stages = l.stages;
  if (l.v > 1) {
    c.pipeline.schedule = "interleaved";
    c.pipeline.virtual_stages = l.v;
  }
  return c;
}

GptConfig model_config() {
  GptConfig c = models::gpt_preset("tiny");
  c.layers = kLayers - 2;
  c.tied = true;
  return c;
}

using Batch = zero::testing::StepBatch;
using Params = zero::testing::GptParams;
using zero::testing::load;
using zero::testing::snapshot;

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

struct Run {
  std::map<int, float> losses;  // by step, world rank 0's (every rank's is checked equal)
  Params at_save, end;          // the whole model, from every stage's ranks
  std::vector<Params> after_load;  // per world rank: its stage's parameters once loaded
};

// Steps [from, to) at `l` from weights `init` (after loading `dir` when `resume`), saving into
// `dir` after step `save_at` (when > 0).
Run train(const GptConfig& c, Opt o, const Layout& l, const Params& init,
          const std::vector<Batch>& batches, int from, int to, const std::string& dir, bool resume,
          int save_at) {
  const int world = l.stages * l.dp;
  std::vector<std::vector<float>> losses(world);
  std::vector<Params> at_save(world), end(world), after_load(world);
  testing::run_ranks(world, [&](std::shared_ptr<comm::Group> w) {
    comm::Mesh mesh = comm::Mesh::megatron(w, /*tp=*/1, /*pp=*/l.stages);
    const int rank = w->rank(), d = mesh.coord("dp");
    Gpt model(c);
    load(model, init);
    auto layers = models::gpt_pipeline_layers(model);
    PipelineEngine pipe(layers, models::gpt_loss, engine_config(o, l), mesh["pp"], mesh["dp"]);
    ASSERT_EQ(pipe.virtual_stages(), l.v);
    if (resume) {
      EXPECT_EQ(pipe.load_checkpoint(dir), "step" + std::to_string(kSaveAt));
      EXPECT_EQ(pipe.engine().stats().optimizer_steps, kSaveAt);
    }
    std::set<const void*> mine;  // this stage's chunks' parameters (a tied copy included)
    for (int k = 0; k < l.v; ++k) {
      const int vs = k * l.stages + pipe.stage();
      for (int i = pipe.bounds()[vs]; i < pipe.bounds()[vs + 1]; ++i)
        for (const auto& p : layers[i].module->parameters()) mine.insert(p.unsafeGetTensorImpl());
    }
    auto keep = [&](Params& into) {
      for (const auto& p : model->named_parameters())
        if (mine.count(p.value().unsafeGetTensorImpl())) into[p.key()] = p.value().detach().clone();
    };
    if (resume) keep(after_load[rank]);
    const int64_t rows = kGlobalRows / l.dp, m = pipe.micro_batches();
    for (int i = from; i < to; ++i) {
      const auto& b = batches[i];
      losses[rank].push_back(pipe.train_batch(b.inputs.narrow(0, d * rows, rows).chunk(m, 0),
                                              b.targets.narrow(0, d * rows, rows).chunk(m, 0))
                                 .item<float>());
      if (i + 1 == save_at) {
        pipe.save_checkpoint(dir);
        keep(at_save[rank]);
      }
    }
    keep(end[rank]);
  });
  Run out;
  out.after_load = after_load;
  for (int r = 0; r < world; ++r) {
    EXPECT_EQ(losses[r], losses[0]) << "rank " << r << " reports another loss";
    for (const auto& [k, t] : at_save[r]) out.at_save[k] = t;
    for (const auto& [k, t] : end[r]) out.end[k] = t;
  }
  for (size_t i = 0; i < losses[0].size(); ++i)
    out.losses[from + static_cast<int>(i)] = losses[0][i];
  return out;
}

struct Dir {
  std::string path;
  explicit Dir(const std::string& what)
      : path((fs::temp_directory_path() /
              ("zero_pp_interleaved_" + what + "_" + std::to_string(::getpid())))
                 .string()) {
    fs::remove_all(path);
  }
  ~Dir() { fs::remove_all(path); }
};

// The save in `dir` of a run at `a` whose model at the save was `at_save`: its layout as
// recorded, each stage's files its chunks' layers only and one shard per data-parallel rank,
// and the consolidated model the saving run's, bit for bit.
void check_save(const std::string& dir, const Layout& a, const Params& at_save) {
  const PipelineSaveLayout saved = read_pipeline_save(dir);
  EXPECT_EQ(saved.stages, a.stages);
  EXPECT_EQ(saved.virtual_stages, a.v);
  ASSERT_EQ(saved.bounds.size(), static_cast<size_t>(a.stages * a.v + 1));
  EXPECT_EQ(saved.bounds.back(), kLayers);
  const std::string tag = "step" + std::to_string(kSaveAt);
  std::set<std::string> shards;
  for (int s = 0; s < a.stages; ++s) {
    const std::string stage = dir + "/stage" + std::to_string(s);
    std::set<int> held;  // layers of this stage's chunks
    for (int k = 0; k < a.v; ++k)
      for (int i = saved.bounds[k * a.stages + s]; i < saved.bounds[k * a.stages + s + 1]; ++i)
        held.insert(i);
    for (const CheckpointParam& p : read_checkpoint_info(stage, tag).params)
      EXPECT_TRUE(held.count(std::stoi(p.name.substr(0, p.name.find('.')))))
          << stage << " holds " << p.name << ", a layer of another stage's chunk";
    for (const auto& f : fs::directory_iterator(stage + "/" + tag)) {
      const std::string name = f.path().filename().string();
      if (name.rfind("shard_rank", 0) == 0) EXPECT_TRUE(shards.insert(stage + "/" + name).second);
    }
    for (int d = 0; d < a.dp; ++d)
      EXPECT_TRUE(fs::exists(stage + "/" + tag + "/shard_rank" + std::to_string(d) + "_of_" +
                             std::to_string(a.dp) + ".bin"))
          << stage << " data-parallel rank " << d;
  }
  EXPECT_EQ(shards.size(), static_cast<size_t>(a.stages * a.dp));
  Params consolidated;
  for (auto& [key, t] : read_consolidated(pipeline_save_dirs(dir, saved), saved.tag)) {
    const std::string plain = models::gpt_name_of_layer_param(key, kLayers);
    ASSERT_FALSE(plain.empty()) << key;
    consolidated[plain] = t;
  }
  ASSERT_EQ(consolidated.size(), at_save.size());
  for (const auto& [key, t] : at_save) {
    ASSERT_TRUE(consolidated.count(key)) << key;
    EXPECT_TRUE(at::equal(consolidated.at(key), t)) << "consolidated " << key;
  }
}

// Saves at `a` after kSaveAt steps of an uninterrupted kSteps run, resumes at `b` from other
// weights: see the file's comment for what must hold.
void check_resume(const Layout& a, const Layout& b, Opt o) {
  const std::string what = text(a) + " -> " + text(b) + (o == Opt::SGD ? " SGD" : " AdamW");
  SCOPED_TRACE(what);
  const GptConfig c = model_config();
  const Params init = draw_weights(c, 1234), other = draw_weights(c, 77);
  const auto batches = zero::testing::step_batches(c.vocab, kSteps, kGlobalRows, kSeq);
  std::vector<int> groups(kSteps, a.dp);
  for (int i = kSaveAt; i < kSteps; ++i) groups[i] = b.dp;
  const Trained ref = reference(c, init, batches, o, groups);
  Dir dir(std::to_string(a.stages) + std::to_string(a.v) + std::to_string(b.stages) +
          std::to_string(b.v));
  const Run whole = train(c, o, a, init, batches, 0, kSteps, dir.path, false, kSaveAt);
  check_save(dir.path, a, whole.at_save);
  const Run resumed = train(c, o, b, other, batches, kSaveAt, kSteps, dir.path, true, 0);

  // Once loaded, before any step: every rank holds the saved model bit for bit, the tied weight
  // (saved once, by its owner) on the owner and on the stage holding its copy alike, whichever
  // schedule and layout saved it and whichever loads it.
  int tied_holders = 0;
  for (size_t r = 0; r < resumed.after_load.size(); ++r) {
    for (const auto& [key, t] : resumed.after_load[r])
      EXPECT_TRUE(at::equal(t, whole.at_save.at(key))) << "rank " << r << " " << key << " loaded";
    tied_holders += resumed.after_load[r].count("embed.weight");
  }
  EXPECT_EQ(tied_holders, b.dp * std::min(b.stages, 2)) << "ranks holding the tied weight";
  const bool exact = a.stages == b.stages && a.v == b.v && a.dp == b.dp;
  double worst_whole = 0, worst_ref = 0;
  for (int step = 0; step < kSteps; ++step) {
    const double want = ref.losses[step];
    EXPECT_NEAR(whole.losses.at(step), want, kTol * want) << "uninterrupted, step " << step;
    if (step < kSaveAt) continue;
    const double got = resumed.losses.at(step), straight = whole.losses.at(step);
    if (exact) EXPECT_EQ(resumed.losses.at(step), whole.losses.at(step)) << "step " << step;
    EXPECT_NEAR(got, straight, kSame * straight) << "step " << step;
    EXPECT_NEAR(got, want, kTol * want) << "step " << step;
    worst_whole = std::max(worst_whole, std::abs(got - straight) / straight);
    worst_ref = std::max(worst_ref, std::abs(got - want) / want);
  }
  ASSERT_EQ(resumed.end.size(), ref.params.size()) << "some parameter is on no stage";
  double worst_param = 0;
  for (const auto& [key, t] : resumed.end) {
    if (exact) EXPECT_TRUE(at::equal(t, whole.end.at(key))) << key;
    testing::expect_rel_close(t, ref.params.at(key), kTol, key);
    worst_param = std::max(worst_param, testing::max_rel_err(t, ref.params.at(key)));
  }
  std::printf(
      "  %s: steps 3-4 loss %.7f %.7f; rel. diff to the uninterrupted run %.1e%s, to the "
      "reference %.1e (parameters %.1e)\n",
      what.c_str(), resumed.losses.at(kSaveAt), resumed.losses.at(kSteps - 1), worst_whole,
      exact ? " (bitwise)" : "", worst_ref, worst_param);
}

TEST(PipelineInterleavedCheckpoint, ResumesBitwiseAtTheSameLayout) {
  for (Opt o : {Opt::SGD, Opt::AdamW}) check_resume({2, 1, 2}, {2, 1, 2}, o);
  check_resume({2, 2, 2}, {2, 2, 2}, Opt::AdamW);
}

TEST(PipelineInterleavedCheckpoint, AnInterleavedSaveResumesUnderOneFOneB) {
  for (Opt o : {Opt::SGD, Opt::AdamW}) check_resume({2, 1, 2}, {2, 1, 1}, o);
}

TEST(PipelineInterleavedCheckpoint, AnInterleavedSaveResumesOnOneStage) {
  for (Opt o : {Opt::SGD, Opt::AdamW}) check_resume({2, 1, 2}, {1, 1, 1}, o);
}

// A 1F1B save resumed interleaved; an interleaved save at another v and another D.
TEST(PipelineInterleavedCheckpoint, ResumesInterleavedFromOtherLayouts) {
  check_resume({2, 1, 1}, {2, 1, 2}, Opt::AdamW);
  check_resume({2, 1, 2}, {2, 1, 3}, Opt::SGD);
  check_resume({2, 2, 2}, {2, 1, 2}, Opt::AdamW);
}

}  // namespace
}  // namespace zero::pipeline
