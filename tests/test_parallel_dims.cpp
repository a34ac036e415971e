// The public topology (zero/parallel_dims.hpp): ParallelDims's validation and the messages a user
// reads; the mesh's groups against Megatron-LM's rank formula on real gloo ranks; the older views
// (tensor_parallel::make_groups, pipeline::make_pipeline_grid) holding the same groups;
// initialize(model, cfg, mesh) training the tensor-parallel example GPT at dp 2 x tp 2 like
// single-process training of the unsplit model (torch::optim, clip_grad_norm_) and exactly like
// the Groups path zero-train uses; and initialize(model, cfg) refusing autotp_size or
// pipeline.stages > 1 with the call to use.
#include <gtest/gtest.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/utils/clip_grad.h>
#include <torch/optim/sgd.h>
#include <torch/utils.h>

#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

#include "comm/group.hpp"
#include "support/thread_group.hpp"
#include "support/token_batch.hpp"
#include "support/tp_compare.hpp"
#include "tp_trainer.hpp"
#include "zero/config.hpp"
#include "zero/engine.hpp"
#include "zero/models/gpt.hpp"
#include "zero/models/tp_gpt.hpp"
#include "zero/parallel_dims.hpp"
#include "zero/pipeline_engine.hpp"
#include "zero/tensor_parallel.hpp"

