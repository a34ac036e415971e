// Stop, save and resume agreed over the whole world (every data-parallel, tensor-parallel and
// pipeline rank), not within one data-parallel group (examples/launcher_check.hpp,
// examples/checkpoint_agreement.hpp; real gloo groups, ranks as threads):
// - tensor-parallel peers that see their launcher's death at different steps stop at the same
//   step; agreed within each data-parallel group only (as the trainer did), rank 0's group stops
//   while rank 1's trains on into a tensor-parallel all-reduce rank 0 never joins (a collective
//   timeout instead of a stop);
// - a save cut short after tensor-parallel rank 0 published its part (tp0/latest names step2,
//   tp1 never wrote step2) resumes both ranks from step1, the model bit-equal to the one saved
//   there; before, each rank picked the tag from its own directory (tp0 step2, which tp1 lacks);
// - the same for pipeline stages (stage1/step2 missing): every stage resumes from step1, where
//   before stage0/latest's step2 was taken and stage 1's files were missing.
#include <gtest/gtest.h>

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "checkpoint_agreement.hpp"
#include "comm/group.hpp"
#include "comm/mesh.hpp"
#include "launcher_check.hpp"
#include "support/thread_group.hpp"
#include "support/token_batch.hpp"
#include "zero/checkpoint_io.hpp"
#include "zero/engine.hpp"
#include "zero/models/gpt.hpp"
#include "zero/models/gpt_layers.hpp"
#include "zero/models/tp_gpt.hpp"
#include "zero/pipeline_engine.hpp"
#include "zero/tensor_parallel.hpp"

