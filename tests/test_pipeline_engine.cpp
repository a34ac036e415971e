// Pipeline x data parallelism with the ZeRO engine on every stage
// (include/zero/pipeline_engine.hpp): the example GPT cut into P = 2 stages, each stage's layers
// wrapped by zero::initialize at ZeRO stage 0 or 1 over its data-parallel group (D = 1 or 2; the
// mesh's pp x dp, 2 or 4 gloo ranks as threads), micro-batches = gradient_accumulation_steps,
// gradients clipped by the global norm. The reference is independent: the whole model in one
// process with plain autograd, the same torch optimizer and torch's clip_grad_norm_ over all its
// parameters, on the whole global batch in one backward. Losses per step within 1e-5 relative on
// every rank, and every parameter afterwards within 1e-5 (AdamW: or twice what single-process
// gradient accumulation itself differs from the whole batch, as test_pipeline_runtime.cpp
// explains), for GPipe and 1F1B, SGD with momentum and AdamW, tied and untied head; GPipe and 1F1B
// agree with each other; under fp16 an overflow on one stage skips the step on every stage.
// Interleaved 1F1B (2 model chunks per stage, one engine per stage over both chunks) against the
// same reference, with the clipping norm over every chunk of every stage, also with every chunk's
// blocks recomputed in backward (pipeline.activation_checkpoint_interval 1). Checkpoints per
// stage: test_pipeline_engine_checkpoint.cpp.
#include <gtest/gtest.h>
#include <torch/nn/utils/clip_grad.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>

#include <ATen/CPUGeneratorImpl.h>

#include <cmath>
#include <limits>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "comm/mesh.hpp"
#include "support/fake_device.hpp"
#include "support/pipeline_engine_case.hpp"
#include "support/pipeline_gpt.hpp"
#include "support/thread_group.hpp"
#include "support/tp_compare.hpp"
#include "zero/models/gpt.hpp"
#include "zero/models/gpt_layers.hpp"
#include "zero/pipeline/schedule.hpp"
#include "zero/pipeline_engine.hpp"