namespace zero::testing {
namespace {

std::string resolve_error(const ParallelDims& d, int world) {
  try {
    d.resolved(world);
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "";
}

#define EXPECT_HAS(text, part) \
  EXPECT_NE(std::string(text).find(part), std::string::npos) << "in: " << (text)

TEST(ParallelDims, ResolvesDpFromTheWorld) {
  const ParallelDims d = ParallelDims{0, 2, 2, false}.resolved(8);
  EXPECT_EQ(d.dp, 2);
  EXPECT_EQ(d.world_size(), 8);
  EXPECT_EQ(d.describe(), "pp 2 x dp 2 x tp 2");
  EXPECT_EQ(ParallelDims{}.resolved(3).dp, 3);  // data parallel alone
  EXPECT_EQ((ParallelDims{3, 1, 1, false}.resolved(3).dp), 3);
  EXPECT_EQ((ParallelDims{0, 2, 1, true}.resolved(4).dp), 2);
}

TEST(ParallelDims, BadProductsNameTheDimsAndTheFix) {
  // tp x pp does not divide the world.
  const std::string e1 = resolve_error({0, 3, 1, false}, 8);
  EXPECT_HAS(e1, "zero::ParallelDims{dp 0 x tp 3 x pp 1} on 8 ranks");
  EXPECT_HAS(e1, "tp x pp = 3 does not divide the world size 8");
  EXPECT_HAS(e1, "or launch a multiple of 3 ranks");
  const std::string e2 = resolve_error({0, 2, 3, false}, 8);
  EXPECT_HAS(e2, "tp x pp = 6 does not divide the world size 8");
  // dp given, and the product is not the world.
  const std::string e3 = resolve_error({3, 2, 1, false}, 8);
  EXPECT_HAS(e3, "dp x tp x pp = 6 is not the world size 8");
  EXPECT_HAS(e3, "set dp = 4 (or 0: whatever tp and pp leave), or launch 6 ranks");
}

TEST(ParallelDims, ZeroAndNegativeDimsNameTheKey) {
  EXPECT_HAS(resolve_error({0, 0, 1, false}, 4),
             "tp (tensor_parallel.autotp_size) must be >= 1; 1 means no tensor parallelism");
  EXPECT_HAS(resolve_error({0, 1, 0, false}, 4),
             "pp (pipeline.stages) must be >= 1; 1 means no pipeline parallelism");
  EXPECT_HAS(resolve_error({-1, 1, 1, false}, 4), "dp must be >= 1, or 0 for whatever");
  EXPECT_HAS(resolve_error({0, 1, 1, true}, 4),
             "sp (tensor_parallel.sequence_parallel) splits the sequence over the "
             "tensor-parallel ranks and needs tp > 1");
}

TEST(ParallelDims, FromConfigReadsTheKeys) {
  Config cfg;
  cfg.tensor_parallel.autotp_size = 2;
  cfg.tensor_parallel.sequence_parallel = true;
  cfg.pipeline.stages = 4;
  const ParallelDims d = ParallelDims::from_config(cfg);
  EXPECT_EQ(d.dp, 0);
  EXPECT_EQ(d.tp, 2);
  EXPECT_EQ(d.pp, 4);
  EXPECT_TRUE(d.sp);
}

// The groups of pp 2 x dp 2 x tp 2 over 8 gloo ranks, against Megatron's formula
// rank = tp_rank + tp * (dp_rank + dp * pp_rank), and the older views built from the same dims.
TEST(ParallelDims, MeshGroupsFollowMegatronsOrder) {
  run_ranks(8, [](std::shared_ptr<comm::Group> world) {
    const int r = world->rank();
    const int tp_rank = r % 2, dp_rank = (r / 2) % 2, pp_rank = r / 4;
    auto rank_of = [](int t, int d, int p) { return t + 2 * (d + 2 * p); };
    const Mesh mesh = ParallelDims{0, 2, 2, false}.build_mesh(world);
    EXPECT_EQ(mesh.describe(), "pp 2 x dp 2 x tp 2");
    ASSERT_EQ(mesh.tp->size(), 2);
    ASSERT_EQ(mesh.dp->size(), 2);
    ASSERT_EQ(mesh.pp->size(), 2);
    EXPECT_EQ(mesh.tp_rank(), tp_rank);
    EXPECT_EQ(mesh.dp_rank(), dp_rank);
    EXPECT_EQ(mesh.pp_rank(), pp_rank);
    for (int i = 0; i < 2; ++i) {
      EXPECT_EQ(mesh.tp->global_rank(i), rank_of(i, dp_rank, pp_rank));
      EXPECT_EQ(mesh.dp->global_rank(i), rank_of(tp_rank, i, pp_rank));
      EXPECT_EQ(mesh.pp->global_rank(i), rank_of(tp_rank, dp_rank, i));
    }
    // The deprecated grid is a view of the same layout.
    const pipeline::PipelineGrid grid = pipeline::make_pipeline_grid(world, 2, 2);
    EXPECT_EQ(grid.stage, pp_rank);
    EXPECT_EQ(grid.dp_rank, dp_rank);
    EXPECT_EQ(grid.tp_rank, tp_rank);
    EXPECT_EQ(grid.tp->global_rank(1 - tp_rank), rank_of(1 - tp_rank, dp_rank, pp_rank));
    // The groups move data: a sum over each is the sum of its members' world ranks.
    at::Tensor t = at::full({1}, static_cast<double>(r), at::kDouble);
    comm::of(mesh.dp)->all_reduce_sum(t, "test dp").wait();
    EXPECT_EQ(t.item<double>(), rank_of(tp_rank, 0, pp_rank) + rank_of(tp_rank, 1, pp_rank));
  });
}

TEST(ParallelDims, BuildMeshThrowsTheSameOnEveryRank) {
  std::mutex mu;
  std::vector<std::string> errors;
  run_ranks(4, [&](std::shared_ptr<comm::Group> world) {
    try {
      ParallelDims{0, 3, 1, false}.build_mesh(world);
    } catch (const std::invalid_argument& e) {
      std::lock_guard<std::mutex> lock(mu);
      errors.push_back(e.what());
    }
  });
  ASSERT_EQ(errors.size(), 4u);
  for (const auto& e : errors) EXPECT_HAS(e, "tp x pp = 3 does not divide the world size 4");
}

// ---- initialize(model, cfg) refuses what needs a mesh --------------------------------------

std::string initialize_error(Config cfg) {
  torch::nn::Linear model(4, 2);
  try {
    initialize(model, std::move(cfg));
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

TEST(InitializeWithoutMesh, RefusesTensorParallelism) {
  Config cfg;
  cfg.tensor_parallel.autotp_size = 2;
  const std::string e = initialize_error(cfg);
  EXPECT_HAS(e, "tensor_parallel.autotp_size = 2: zero::initialize(model, cfg) trains "
                "data-parallel only");
  EXPECT_HAS(e, "zero::initialize(model, cfg, mesh)");
  EXPECT_HAS(e, "zero::ParallelDims::from_config(cfg).build_mesh(world)");
}

TEST(InitializeWithoutMesh, RefusesPipelineStages) {
  Config cfg;
  cfg.pipeline.stages = 2;
  const std::string e = initialize_error(cfg);
  EXPECT_HAS(e, "pipeline.stages = 2: zero::initialize(model, cfg) does not cut a model");
  EXPECT_HAS(e, "zero::pipeline::PipelineEngine(layers, loss, cfg, mesh)");
}

// A model with tensor-parallel layers handed one group: it would train, each tp rank clipping by
// its own shard's norm. Every rank refuses, naming the layer and the mesh call; a layer over a
// tp group of one rank is not split, and passes.
TEST(InitializeWithOneGroup, RefusesATensorParallelModel) {
  std::mutex mu;
  std::vector<std::string> errors;
  run_ranks(4, [&](std::shared_ptr<comm::Group> world) {
    const Mesh mesh = ParallelDims{0, 2, 1, false}.build_mesh(world);
    torch::nn::Sequential model(
        tensor_parallel::ColumnParallelLinear(
            mesh.tp, tensor_parallel::ColumnParallelLinearOptions(4, 8).gather_output(false)),
        tensor_parallel::RowParallelLinear(
            mesh.tp, tensor_parallel::RowParallelLinearOptions(8, 4).input_is_parallel(true)));
    std::string e;
    try {
      initialize(model.ptr(), Config{}, mesh.dp);
    } catch (const ConfigError& x) {
      e = x.what();
    }
    std::lock_guard<std::mutex> lock(mu);
    errors.push_back(e);
  });
  ASSERT_EQ(errors.size(), 4u);
  for (const auto& e : errors) {
    EXPECT_HAS(e, "zero::initialize(model, cfg, group): model.0 (");
    EXPECT_HAS(e, "is a tensor-parallel layer split over 2 ranks");
    EXPECT_HAS(e, "Call zero::initialize(model, cfg, mesh)");
  }
}

TEST(InitializeWithOneGroup, AcceptsTensorParallelLayersOverOneRank) {
  auto single = comm::Group::single();
  torch::nn::Sequential model(tensor_parallel::ColumnParallelLinear(
      single, tensor_parallel::ColumnParallelLinearOptions(4, 8)));
  Engine e = initialize(model.ptr(), Config{}, single);
  EXPECT_EQ(e.world_size(), 1);
}

TEST(InitializeWithMesh, RefusesADisagreeingConfigAndPipelineStages) {
  std::mutex mu;
  std::vector<std::string> errors;
  run_ranks(4, [&](std::shared_ptr<comm::Group> world) {
    auto note = [&](const std::function<void()>& f) {
      try {
        f();
        std::lock_guard<std::mutex> lock(mu);
        errors.push_back("");
      } catch (const ConfigError& e) {
        std::lock_guard<std::mutex> lock(mu);
        if (world->rank() == 0) errors.push_back(e.what());
      }
    };
    const Mesh tp2 = ParallelDims{0, 2, 1, false}.build_mesh(world);
    torch::nn::Linear model(4, 2);
    Config cfg;
    cfg.tensor_parallel.autotp_size = 4;
    note([&] { initialize(model, cfg, tp2); });
    const Mesh pp2 = ParallelDims{0, 1, 2, false}.build_mesh(world);
    note([&] { initialize(model, Config{}, pp2); });
  });
  ASSERT_EQ(errors.size(), 2u);  // rank 0's two messages; no rank went on
  EXPECT_HAS(errors[0], "tensor_parallel.autotp_size = 4 but the mesh is pp 1 x dp 2 x tp 2");
  EXPECT_HAS(errors[1], "zero::pipeline::PipelineEngine(layers, loss, cfg, mesh)");
}

// bf16 casts the module in place; compute_dtype() says to what (the dtype of the inputs).
TEST(InitializeWithoutMesh, Bf16CastsTheModuleToComputeDtype) {
  torch::nn::Linear model(4, 2);
  Config cfg;
  cfg.bf16 = true;
  Engine e = initialize(model.ptr(), cfg, comm::Group::single());
  EXPECT_EQ(e.compute_dtype(), at::kBFloat16);
  EXPECT_EQ(model->weight.scalar_type(), at::kBFloat16);
  EXPECT_EQ(model->forward(at::ones({3, 4}).to(e.compute_dtype())).scalar_type(), at::kBFloat16);
  torch::nn::Linear plain(4, 2);
  EXPECT_EQ(initialize(plain.ptr(), Config{}, comm::Group::single()).compute_dtype(), at::kFloat);
}

// ---- initialize(model, cfg, mesh) trains like the unsplit model ----------------------------

constexpr int kSteps = 4;
constexpr int64_t kBatch = 4, kSeq = 16;
constexpr double kLr = 0.5, kClip = 0.05, kTol = 1e-5;

models::Gpt initial_model() {
  at::manual_seed(33);  // in the main thread, before any rank thread
  models::Gpt gpt(tiny_gpt(kSeq));
  at::Generator gen = at::detail::createCPUGenerator(33);
  torch::NoGradGuard no_grad;
  // Norm weights away from 1, so that a norm's gradient counted twice would show.
  for (auto& p : gpt->named_parameters())
    if (p.key().find("norm") != std::string::npos)
      p.value().copy_(1 + 0.1 * at::randn(p.value().sizes(), gen));
  return gpt;
}

TokenBatch batch(int step) { return token_batch(700 + step, kBatch, kSeq, tiny_gpt(kSeq).vocab); }

struct TrainRun {
  std::vector<double> losses, norms;
  std::map<std::string, at::Tensor> params;
};

// The reference: the unsplit model in one process, SGD, clip_grad_norm_ at kClip.
TrainRun train_plain(const models::Gpt& init) {
  models::Gpt gpt(tiny_gpt(kSeq));
  {
    torch::NoGradGuard no_grad;
    auto src = init->named_parameters();
    for (auto& p : gpt->named_parameters()) p.value().copy_(src[p.key()]);
  }
  torch::optim::SGD opt(gpt->parameters(), torch::optim::SGDOptions(kLr));
  TrainRun run;
  for (int step = 0; step < kSteps; ++step) {
    const TokenBatch b = batch(step);
    opt.zero_grad();
    at::Tensor loss = gpt->loss(b.tokens, b.targets);
    loss.backward();
    run.norms.push_back(torch::nn::utils::clip_grad_norm_(gpt->parameters(), kClip));
    EXPECT_GT(run.norms.back(), kClip) << "kClip must clip every step";
    opt.step();
    run.losses.push_back(loss.item<double>());
  }
  for (const auto& p : gpt->named_parameters()) run.params[p.key()] = p.value().detach().clone();
  return run;
}

// dp 2 x tp 2 with sequence parallelism, ZeRO-2, clipping and accumulation 2: `mesh_path` through
// initialize(model, cfg, mesh), else through the Groups zero-train builds
// (tensor_parallel::make_groups, examples::engine_groups).
TrainRun train_engine(const models::Gpt& init, bool mesh_path) {
  constexpr int kDp = 2, kAccum = 2;
  Config cfg;
  cfg.zero_optimization.stage = 2;
  cfg.train_micro_batch_size_per_gpu = kBatch / (kDp * kAccum);
  cfg.gradient_accumulation_steps = kAccum;
  cfg.gradient_clipping = kClip;
  cfg.optimizer.type = "SGD";
  cfg.optimizer.lr = kLr;
  cfg.optimizer.weight_decay = 0;
  cfg.tensor_parallel.autotp_size = 2;
  cfg.tensor_parallel.sequence_parallel = true;
  TrainRun out;
  run_ranks(4, [&](std::shared_ptr<comm::Group> world) {
    std::shared_ptr<Group> tp;
    int dp_rank = 0;
    std::optional<Engine> engine;
    models::TpGpt model{nullptr};
    if (mesh_path) {
      const Mesh mesh = ParallelDims::from_config(cfg).build_mesh(world);
      model = models::TpGpt(mesh.tp, tiny_gpt(kSeq), true);
      model->load_full(*init);
      engine.emplace(initialize(model, cfg, mesh));
      dp_rank = mesh.dp_rank();
    } else {
      const auto groups = tensor_parallel::make_groups(world, 2);
      model = models::TpGpt(groups.tp, tiny_gpt(kSeq), true);
      model->load_full(*init);
      engine.emplace(
          initialize(model.ptr(), cfg, examples::engine_groups(groups, model->placements())));
      dp_rank = groups.dp_rank();
    }
    EXPECT_EQ(engine->world_size(), kDp);
    TrainRun run;
    const int64_t rows = kBatch / (kDp * kAccum);
    for (int step = 0; step < kSteps; ++step) {
      const TokenBatch b = batch(step);
      double loss = 0;
      for (int micro = 0; micro < kAccum; ++micro) {
        const int64_t first = (dp_rank * kAccum + micro) * rows;
        at::Tensor l =
            model->loss(b.tokens.narrow(0, first, rows), b.targets.narrow(0, first, rows));
        loss += engine->all_reduce_mean(l.item<double>()) / kAccum;
        engine->backward(l);
        EXPECT_EQ(engine->step(), micro == kAccum - 1);
      }
      run.losses.push_back(loss);
      run.norms.push_back(engine->settled_stats().last_grad_norm);
    }
    const auto full = model->gather_full();  // a collective over tp
    if (world->rank() != 0) return;
    for (const auto& [name, value] : full) run.params[name] = value.to(at::kFloat);
    out = std::move(run);
  });
  return out;
}

TEST(InitializeWithMesh, Dp2Tp2TrainsLikeTheUnsplitModelAndTheGroupsPath) {
  const models::Gpt init = initial_model();
  const TrainRun ref = train_plain(init);
  const TrainRun mesh = train_engine(init, /*mesh_path=*/true);
  const TrainRun groups = train_engine(init, /*mesh_path=*/false);
  ASSERT_EQ(mesh.losses.size(), static_cast<size_t>(kSteps));
  for (int s = 0; s < kSteps; ++s) {
    EXPECT_NEAR(mesh.losses[s], ref.losses[s], kTol * ref.losses[s]) << "step " << s;
    EXPECT_NEAR(mesh.norms[s], ref.norms[s], kTol * ref.norms[s]) << "step " << s;
    // The same groups, the same arithmetic: the two paths to the bit.
    EXPECT_EQ(mesh.losses[s], groups.losses[s]) << "step " << s;
    EXPECT_EQ(mesh.norms[s], groups.norms[s]) << "step " << s;
    std::printf("step %d loss %.7f (reference %.7f) grad norm %.7f (reference %.7f)\n", s,
                mesh.losses[s], ref.losses[s], mesh.norms[s], ref.norms[s]);
  }
  ASSERT_EQ(mesh.params.size(), ref.params.size());
  for (const auto& [name, want] : ref.params) {
    expect_rel_close(mesh.params.at(name), want, kTol, "trained " + name, true);
    EXPECT_TRUE(at::equal(mesh.params.at(name), groups.params.at(name))) << name;
  }
}

}  // namespace
}  // namespace zero::testing