namespace zero::testing {
namespace {
namespace fs = std::filesystem;
using examples::LauncherCheck;

struct TempDir {
  static inline std::atomic<int> counter{0};
  std::string path =
      (fs::temp_directory_path() /
       ("zero_world_agree_" + std::to_string(::getpid()) + "_" + std::to_string(counter++)))
          .string();
  ~TempDir() { fs::remove_all(path); }
};

// tp 2 x dp 2 over 4 ranks (tensor parallel innermost: tp groups {0, 1}, {2, 3}; dp groups
// {0, 2}, {1, 3}). Each step is a tensor-parallel all-reduce (a parallel layer's) and a launcher
// check. Rank 0 sees its launcher gone from step `flip0`, its tensor-parallel peer rank 1 from
// `flip1`, ranks 2 and 3 never. Returns the step each rank stopped at (-1: trained to the end).
struct StopCase {
  int64_t steps_per_print;
  double budget_s;
  int64_t flip0, flip1;
  int64_t expected;  // the first check at or after flip0
};

std::vector<int64_t> stop_steps(const StopCase& c) {
  std::vector<int64_t> stopped(4, -1);
  run_ranks(
      4,
      [&](std::shared_ptr<comm::Group> world) {
        const auto groups = tensor_parallel::make_groups(world, 2);
        const int r = world->rank();
        const int64_t flip = r == 0 ? c.flip0 : r == 1 ? c.flip1 : int64_t{1} << 40;
        int64_t step = 0;
        LauncherCheck check(c.budget_s, c.steps_per_print, world, c10::Device(c10::kCPU),
                            [&] { return step >= flip; });
        for (step = 1; step <= 30; ++step) {
          tensor_parallel::reduce_from_region(at::ones({4}), groups.tp);
          std::this_thread::sleep_for(std::chrono::milliseconds(2));
          if (check.launcher_gone(step, step % c.steps_per_print == 0)) {
            stopped[r] = step;
            return;
          }
        }
      },
      std::chrono::seconds(10));
  return stopped;
}

TEST(LauncherStop, TensorParallelPeersSeeingTheDeathAtDifferentStepsStopTogether) {
  // A check every step (2 ms steps, a budget of 0.1 ms), and one every 5 steps (the print
  // steps: a budget that fits thousands of steps).
  for (const StopCase& c : {StopCase{1000, 1e-4, 3, 8, 3}, StopCase{5, 10.0, 2, 7, 5}}) {
    const std::vector<int64_t> got = stop_steps(c);
    for (int r = 0; r < 4; ++r)
      EXPECT_EQ(got[r], c.expected) << "rank " << r << " (launcher seen gone from step "
                                    << (r == 0   ? c.flip0
                                        : r == 1 ? c.flip1
                                                 : -1)
                                    << ")";
  }
}

// --- resume after a save cut short -------------------------------------------------------------

constexpr int64_t kRows = 4, kSeq = 16;

Config tp_config() {
  Config cfg;
  cfg.zero_optimization.stage = 1;
  cfg.train_micro_batch_size_per_gpu = kRows;
  cfg.gradient_accumulation_steps = 1;
  cfg.gradient_clipping = 0;
  cfg.optimizer.type = "AdamW";
  cfg.optimizer.lr = 1e-3;
  return cfg;
}

struct TpRank {
  tensor_parallel::Groups groups;
  models::TpGpt model{nullptr};
  std::optional<Engine> engine;
  std::string dir;
};

TpRank tp_rank(const std::shared_ptr<comm::Group>& world, const models::Gpt& init,
               const std::string& root) {
  TpRank t;
  t.groups = tensor_parallel::make_groups(world, 2);
  t.model = models::TpGpt(t.groups.tp, tiny_gpt(kSeq));
  t.model->load_full(*init);
  Groups g{t.groups.dp};
  g.parts = tensor_parallel::checkpoint_parts(t.model->placements(), *t.groups.tp);
  t.engine.emplace(initialize(t.model.ptr(), tp_config(), g));
  t.dir = root + "/tp" + std::to_string(t.groups.tp_rank());
  return t;
}

void train_step(TpRank& t, int step) {
  const TokenBatch b = token_batch(500 + step, kRows, kSeq, tiny_gpt(kSeq).vocab);
  at::Tensor loss = t.model->loss(b.tokens, b.targets);
  t.engine->backward(loss);
  ASSERT_TRUE(t.engine->step());
}

std::map<std::string, at::Tensor> full(const TpRank& t) {
  std::map<std::string, at::Tensor> out;
  for (auto& [k, v] : t.model->gather_full()) out[k] = v;
  return out;
}

TEST(ResumeAgreement, ASaveCutShortAfterTp0ResumesEveryTensorParallelRankFromTheOlderStep) {
  models::Gpt init(tiny_gpt(kSeq));
  TempDir root;
  std::map<std::string, at::Tensor> at_step1;
  run_ranks(2, [&](std::shared_ptr<comm::Group> world) {
    TpRank t = tp_rank(world, init, root.path);
    auto save = [&] {
      examples::save_over_world([&] { t.engine->save_checkpoint(t.dir, "", 0); },
                                [&] {
                                  if (t.engine->rank() == 0)
                                    prune_checkpoints(t.dir, /*keep_last=*/1);
                                },
                                c10::Device(c10::kCPU), world);
    };
    train_step(t, 0);
    save();
    auto f = full(t);
    if (world->rank() == 0) at_step1 = std::move(f);
    train_step(t, 1);
    // The save of step 2 is cut short: tp0 published its part, tp1 was killed before writing.
    if (t.groups.tp_rank() == 0) t.engine->save_checkpoint(t.dir, "", 0);
  });
  ASSERT_EQ(latest_checkpoint_tag(root.path + "/tp0"), "step2");
  ASSERT_EQ(latest_checkpoint_tag(root.path + "/tp1"), "step1");
  ASSERT_TRUE(checkpoint_complete(root.path + "/tp0", "step1")) << "pruned before tp1 saved";
  EXPECT_EQ(newest_common_checkpoint({root.path + "/tp0", root.path + "/tp1"}), "step1");

  std::vector<std::string> tags(2);
  std::vector<int64_t> steps(2, -1);
  std::string note;
  run_ranks(2, [&](std::shared_ptr<comm::Group> world) {
    TpRank t = tp_rank(world, init, root.path);
    const examples::ResumePoint p =
        examples::agree_resume_point(root.path, "", t.dir, c10::Device(c10::kCPU), world);
    tags[world->rank()] = t.engine->load_checkpoint(p.dirs, p.tag);
    steps[world->rank()] = t.engine->stats().optimizer_steps;
    auto f = full(t);
    if (world->rank() != 0) return;
    note = p.note;
    ASSERT_EQ(f.size(), at_step1.size());
    for (const auto& [name, v] : at_step1) EXPECT_TRUE(at::equal(f.at(name), v)) << name;
  });
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(tags[r], "step1") << "rank " << r;
    EXPECT_EQ(steps[r], 1) << "rank " << r;
  }
  EXPECT_NE(note.find("tp0/latest names step2"), std::string::npos) << note;
}

Config pp_config() {
  Config c;
  c.zero_optimization.stage = 1;
  c.train_micro_batch_size_per_gpu = 2;
  c.gradient_accumulation_steps = 2;
  c.gradient_clipping = 0;
  c.optimizer.type = "SGD";
  c.optimizer.lr = 0.1;
  c.pipeline.stages = 2;
  return c;
}

TEST(ResumeAgreement, ASaveCutShortAfterStage0ResumesEveryStageFromTheOlderStep) {
  const models::GptConfig shape = tiny_gpt(kSeq);
  models::Gpt init(shape);
  TempDir root;
  std::vector<at::Tensor> at_step1(2);
  auto make = [&](const std::shared_ptr<comm::Group>& world) {
    comm::Mesh mesh = comm::Mesh::megatron(world, 1, 2);
    models::Gpt model(shape);
    {
      at::NoGradGuard g;
      auto src = init->named_parameters();
      for (auto& p : model->named_parameters()) p.value().copy_(src[p.key()]);
    }
    return std::make_unique<pipeline::PipelineEngine>(
        models::gpt_pipeline_layers(model), models::gpt_loss, pp_config(), mesh["pp"], mesh["dp"]);
  };
  run_ranks(2, [&](std::shared_ptr<comm::Group> world) {
    auto pipe = make(world);
    for (int step = 0; step < 2; ++step) {
      std::vector<at::Tensor> in, out;
      for (int m = 0; m < 2; ++m) {
        const TokenBatch b = token_batch(900 + 2 * step + m, 2, kSeq, shape.vocab);
        in.push_back(b.tokens);
        out.push_back(b.targets);
      }
      pipe->train_batch(in, out);
      if (step == 1) {
        // The save of step 2, cut short: what save_over_world does first (each stage publishes
        // its part); the pruning after it never runs. Stage 1's part is removed below.
        pipe->save_checkpoint(root.path, "", 0);
        break;
      }
      examples::save_over_world([&] { pipe->save_checkpoint(root.path, "", 0); },
                                [&] { prune_checkpoints(pipe->stage_dir(root.path), 1); },
                                c10::Device(c10::kCPU), world);
      at_step1[pipe->stage()] = pipe->engine().flat_parameters().clone();
    }
  });
  // What a kill after stage 0 published step2 and before stage 1 did leaves.
  fs::remove_all(root.path + "/stage1/step2");
  { std::ofstream(root.path + "/stage1/latest") << "step1\n"; }
  ASSERT_EQ(latest_checkpoint_tag(root.path + "/stage0"), "step2");
  ASSERT_TRUE(checkpoint_complete(root.path + "/stage0", "step1")) << "pruned before stage 1 saved";

  std::vector<std::string> tags(2);
  std::vector<int64_t> steps(2, -1);
  std::vector<bool> same(2, false);
  std::string note;
  run_ranks(2, [&](std::shared_ptr<comm::Group> world) {
    auto pipe = make(world);
    std::string n;
    const std::string tag =
        examples::agree_pipeline_resume_tag(root.path, "", &n, c10::Device(c10::kCPU), world);
    const int s = pipe->stage();
    tags[s] = pipe->load_checkpoint(root.path, tag);
    steps[s] = pipe->engine().stats().optimizer_steps;
    same[s] = at::equal(pipe->engine().flat_parameters(), at_step1[s]);
    if (s == 0) note = n;
  });
  for (int s = 0; s < 2; ++s) {
    EXPECT_EQ(tags[s], "step1") << "stage " << s;
    EXPECT_EQ(steps[s], 1) << "stage " << s;
    EXPECT_TRUE(same[s]) << "stage " << s << "'s parameters are not the ones saved at step 1";
  }
  EXPECT_NE(note.find("stage0/latest names step2"), std::string::npos) << note;
}

}  // namespace
}  // namespace zero::testing