namespace zero::pipeline {
namespace {

using models::Gpt;
using models::GptConfig;

using namespace engine_test;  // NOLINT: the shared set-up (support/pipeline_engine_case.hpp)

std::unique_ptr<torch::optim::Optimizer> torch_opt(Opt o, std::vector<at::Tensor> params) {
  if (o == Opt::SGD)
    return std::make_unique<torch::optim::SGD>(std::move(params),
                                               torch::optim::SGDOptions(0.1).momentum(0.9));
  return std::make_unique<torch::optim::AdamW>(std::move(params),
                                               torch::optim::AdamWOptions(1e-2).weight_decay(0.1));
}

using zero::testing::load;
using zero::testing::snapshot;

struct Trained {
  std::vector<float> losses;
  Params params;
  std::vector<double> norms;
};

// The whole model in one process: `accumulate` micro-batches one after another (1: the whole
// batch in one backward), the global norm clipped by torch, one torch optimizer.
Trained reference(const GptConfig& c, const Params& init, const std::vector<Batch>& batches, Opt o,
                  int accumulate) {
  Gpt model(c);
  load(model, init);
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
  int stages, dp;
  ScheduleKind schedule;
  Opt opt;
  int zero_stage;
  bool tied;
  int checkpoint_interval = 0;  // pipeline.activation_checkpoint_interval
  bool fake_device = false;     // world rank r on the fake accelerator's device r
  int virtual_stages = 1;       // pipeline.virtual_stages (the interleaved schedule)
};

std::string name(const Case& k) {
  return "P=" + std::to_string(k.stages) + " x D=" + std::to_string(k.dp) + " " +
         std::string(schedule_name(k.schedule)) +
         (k.virtual_stages > 1 ? " v=" + std::to_string(k.virtual_stages) : "") + " " +
         (k.opt == Opt::SGD ? "SGD" : "AdamW") +
         " ZeRO-" + std::to_string(k.zero_stage) + (k.tied ? " tied" : " untied") +
         (k.checkpoint_interval ? " recompute " + std::to_string(k.checkpoint_interval) : "") +
         (k.fake_device ? " fake device" : "");
}

struct Trial {
  std::vector<std::vector<float>> losses;  // per world rank
  std::vector<Params> params;              // per world rank: its stage's parameters
  std::vector<double> norms;               // world rank 0's engine, per step
};

Trial run_case(const Case& k, const GptConfig& c, const Params& init,
               const std::vector<Batch>& batches) {
  const int world = k.stages * k.dp;
  Trial run;
  run.losses.resize(world);
  run.params.resize(world);
  const c10::DeviceType type =
      k.fake_device ? testing::fake::device().type() : c10::DeviceType::CPU;
  testing::run_ranks(
      world,
      [&](std::shared_ptr<comm::Group> w) {
        comm::Mesh mesh = comm::Mesh::megatron(w, /*tp=*/1, /*pp=*/k.stages);
        const int rank = w->rank(), d = mesh.coord("dp");
        Gpt model(c);  // every rank's copy starts from the reference's weights
        load(model, init);
        const c10::Device device = k.fake_device ? testing::fake::device(rank) : c10::kCPU;
        model->to(device);
        auto layers = models::gpt_pipeline_layers(model);
        Config cfg = engine_config(k.opt, k.zero_stage, k.stages, k.schedule);
        cfg.pipeline.activation_checkpoint_interval = k.checkpoint_interval;
        if (k.virtual_stages > 1)
          cfg.pipeline.virtual_stages = k.virtual_stages;
        PipelineEngine pipe(layers, models::gpt_loss, cfg, mesh["pp"], mesh["dp"]);
        ASSERT_EQ(pipe.stage(), mesh.coord("pp"));
        ASSERT_EQ(pipe.engine().world_size(), k.dp);
        ASSERT_EQ(pipe.virtual_stages(), k.virtual_stages);
        ASSERT_EQ(pipe.micro_batches(), kMicroBatches);
        std::set<const void*> mine;  // this stage's layers' parameters (a tied copy included)
        for (int c = 0; c < k.virtual_stages; ++c) {
          const int vs = c * k.stages + pipe.stage();
          for (int i = pipe.bounds()[vs]; i < pipe.bounds()[vs + 1]; ++i)
            for (const auto& p : layers[i].module->parameters())
              mine.insert(p.unsafeGetTensorImpl());
        }
        const int64_t rows = kMicroBatches * kRowsPerMicroBatch;
        for (const auto& b : batches) {
          std::vector<at::Tensor> in, tg;
          for (const auto& t : b.inputs.narrow(0, d * rows, rows).chunk(kMicroBatches, 0))
            in.push_back(t.to(device));
          for (const auto& t : b.targets.narrow(0, d * rows, rows).chunk(kMicroBatches, 0))
            tg.push_back(t.to(device));
          run.losses[rank].push_back(pipe.train_batch(in, tg).item<float>());
          ASSERT_TRUE(pipe.last_step_applied());
          // Settled: on an accelerator stats() has the step's norm only after the next step.
          if (rank == 0) run.norms.push_back(pipe.engine().settled_stats().last_grad_norm);
        }
        for (const auto& p : model->named_parameters())
          if (mine.count(p.value().unsafeGetTensorImpl())) {
            EXPECT_EQ(p.value().device(), device) << p.key();
            run.params[rank][p.key()] = p.value().detach().cpu().clone();
          }
      },
      std::chrono::seconds(60), type);
  return run;
}

void check(const Case& k) {
  SCOPED_TRACE(name(k));
  GptConfig c = models::gpt_preset("tiny");
  c.tied = k.tied;
  at::manual_seed(1234);  // the main thread's draw of the initial weights, before any rank runs
  const Params init = snapshot(Gpt(c));
  const auto batches = make_batches(c, k.dp * kMicroBatches * kRowsPerMicroBatch);
  const Trained ref = reference(c, init, batches, k.opt, 1);
  const Trained acc = reference(c, init, batches, k.opt, k.dp * kMicroBatches);
  const Trial run = run_case(k, c, init, batches);

  std::set<std::string> covered;
  for (size_t r = 0; r < run.losses.size(); ++r) {
    ASSERT_EQ(run.losses[r].size(), ref.losses.size());
    for (size_t i = 0; i < ref.losses.size(); ++i)
      EXPECT_NEAR(run.losses[r][i], ref.losses[i], kTol * std::abs(ref.losses[i]))
          << "rank " << r << " step " << i;
    for (const auto& [key, t] : run.params[r]) {
      double tol = kTol;
      if (k.opt == Opt::AdamW)
        tol = std::max(tol, 2 * testing::max_rel_err(acc.params.at(key), ref.params.at(key)));
      testing::expect_rel_close(t, ref.params.at(key), tol,
                                "rank " + std::to_string(r) + " " + key);
      covered.insert(key);
    }
  }
  EXPECT_EQ(covered.size(), ref.params.size()) << "some parameter is on no stage";
  // The engine clipped by the global norm over both stages (the reference's, before clipping).
  for (size_t i = 0; i < ref.norms.size(); ++i)
    EXPECT_NEAR(run.norms[i], ref.norms[i], kTol * ref.norms[i]) << "step " << i;
  EXPECT_GT(ref.norms.front(), kClip) << "the test should clip";
  std::printf("  %s: losses %.6f .. %.6f (reference %.6f .. %.6f), norm %.4f (reference %.4f)\n",
              name(k).c_str(), run.losses[0].front(), run.losses[0].back(), ref.losses.front(),
              ref.losses.back(), run.norms.front(), ref.norms.front());
}

TEST(PipelineEngine, TwoStagesMatchSingleProcessTraining) {
  for (auto schedule : {ScheduleKind::GPipe, ScheduleKind::OneFOneB})
    for (auto opt : {Opt::SGD, Opt::AdamW}) check({2, 1, schedule, opt, 1, false});
}

TEST(PipelineEngine, TwoStagesTimesTwoReplicasMatchSingleProcessTraining) {
  for (auto schedule : {ScheduleKind::GPipe, ScheduleKind::OneFOneB})
    for (auto opt : {Opt::SGD, Opt::AdamW}) check({2, 2, schedule, opt, 1, false});
}

// The tied embedding and head on the first and last stage: one weight, trained by the first
// stage with the last stage's gradient added in, the last stage's copy following it; ZeRO-0.
TEST(PipelineEngine, TiedEmbeddingAndHeadAcrossStages) {
  for (auto opt : {Opt::SGD, Opt::AdamW}) {
    check({2, 2, ScheduleKind::OneFOneB, opt, 1, true});
    check({2, 1, ScheduleKind::GPipe, opt, 0, true});
  }
}

// Every rank on its own device of the fake accelerator (its groups staging through the host as
// for any non-CPU device, so a host tensor handed to one is refused as NCCL refuses it): the
// stages' engines, the runtime's buffers, the norm over dp then pp, the tied weight's exchange.
// SGD: AdamW magnifies the fake device's roundings (test_pipeline_runtime.cpp says more).
TEST(PipelineEngine, StagesOnAnAcceleratorMatchSingleProcessTraining) {
  check({2, 2, ScheduleKind::OneFOneB, Opt::SGD, 1, /*tied=*/true, 0, /*fake_device=*/true});
  check({2, 1, ScheduleKind::GPipe, Opt::SGD, 0, /*tied=*/false, 0, /*fake_device=*/true});
}

// pipeline.activation_checkpoint_interval: each stage recomputes runs of layers in backward
// (nested backward passes inside the engine's), with the same result.
TEST(PipelineEngine, ActivationCheckpointingPerStage) {
  check({2, 2, ScheduleKind::OneFOneB, Opt::SGD, 1, false, 1});
  check({2, 1, ScheduleKind::GPipe, Opt::AdamW, 1, true, 2});
}

// Interleaved: each stage's engine trains its 2 chunks (the tiny preset's 4 layers, one per
// chunk; the embedding on stage 0's chunk 0, the head on stage 1's chunk 1), its window m x v
// chunk backward passes, the norm over both chunks of both stages; D = 1 and 2, tied and untied.
TEST(PipelineEngine, InterleavedMatchesSingleProcessTraining) {
  for (auto opt : {Opt::SGD, Opt::AdamW}) {
    Case k{2, 1, ScheduleKind::Interleaved, opt, 1, false};
    k.virtual_stages = 2;
    check(k);
    k.dp = 2;
    k.tied = true;
    check(k);
  }
  Case z{2, 2, ScheduleKind::Interleaved, Opt::AdamW, 0, false};
  z.virtual_stages = 2;
  check(z);
}

// GPipe and 1F1B run the same micro-batches in another order: the same training.
TEST(PipelineEngine, GPipeEqualsOneFOneB) {
  GptConfig c = models::gpt_preset("tiny");
  at::manual_seed(1234);
  const Params init = snapshot(Gpt(c));
  const auto batches = make_batches(c, 2 * kMicroBatches * kRowsPerMicroBatch);
  const Trial g = run_case({2, 2, ScheduleKind::GPipe, Opt::SGD, 1, false}, c, init, batches);
  const Trial f = run_case({2, 2, ScheduleKind::OneFOneB, Opt::SGD, 1, false}, c, init, batches);
  for (size_t r = 0; r < g.losses.size(); ++r) {
    for (size_t i = 0; i < g.losses[r].size(); ++i)
      EXPECT_NEAR(g.losses[r][i], f.losses[r][i], 1e-6 * std::abs(f.losses[r][i]));
    for (const auto& [key, t] : g.params[r])
      testing::expect_rel_close(t, f.params[r].at(key), 1e-6, key);
  }
}

// fp16: the overflow check reads the global norm (summed over dp, then over the stages), so an
// overflow on one stage skips the step on every stage. The first stage's gradients are poisoned
// (inf) on the first step only: every rank skips that step, the last stage's parameters are
// untouched by it, and the next steps are applied everywhere.
// On the fake accelerator too: there the engine's step() returns before the verdict reaches the
// host, and last_step_applied() must wait for it.
TEST(PipelineEngine, Fp16OverflowOnOneStageSkipsTheStepOnEveryStage) {
  for (bool fake : {false, true}) {
    SCOPED_TRACE(fake ? "fake device" : "host");
    GptConfig c = models::gpt_preset("tiny");
    at::manual_seed(1234);
    const Params init = snapshot(Gpt(c));
    const auto batches = make_batches(c, 2 * kMicroBatches * kRowsPerMicroBatch);
    std::vector<std::vector<int>> applied(4);
    std::vector<int64_t> skipped(4);
    std::vector<double> max_change_after_skip(4);
    testing::run_ranks(
        4,
        [&](std::shared_ptr<comm::Group> w) {
          comm::Mesh mesh = comm::Mesh::megatron(w, 1, 2);
          const int rank = w->rank(), d = mesh.coord("dp");
          Gpt model(c);
          load(model, init);
          const c10::Device device = fake ? testing::fake::device(rank) : c10::kCPU;
          model->to(device);
          auto layers = models::gpt_pipeline_layers(model);
          bool poison = true;
          auto embed = layers[0].forward;
          layers[0].forward = [embed, &poison](const at::Tensor& t) {
            at::Tensor y = embed(t);
            if (poison)
              y.register_hook(
                  [](const at::Tensor& g) { return g * std::numeric_limits<float>::infinity(); });
            return y;
          };
          Config cfg = engine_config(Opt::SGD, 1, 2, ScheduleKind::OneFOneB);
          cfg.fp16.enabled = true;
          PipelineEngine pipe(layers, models::gpt_loss, cfg, mesh["pp"], mesh["dp"]);
          const int64_t rows = kMicroBatches * kRowsPerMicroBatch;
          for (const auto& b : batches) {
            const Params before = snapshot(model);
            std::vector<at::Tensor> in, tg;
            for (const auto& t : b.inputs.narrow(0, d * rows, rows).chunk(kMicroBatches, 0))
              in.push_back(t.to(device));
            for (const auto& t : b.targets.narrow(0, d * rows, rows).chunk(kMicroBatches, 0))
              tg.push_back(t.to(device));
            const float loss = pipe.train_batch(in, tg).item<float>();
            EXPECT_TRUE(std::isfinite(loss));
            applied[rank].push_back(pipe.last_step_applied());
            if (poison) {
              double change = 0;
              for (const auto& [key, t] : snapshot(model))
                change = std::max(
                    change,
                    (t.to(at::kFloat) - before.at(key).to(at::kFloat)).abs().max().item<double>());
              max_change_after_skip[rank] = change;
            }
            poison = false;
          }
          skipped[rank] = pipe.engine().settled_stats().skipped_steps;
        },
        std::chrono::seconds(60), fake ? testing::fake::device().type() : c10::DeviceType::CPU);
    for (int r = 0; r < 4; ++r) {
      SCOPED_TRACE("rank " + std::to_string(r));
      EXPECT_EQ(applied[r], (std::vector<int>{0, 1, 1, 1}));
      EXPECT_EQ(skipped[r], 1);
      EXPECT_EQ(max_change_after_skip[r], 0.0) << "the skipped step moved a parameter";
    }
  }
}

// Interleaved with recomputation (pipeline.activation_checkpoint_interval 1): every block of every
// chunk is recomputed inside the stage's backward passes (nested backward passes the engine's
// walk of the graph cannot see into), and each chunk's pass delivers only its own chunk's
// gradients. The tiny GPT at P = 2 x v = 2: stage 1 holds block 0 and the head, both recomputed,
// so its two kinds of pass look alike to the walk; the engine learns each chunk's counts from
// that chunk's first pass (zero::PassKind). Before, the first pass's counts (the head's chunk)
// were applied to block 0's chunk, whose buckets were then reduced before its gradients came.
TEST(PipelineEngine, InterleavedWithRecomputationMatchesSingleProcessTraining) {
  for (auto opt : {Opt::SGD, Opt::AdamW}) {
    Case k{2, 1, ScheduleKind::Interleaved, opt, 1, false, /*checkpoint_interval=*/1};
    k.virtual_stages = 2;
    check(k);
  }
  Case t{2, 2, ScheduleKind::Interleaved, Opt::AdamW, 1, /*tied=*/true, 1};
  t.virtual_stages = 2;
  check(t);
}

// The key where it was kept before PipelineConfig had the field: refused, not ignored (one
// chunk per stage would run).
TEST(PipelineEngine, InterleavedRefusesTheOldVirtualStagesKey) {
  GptConfig c = models::gpt_preset("tiny");
  testing::run_ranks(2, [&](std::shared_ptr<comm::Group> w) {
    comm::Mesh mesh = comm::Mesh::megatron(w, 1, 2);
    Gpt model(c);
    Config legacy = engine_config(Opt::SGD, 1, 2, ScheduleKind::Interleaved);
    legacy.extra["pipeline.virtual_stages"] = "2";
    try {
      PipelineEngine(models::gpt_pipeline_layers(model), models::gpt_loss, legacy, mesh["pp"],
                     mesh["dp"]);
      ADD_FAILURE() << "Config::extra's pipeline.virtual_stages ignored";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find("set cfg.pipeline.virtual_stages"), std::string::npos)
          << e.what();
    }
  });
}

TEST(PipelineEngine, RefusesZeroStageTwoAndAMismatchedStageCount) {
  GptConfig c = models::gpt_preset("tiny");
  testing::run_ranks(2, [&](std::shared_ptr<comm::Group> w) {
    comm::Mesh mesh = comm::Mesh::megatron(w, 1, 2);
    Gpt model(c);
    Config cfg = engine_config(Opt::SGD, 2, 2, ScheduleKind::OneFOneB);
    try {
      PipelineEngine(models::gpt_pipeline_layers(model), models::gpt_loss, cfg, mesh["pp"],
                     mesh["dp"]);
      ADD_FAILURE() << "ZeRO-2 accepted";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find("zero_optimization.stage 2"), std::string::npos);
    }
    cfg = engine_config(Opt::SGD, 1, 4, ScheduleKind::OneFOneB);
    try {
      PipelineEngine(models::gpt_pipeline_layers(model), models::gpt_loss, cfg, mesh["pp"],
                     mesh["dp"]);
      ADD_FAILURE() << "4 stages on a pipeline group of 2 accepted";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find("pipeline.stages is 4"), std::string::npos);
    }
  });
}

