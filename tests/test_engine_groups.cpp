// The engine handed its groups (zero::Groups): on a data-parallel group that is a proper
// subgroup of the world, with the gradient norm taken over a further (tensor-parallel) group
// with replicated parameters, and backward(outputs, grad_outputs) beside backward(loss). Each
// against single-process training with plain autograd and torch::optim.
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>
#include <torch/autograd.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/utils/clip_grad.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>

#include <functional>
#include <mutex>
#include <utility>

#include "comm/mesh.hpp"
#include "support/thread_group.hpp"
#include "support/tiny_net.hpp"
#include "zero/engine.hpp"
#include "zero/host_counting.hpp"
#include "zero/tensor_parallel/mappings.hpp"

namespace zero::testing {
namespace {

constexpr int kSteps = 4;

Config sgd(Config c) {
  c.optimizer.type = "SGD";
  c.optimizer.lr = 0.05;
  c.optimizer.momentum = 0.9;
  c.optimizer.weight_decay = 0.01;
  return c;
}

// (a) A 4-rank job split into two 2-rank data-parallel groups; each trains its own model on
// its own data under its own config, side by side, and matches single-process training. The
// ranks other than a group's rank 0 build their model from another seed: only the broadcast
// within the group (not the world's rank 0) gives them the right start.
TEST(EngineGroups, TwoDataParallelSubgroupsTrainIndependently) {
  for (int stage = 0; stage <= 2; ++stage) {
    struct Job {
      Config cfg;
      uint64_t seed;
      int64_t rows;
    };
    // Group 0: AdamW, no accumulation, clipped. Group 1: SGD, another stage, accumulation 2.
    const Job jobs[2] = {{test_config(stage, 24, 1, 0.3), 3, 48},
                         {sgd(test_config((stage + 1) % 3, 8, 2, 0)), 11, 32}};
    at::Tensor refs[2];
    for (int j = 0; j < 2; ++j) {
      refs[j] = train_reference(jobs[j].cfg, kSteps, jobs[j].rows, jobs[j].seed).params;
    }
    std::mutex mu;
    std::vector<at::Tensor> finals(4);
    std::vector<int> sizes(4);
    run_ranks(4, [&](std::shared_ptr<comm::Group> world) {
      const int color = world->rank() / 2;
      auto dp = world->split(color, world->rank(), "dp");
      const Job& job = jobs[color];
      auto net = make_tiny_net(dp->rank() == 0 ? job.seed : job.seed + 100 + world->rank());
      auto engine = initialize(net, job.cfg, Groups{dp, {}});
      const int acc = job.cfg.gradient_accumulation_steps;
      for (int s = 0; s < kSteps; ++s) {
        const Batch global = global_batch(s, job.rows);
        for (int m = 0; m < acc; ++m) {
          Batch b = rank_micro_batch(global, dp->rank(), 2, m, acc);
          engine.backward(mse(net->forward(b.x), b.y));
          engine.step();
        }
      }
      std::lock_guard<std::mutex> lock(mu);
      finals[world->rank()] = engine.flat_parameters();
      sizes[world->rank()] = engine.world_size();
    });
    for (int r = 0; r < 4; ++r) {
      EXPECT_EQ(sizes[r], 2);
      const at::Tensor& ref = refs[r / 2];
      ASSERT_EQ(finals[r].numel(), ref.numel());
      EXPECT_LT((finals[r] - ref).abs().max().item<double>(), 2e-5)
          << "stage " << stage << ", world rank " << r;
    }
    // The two jobs really differ, so matching one's reference is not matching the other's.
    EXPECT_GT((refs[0] - refs[1]).abs().max().item<double>(), 1e-2);
  }
}

// (b) 4 ranks as 2 (dp) x 2 (tp) in Megatron's order. A two-layer model whose first layer is
// replicated across tp and whose head is split by output features (column-parallel, by hand):
// each tp rank holds half of the head's rows. The gradient norm must count the replicated layer
// once and the head's halves both, so clipping equals single-process clipping of the whole.
constexpr int64_t kIn = 6, kHidden = 10, kOut = 4, kRows = 16;

struct MiniNetImpl : torch::nn::Module {
  MiniNetImpl(int64_t out) {
    fc1 = register_module("fc1", torch::nn::Linear(kIn, kHidden));
    head = register_module("head", torch::nn::Linear(kHidden, out));
  }
  torch::nn::Linear fc1{nullptr}, head{nullptr};
};

// The whole model from `seed`, or tp rank `t`'s part of it (rows t x out/tp .. of the head).
std::shared_ptr<MiniNetImpl> make_mini(uint64_t seed, int t = 0, int tp = 1) {
  auto full = std::make_shared<MiniNetImpl>(kOut);
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  at::NoGradGuard g;
  for (auto& p : full->parameters()) p.copy_(at::randn(p.sizes(), gen) * 0.4);
  if (tp == 1) return full;
  const int64_t part = kOut / tp;
  auto net = std::make_shared<MiniNetImpl>(part);
  net->fc1->weight.copy_(full->fc1->weight);
  net->fc1->bias.copy_(full->fc1->bias);
  net->head->weight.copy_(full->head->weight.narrow(0, t * part, part));
  net->head->bias.copy_(full->head->bias.narrow(0, t * part, part));
  return net;
}

Batch mini_batch(int64_t step) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(1000 + step);
  at::Tensor x = at::randn({kRows, kIn}, gen);
  return {x, at::sin(x.narrow(1, 0, kOut) * 2) + 0.1 * at::randn({kRows, kOut}, gen)};
}

struct MiniRef {
  std::vector<at::Tensor> params;  // fc1.weight, fc1.bias, head.weight, head.bias
  std::vector<double> norms;
};

MiniRef train_mini_reference(const Config& cfg, uint64_t seed) {
  auto net = make_mini(seed);
  const auto& o = cfg.optimizer;
  std::unique_ptr<torch::optim::Optimizer> opt;
  if (o.type == "SGD") {
    opt = std::make_unique<torch::optim::SGD>(
        net->parameters(),
        torch::optim::SGDOptions(o.lr).momentum(o.momentum).weight_decay(o.weight_decay));
  } else {
    opt =
        std::make_unique<torch::optim::AdamW>(net->parameters(), torch::optim::AdamWOptions(o.lr)
                                                                     .betas({o.beta1, o.beta2})
                                                                     .eps(o.eps)
                                                                     .weight_decay(o.weight_decay));
  }
  MiniRef ref;
  for (int s = 0; s < kSteps; ++s) {
    opt->zero_grad();
    const Batch b = mini_batch(s);
    mse(net->head->forward(at::tanh(net->fc1->forward(b.x))), b.y).backward();
    double sq = 0;
    for (auto& p : net->parameters()) sq += p.grad().square().sum().item<double>();
    ref.norms.push_back(std::sqrt(sq));
    torch::nn::utils::clip_grad_norm_(net->parameters(), cfg.gradient_clipping);
    opt->step();
  }
  for (auto& p : net->parameters()) ref.params.push_back(p.detach().clone());
  return ref;
}

struct TpCase {
  int stage;
  bool sgd;
  bool torch_adam;  // DeepSpeed's norm arithmetic (zero/step/deepspeed_norm.cpp)
};

class DataTimesTensor : public ::testing::TestWithParam<TpCase> {};

// kDp x pp x tp ranks in Megatron's order; the head split into pp x tp parts by hand over the
// model-parallel ranks (pp and tp together), fc1 replicated across both norm groups.
void check_model_parallel(const TpCase& c, int tp_size, int pp_size) {
  constexpr int kDp = 2;
  const int world_size = kDp * tp_size * pp_size, parts = tp_size * pp_size;
  Config cfg = test_config(c.stage, kRows / kDp, 1, /*clip=*/0.2, /*bucket=*/40);
  if (c.sgd) cfg = sgd(cfg);
  cfg.optimizer.torch_adam = c.torch_adam;
  const MiniRef ref = train_mini_reference(cfg, 5);
  // Clipping was active at every step (the threshold is below every norm).
  for (double n : ref.norms) ASSERT_GT(n, cfg.gradient_clipping * 1.5);

  std::mutex mu;
  std::vector<std::vector<at::Tensor>> finals(world_size);
  std::vector<std::vector<double>> norms(world_size);
  std::vector<int> part_of(world_size);
  run_ranks(world_size, [&](std::shared_ptr<comm::Group> world) {
    const comm::Mesh mesh = comm::Mesh::megatron(world, tp_size, pp_size);
    const auto& tp = mesh["tp"];
    const auto& dp = mesh["dp"];
    const std::vector<std::string> replicated{"fc1.weight", "fc1.bias"};
    Groups groups{dp, {{tp, replicated}}};
    // The ranks holding the parts of one model: tp inside pp.
    std::shared_ptr<comm::Group> mp = tp;
    if (pp_size > 1) {
      mp = world->split(mesh.coord("dp"), mesh.coord("pp") * tp_size + tp->rank(), "mp");
      groups.norm.push_back({mesh["pp"], replicated});
    }
    const int t = mp->rank(), d = dp->rank();
    // Off dp rank 0 the weights start wrong: the broadcast within dp must fix them (and a
    // broadcast over the world would overwrite the other ranks' head rows).
    auto net = make_mini(d == 0 ? 5 : 99, t, parts);
    auto engine = initialize(net, cfg, groups);
    EXPECT_EQ(engine.world_size(), kDp);
    for (int s = 0; s < kSteps; ++s) {
      const Batch b = rank_micro_batch(mini_batch(s), d, kDp, 0, 1);
      at::Tensor h = tensor_parallel::copy_to_region(at::tanh(net->fc1->forward(b.x)), mp);
      at::Tensor y = tensor_parallel::gather_from_region(net->head->forward(h), mp);
      engine.backward(mse(y, b.y));
      engine.step();
      std::lock_guard<std::mutex> lock(mu);
      norms[world->rank()].push_back(engine.stats().last_grad_norm);
    }
    std::vector<at::Tensor> mine;
    for (auto& p : net->parameters()) mine.push_back(p.detach().clone());
    std::lock_guard<std::mutex> lock(mu);
    finals[world->rank()] = mine;
    part_of[world->rank()] = t;
  });

  const double tol = 2e-5;
  const int64_t part = kOut / parts;
  for (int r = 0; r < world_size; ++r) {
    const int t = part_of[r];
    const auto& f = finals[r];
    ASSERT_EQ(f.size(), 4u);
    EXPECT_LT((f[0] - ref.params[0]).abs().max().item<double>(), tol) << "rank " << r;
    EXPECT_LT((f[1] - ref.params[1]).abs().max().item<double>(), tol) << "rank " << r;
    EXPECT_LT((f[2] - ref.params[2].narrow(0, t * part, part)).abs().max().item<double>(), tol)
        << "rank " << r;
    EXPECT_LT((f[3] - ref.params[3].narrow(0, t * part, part)).abs().max().item<double>(), tol)
        << "rank " << r;
    for (int s = 0; s < kSteps; ++s) {
      EXPECT_NEAR(norms[r][s], ref.norms[s], 1e-5 * ref.norms[s]) << "rank " << r << " step " << s;
    }
  }
}

TEST_P(DataTimesTensor, ClippingCountsReplicatedParametersOnce) {
  check_model_parallel(GetParam(), /*tp=*/2, /*pp=*/1);
}

// Two norm groups: 2 (dp) x 2 (pp) x 2 (tp), fc1 replicated across tp and across pp.
TEST_P(DataTimesTensor, TwoNormGroups) { check_model_parallel(GetParam(), /*tp=*/2, /*pp=*/2); }

INSTANTIATE_TEST_SUITE_P(Stages, DataTimesTensor,
                         ::testing::Values(TpCase{0, false, false}, TpCase{1, false, false},
                                           TpCase{2, false, false}, TpCase{0, true, false},
                                           TpCase{1, true, false}, TpCase{2, true, false},
                                           TpCase{0, false, true}, TpCase{1, false, true},
                                           TpCase{2, false, true}),
                         [](const ::testing::TestParamInfo<TpCase>& i) {
                           return "stage" + std::to_string(i.param.stage) +
                                  (i.param.sgd ? "_sgd" : "_adamw") +
                                  (i.param.torch_adam ? "_torchadam" : "");
                         });

// A name that is not the model's is refused at initialize, naming it.
TEST(EngineGroups, UnknownReplicatedNameIsAnError) {
  run_ranks(2, [&](std::shared_ptr<comm::Group> world) {
    auto tp = world->split(0, world->rank(), "tp");
    auto dp = world->split(world->rank(), 0, "dp");
    Groups groups{dp, {{tp, {"fc1.wieght"}}}};
    try {
      initialize(make_mini(1), test_config(1, 8, 1, 0), groups);
      ADD_FAILURE() << "no error";
    } catch (const c10::Error& e) {
      EXPECT_NE(std::string(e.what()).find("'fc1.wieght'"), std::string::npos) << e.what();
    }
    // The same for the partial (sequence-parallel) list, which the message names.
    Groups partial{dp, {{tp, {}, {"fc1.bais"}}}};
    try {
      initialize(make_mini(1), test_config(1, 8, 1, 0), partial);
      ADD_FAILURE() << "no error";
    } catch (const c10::Error& e) {
      EXPECT_NE(std::string(e.what()).find("groups.norm[0].partial names 'fc1.bais'"),
                std::string::npos)
          << e.what();
    }
  });
}

// Groups that do not fit together are refused at initialize: dp listed again as a norm group
// (it would be counted twice), and dp ranks at different ranks of a norm group (not a mesh).
TEST(EngineGroups, MismatchedGroupsAreErrors) {
  run_ranks(4, [&](std::shared_ptr<comm::Group> world) {
    const int me = world->rank();
    auto dp = world->split(me / 2, me, "dp");    // {0, 1} {2, 3}
    auto tp = world->split(me % 2, me, "tp");    // {0, 2} {1, 3}: ranks 0, 1 of a dp group
    auto bad = world->split(me / 2, me, "bad");  // the dp group's own ranks
    const auto message = [&](Groups g) -> std::string {
      try {
        initialize(make_mini(1), test_config(1, 8, 1, 0), g);
      } catch (const c10::Error& e) {
        return e.what();
      }
      return "no error";
    };
    EXPECT_NE(message(Groups{dp, {{dp, {}}}}).find("groups.norm[0] is groups.dp"),
              std::string::npos);
    EXPECT_NE(message(Groups{dp, {{bad, {}}}}).find("at different ranks of groups.norm[0] ('bad')"),
              std::string::npos);
    // The right pairing is accepted.
    EXPECT_EQ(message(Groups{dp, {{tp, {}}}}), "no error");
  });
}

// The tiny net trained on every rank twice, with backward(loss) and with backward(outputs,
// grad_outputs), the pair that `split` makes from the prediction and the micro-batch (inputs cast
// to `input`; the loss in fp32). Every step of both runs is applied (none skipped).
struct BothWays {
  std::vector<at::Tensor> by_loss, by_outputs;  // per rank: flat_parameters() after training
};
using SplitBackward = std::function<std::pair<std::vector<at::Tensor>, std::vector<at::Tensor>>(
    Engine&, const at::Tensor& pred, const Batch& b)>;
BothWays train_both_ways(const Config& cfg, int world, int acc, int64_t global_rows,
                         at::ScalarType input, const SplitBackward& split) {
  BothWays out{std::vector<at::Tensor>(world), std::vector<at::Tensor>(world)};
  run_ranks(world, [&](std::shared_ptr<comm::Group> group) {
    const int r = group->rank();
    for (const bool outputs : {false, true}) {
      auto net = make_tiny_net(3);
      auto engine = initialize(net, cfg, group);
      for (int s = 0; s < kSteps; ++s) {
        const Batch global = global_batch(s, global_rows);
        for (int m = 0; m < acc; ++m) {
          const Batch b = rank_micro_batch(global, r, world, m, acc);
          const at::Tensor pred = net->forward(b.x.to(input));
          if (!outputs) {
            engine.backward(mse(pred.to(at::kFloat), b.y));
          } else {
            const auto [outs, grads] = split(engine, pred, b);
            engine.backward(outs, grads);
          }
          EXPECT_EQ(engine.step(), m == acc - 1);
        }
      }
      EXPECT_EQ(engine.stats().skipped_steps, 0);
      (outputs ? out.by_outputs : out.by_loss)[r] = engine.flat_parameters();
    }
  });
  return out;
}

// (c) backward(outputs, grad_outputs) as a pipeline stage gets it: the model's output in two
// pieces and the loss's gradients for them, computed apart (on detached copies) and scaled by
// the caller for accumulation, as the last stage's backward(loss) would have. Same parameters
// as backward(loss) and as single-process training, stages 0/1/2, with accumulation.
TEST(EngineGroups, BackwardOutputsMatchesBackwardLoss) {
  constexpr int kWorld = 2, kAcc = 2;
  constexpr int64_t kGlobal = 48;
  for (int stage = 0; stage <= 2; ++stage) {
    for (const bool use_sgd : {false, true}) {
      Config cfg = test_config(stage, kGlobal / (kWorld * kAcc), kAcc, 0.3, 64);
      if (use_sgd) cfg = sgd(cfg);
      const at::Tensor ref = train_reference(cfg, kSteps, kGlobal, 3).params;
      const BothWays both =
          train_both_ways(cfg, kWorld, kAcc, kGlobal, at::kFloat,
                          [](Engine&, const at::Tensor& pred, const Batch& b) {
                            const std::vector<at::Tensor> outs = pred.split(3, /*dim=*/1);
                            std::vector<at::Tensor> leaves;
                            for (const auto& o : outs)
                              leaves.push_back(o.detach().requires_grad_());
                            const at::Tensor loss = mse(at::cat(leaves, 1), b.y);
                            std::vector<at::Tensor> grads = torch::autograd::grad({loss}, leaves);
                            for (auto& g : grads) g = g / kAcc;
                            return std::make_pair(outs, grads);
                          });
      const auto& [by_loss, by_outputs] = both;
      for (int r = 0; r < kWorld; ++r) {
        const std::string what = "stage " + std::to_string(stage) + (use_sgd ? " SGD" : " AdamW") +
                                 " rank " + std::to_string(r);
        EXPECT_LT((by_outputs[r] - by_loss[r]).abs().max().item<double>(), 1e-6) << what;
        EXPECT_LT((by_outputs[r] - ref).abs().max().item<double>(), 2e-5) << what;
      }
    }
  }
}

// fp16: gradients of the caller's making carry what backward(loss) applies, as the header
// says: loss_scale() / (accumulation x predivide), predivide being the world size by default.
// Then both train alike, and like fp32 single-process training up to fp16's rounding.
TEST(EngineGroups, BackwardOutputsUnderFp16CarryTheLossScale) {
  constexpr int kWorld = 2, kAcc = 2;
  constexpr int64_t kGlobal = 48;
  Config cfg = sgd(test_config(2, kGlobal / (kWorld * kAcc), kAcc, 0, 64));
  cfg.fp16.enabled = true;
  Config fp32 = cfg;
  fp32.fp16.enabled = false;
  const at::Tensor ref = train_reference(fp32, kSteps, kGlobal, 3).params;
  const BothWays both =
      train_both_ways(cfg, kWorld, kAcc, kGlobal, at::kHalf,
                      [](Engine& engine, const at::Tensor& pred, const Batch& b) {
                        at::Tensor leaf = pred.detach().to(at::kFloat).requires_grad_();
                        const double factor = engine.loss_scale() / (kAcc * kWorld);
                        at::Tensor g = torch::autograd::grad({mse(leaf, b.y) * factor}, {leaf})[0];
                        return std::make_pair(std::vector<at::Tensor>{pred},
                                              std::vector<at::Tensor>{g.to(pred.scalar_type())});
                      });
  const auto& [by_loss, by_outputs] = both;
  for (int r = 0; r < kWorld; ++r) {
    EXPECT_LT((by_outputs[r] - by_loss[r]).abs().max().item<double>(), 2e-3) << "rank " << r;
    EXPECT_LT((by_outputs[r] - ref).abs().max().item<double>(), 1e-2) << "rank " << r;
  }
}

TEST(EngineGroups, BackwardOutputsChecksItsArguments) {
  auto net = make_tiny_net(1);
  auto engine = initialize(net, test_config(0, 4, 1, 0), comm::Group::single());
  const at::Tensor pred = net->forward(at::ones({4, 12}));
  EXPECT_THROW(engine.backward({pred}, {}), c10::Error);
  EXPECT_THROW(engine.backward({pred}, {at::ones({4, 4})}), c10::Error);
  EXPECT_THROW(engine.backward({pred.detach()}, {at::ones_like(pred)}), c10::Error);
  engine.backward({pred}, {at::ones_like(pred)});
  EXPECT_TRUE(engine.step());
}

// Review 07d L5: with no host counter installed, on_grad must not touch the gradient's storage.
// A sparse gradient has none; before the fix the retag read threw "Cannot access storage of
// SparseTensorImpl" before the gradient reached the engine's own handling.
TEST(EngineGroups, StoragelessGradientIsNotReadWhenNothingCounts) {
  ASSERT_FALSE(HostCountingAllocator::installed());
  run_ranks(1, [&](std::shared_ptr<comm::Group> world) {
    auto emb = torch::nn::Embedding(torch::nn::EmbeddingOptions(8, 4).sparse(true));
    auto engine = initialize(emb.ptr(), test_config(0, 4, 1, 0), Groups{world, {}});
    const at::Tensor out = emb->forward(at::arange(4, at::kLong));
    try {
      engine.backward(out.pow(2).sum());
    } catch (const std::exception& e) {
      // Whatever the engine says about a sparse gradient, it is not the storage read's error.
      EXPECT_EQ(std::string(e.what()).find("Cannot access storage"), std::string::npos) << e.what();
      return;
    }
    SUCCEED() << "the sparse gradient was taken without a storage read";
  });
}

}  // namespace
}  // namespace zero::testing