// PipelineEngine's `device`: the model built on the host, only the stage's layers reach its
// device (review 2026-12-05, finding 14: zero-train put the whole model on every stage's GPU).
// On the fake accelerator, P = 2 x D = 1: the other stage's parameters stay on the host, the
// device holds exactly the model's bytes less theirs (and less the rotary tables, which reach
// the device at the first forward, in the activations' dtype), and training gives the very
// losses of the run whose whole model was moved to each stage's device, SGD and AdamW, fp32 and
// bf16.
TEST(PipelineEngine, OnlyTheStagesLayersReachItsDevice) {
  GptConfig c = models::gpt_preset("tiny");
  at::manual_seed(1234);
  const Params init = snapshot(Gpt(c));
  const auto batches = make_batches(c, kMicroBatches * kRowsPerMicroBatch);
  for (const auto& [o, bf16] :
       {std::pair{Opt::SGD, false}, std::pair{Opt::AdamW, false}, std::pair{Opt::AdamW, true}}) {
    SCOPED_TRACE(std::string(o == Opt::SGD ? "SGD" : "AdamW") + (bf16 ? " bf16" : ""));
    std::vector<std::vector<float>> whole(2), staged(2);
    std::vector<int64_t> whole_bytes(2), staged_bytes(2), host_bytes(2);
    testing::run_ranks(
        2,
        [&](std::shared_ptr<comm::Group> w) {
          const int r = w->rank();
          comm::Mesh mesh = comm::Mesh::megatron(w, 1, 2);
          const c10::Device device = testing::fake::device(r);
          Config cfg = engine_config(o, 1, 2, ScheduleKind::OneFOneB);
          cfg.bf16 = bf16;  // the rotary tables then reach the device as bf16
          auto train = [&](PipelineEngine& pipe, std::vector<float>& out) {
            train_on(pipe, batches, 0, 3, device, out);
          };
          {
            Gpt model(c);
            load(model, init);
            const int64_t before = testing::fake::allocated_bytes(r);
            model->to(device);
            PipelineEngine pipe(models::gpt_pipeline_layers(model), models::gpt_loss, cfg,
                                mesh["pp"], mesh["dp"]);
            whole_bytes[r] = testing::fake::allocated_bytes(r) - before;
            train(pipe, whole[r]);
          }
          Gpt model(c);
          load(model, init);
          const int64_t before = testing::fake::allocated_bytes(r);
          PipelineEngine pipe(models::gpt_pipeline_layers(model), models::gpt_loss, cfg, mesh["pp"],
                              mesh["dp"], device);
          staged_bytes[r] = testing::fake::allocated_bytes(r) - before;
          // What stayed on the host: the other stage's layers, and the tables.
          std::set<const void*> seen;
          auto count = [&](const at::Tensor& t) {
            if (!seen.insert(t.unsafeGetTensorImpl()).second) return;
            if (t.device().is_cpu()) host_bytes[r] += t.numel() * t.element_size();
          };
          for (const auto& p : model->parameters()) count(p);
          for (const auto& b : model->buffers()) count(b);
          for (const auto& p : pipe.engine().module()->parameters()) {
            EXPECT_EQ(p.device(), device) << "a parameter of this stage";
          }
          train(pipe, staged[r]);
        },
        std::chrono::seconds(60), testing::fake::device().type());
    for (int r = 0; r < 2; ++r) {
      SCOPED_TRACE("rank " + std::to_string(r));
      ASSERT_EQ(staged[r].size(), 3u);
      EXPECT_EQ(staged[r], whole[r]);
      EXPECT_GT(host_bytes[r], 0) << "the other stage's layers stayed on the host";
      EXPECT_EQ(staged_bytes[r], whole_bytes[r] - host_bytes[r]);
    }
  }
}

}  // namespace
}  // namespace zero::pipeline
