// Models as they come in practice, against single-process torch::optim, parameter by parameter:
// an unused parameter, a frozen one, a buffer, tied weights, a registration order unlike the
// backward order, several buckets. Plus what real programs do to an engine: a second engine on the
// same model, a user's own hook, a backward that throws, and misuse.
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>
#include <malloc.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>

#include <atomic>
#include <mutex>
#include <unordered_set>

#include "support/thread_group.hpp"
#include "support/tiny_net.hpp"
#include "zero/activation_checkpointing.hpp"
#include "zero/engine.hpp"

namespace zero::testing {
namespace {

constexpr int kIn = 12, kHidden = 16, kOut = 5;

// Registered out -> unused -> tied -> in -> gain -> mid (-> tied_alias), used in -> mid -> tied
// -> out: the reverse registration order the engine starts from is not the backward order.
struct RealNetImpl : torch::nn::Module {
  explicit RealNetImpl(bool checkpointed = false) : checkpointed(checkpointed) {
    out = register_module("out", torch::nn::Linear(kHidden, kOut));
    unused = register_module("unused", torch::nn::Linear(kHidden, kHidden));
    tied = register_parameter("tied", at::zeros({kHidden, kHidden}));
    in = register_module("in", torch::nn::Linear(kIn, kHidden));
    gain = register_parameter("gain", at::ones({kHidden}), /*requires_grad=*/false);
    shift = register_buffer("shift", at::zeros({kHidden}));
    mid = register_module("mid", torch::nn::Linear(kHidden, kHidden));
    // The same tensor under a second name (tied input/output embeddings look like this).
    register_parameter("tied_alias", tied);
  }

  at::Tensor forward(const at::Tensor& x) {
    at::Tensor h = at::tanh(in->forward(x) * gain + shift);
    h = at::tanh(mid->forward(h));
    if (hook) h.register_hook(hook);
    if (checkpointed) {
      // Two checkpointed blocks sharing `tied`: two nested backward passes accumulate into it.
      auto t = tied;
      h = checkpoint([t](const at::Tensor& a) { return at::tanh(at::matmul(a, t)); }, h);
      h = checkpoint([t](const at::Tensor& a) { return at::tanh(at::matmul(a, t.t())); }, h);
    } else {
      h = at::tanh(at::matmul(h, tied));
      h = at::tanh(at::matmul(h, tied.t()));
    }
    return out->forward(h);
  }

  bool checkpointed;
  std::function<at::Tensor(at::Tensor)> hook;  // on an activation between mid and tied
  torch::nn::Linear out{nullptr}, unused{nullptr}, in{nullptr}, mid{nullptr};
  at::Tensor tied, gain, shift;
};

std::shared_ptr<RealNetImpl> make_real_net(uint64_t seed, bool checkpointed = false) {
  auto net = std::make_shared<RealNetImpl>(checkpointed);
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  at::NoGradGuard g;
  for (auto& p : net->parameters()) p.copy_(at::randn(p.sizes(), gen) * 0.4);
  net->gain.copy_(1 + 0.5 * at::randn({kHidden}, gen));
  net->shift.copy_(0.2 * at::randn({kHidden}, gen));
  return net;
}

// Distinct tensors by their first name (named_parameters() lists a tied tensor twice).
std::vector<std::pair<std::string, at::Tensor>> distinct_params(torch::nn::Module& m) {
  std::vector<std::pair<std::string, at::Tensor>> out;
  std::unordered_set<const void*> seen;
  for (const auto& item : m.named_parameters()) {
    if (seen.insert(item.value().unsafeGetTensorImpl()).second) {
      out.emplace_back(item.key(), item.value());
    }
  }
  return out;
}

Config real_config(const std::string& optimizer, int stage, int64_t micro, int accumulation) {
  Config c = test_config(stage, micro, accumulation, 0, /*bucket=*/64);
  c.optimizer.type = optimizer;
  c.optimizer.lr = optimizer == "SGD" ? 0.05 : 1e-2;
  c.optimizer.momentum = 0.9;
  c.optimizer.weight_decay = 0.01;
  // torch::optim skips a parameter without a gradient; the engine gives it zeros, which decay
  // would still move: keep the unused layer out of weight decay so both leave it alone.
  c.no_weight_decay = {"bias", "unused"};
  return c;
}

// Single-process training on the whole global batch with torch::optim.
std::shared_ptr<RealNetImpl> train_reference_net(const Config& cfg, int steps, int64_t rows,
                                                 uint64_t seed, const std::vector<int>& skip = {}) {
  auto net = make_real_net(seed);
  std::vector<at::Tensor> decay, no_decay;
  for (auto& [name, p] : distinct_params(*net)) {
    if (!p.requires_grad()) continue;
    const bool excluded =
        std::any_of(cfg.no_weight_decay.begin(), cfg.no_weight_decay.end(),
                    [&](const std::string& s) { return name.find(s) != name.npos; });
    (excluded ? no_decay : decay).push_back(p);
  }
  const auto& o = cfg.optimizer;
  std::unique_ptr<torch::optim::Optimizer> opt;
  if (o.type == "SGD") {
    auto mk = [&](double wd) {
      return std::make_unique<torch::optim::SGDOptions>(
          torch::optim::SGDOptions(o.lr).momentum(o.momentum).weight_decay(wd));
    };
    opt = std::make_unique<torch::optim::SGD>(
        std::vector<torch::optim::OptimizerParamGroup>{{decay, mk(o.weight_decay)},
                                                       {no_decay, mk(0.0)}},
        torch::optim::SGDOptions(o.lr));
  } else {
    auto mk = [&](double wd) {
      return std::make_unique<torch::optim::AdamWOptions>(
          torch::optim::AdamWOptions(o.lr).betas({o.beta1, o.beta2}).eps(o.eps).weight_decay(wd));
    };
    opt = std::make_unique<torch::optim::AdamW>(
        std::vector<torch::optim::OptimizerParamGroup>{{decay, mk(o.weight_decay)},
                                                       {no_decay, mk(0.0)}},
        torch::optim::AdamWOptions(o.lr));
  }
  for (int s = 0; s < steps; ++s) {
    if (std::find(skip.begin(), skip.end(), s) != skip.end()) continue;
    opt->zero_grad();
    Batch b = global_batch(s, rows);
    mse(net->forward(b.x), b.y).backward();
    opt->step();
  }
  return net;
}

// Every parameter, buffer and frozen tensor of `got` allclose to `want`'s; the trained ones moved.
void expect_same_model(torch::nn::Module& got, torch::nn::Module& want, const std::string& where) {
  auto g = distinct_params(got);
  auto w = distinct_params(want);
  ASSERT_EQ(g.size(), w.size());
  for (size_t i = 0; i < g.size(); ++i) {
    ASSERT_EQ(g[i].first, w[i].first);
    at::Tensor a = g[i].second.detach().to(at::kFloat);
    at::Tensor b = w[i].second.detach();
    EXPECT_TRUE(at::allclose(a, b, /*rtol=*/1e-4, /*atol=*/2e-6))
        << where << ": parameter '" << g[i].first << "' differs by up to "
        << (a - b).abs().max().item<double>();
  }
  auto gb = got.named_buffers();
  auto wb = want.named_buffers();
  for (const auto& item : wb) {
    EXPECT_TRUE(at::equal(gb[item.key()].to(at::kFloat), item.value())) << where << ": buffer";
  }
}

struct Case {
  std::string optimizer;
  int stage;
  int world;
  int accumulation;
};

void PrintTo(const Case& c, std::ostream* os) {
  *os << c.optimizer << " stage " << c.stage << " on " << c.world << " ranks, accumulation "
      << c.accumulation;
}

class RealModel : public ::testing::TestWithParam<Case> {};

constexpr int kSteps = 4;
constexpr int64_t kRows = 48;

TEST_P(RealModel, MatchesTorchOptimParameterByParameter) {
  const Case c = GetParam();
  const Config cfg =
      real_config(c.optimizer, c.stage, kRows / (c.world * c.accumulation), c.accumulation);
  auto ref = train_reference_net(cfg, kSteps, kRows, /*seed=*/11);
  // Training moved the trained parameters, so agreement is not trivial.
  auto start = make_real_net(11);
  EXPECT_GT((ref->mid->weight - start->mid->weight).abs().max().item<double>(), 1e-3);
  EXPECT_TRUE(at::equal(ref->unused->weight, start->unused->weight));

  std::mutex mu;
  std::vector<std::shared_ptr<RealNetImpl>> nets(c.world);
  std::vector<int64_t> late(c.world), early(c.world);
  run_ranks(c.world, [&](std::shared_ptr<comm::Group> group) {
    auto net = make_real_net(11);
    auto engine = initialize(net, cfg, group);
    const int r = group->rank();
    EngineStats before;
    for (int s = 0; s < kSteps; ++s) {
      Batch global = global_batch(s, kRows);
      for (int m = 0; m < c.accumulation; ++m) {
        Batch b = rank_micro_batch(global, r, c.world, m, c.accumulation);
        before = engine.stats();
        engine.backward(mse(net->forward(b.x), b.y));
        EXPECT_EQ(engine.step(), m == c.accumulation - 1);
      }
    }
    std::lock_guard<std::mutex> lock(mu);
    nets[r] = net;
    // The last backward (a boundary): how many buckets it reduced during / after autograd.
    early[r] = engine.stats().buckets_launched_in_backward - before.buckets_launched_in_backward;
    late[r] =
        engine.stats().buckets_launched_after_backward - before.buckets_launched_after_backward;
  });
  for (int r = 0; r < c.world; ++r) {
    expect_same_model(*nets[r], *ref, "rank " + std::to_string(r));
    // After the first step the buckets follow the arrival order and unused parameters are
    // known: every bucket of the last boundary pass was reduced while autograd ran.
    EXPECT_EQ(late[r], 0) << "rank " << r;
    EXPECT_GE(early[r], 4) << "rank " << r;
  }
}

std::string case_name(const ::testing::TestParamInfo<Case>& info) {
  const Case& c = info.param;
  return c.optimizer + "_stage" + std::to_string(c.stage) + "_world" + std::to_string(c.world) +
         "_ga" + std::to_string(c.accumulation);
}

std::vector<Case> all_cases() {
  std::vector<Case> cases;
  for (const char* o : {"SGD", "AdamW"}) {
    for (int stage : {0, 1, 2}) {
      for (int world : {1, 2, 4}) cases.push_back({o, stage, world, 1});
      cases.push_back({o, stage, 2, 3});
    }
  }
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Stages, RealModel, ::testing::ValuesIn(all_cases()), case_name);

// Out-of-order and unused parameters must not grow the stage-2 bucket pool past its two
// declared buffers: memory the engine's own report and the allocator-independent shape check.
TEST(RealModelBuckets, Stage2PoolStaysWithinItsDeclaredBuffers) {
  const Config cfg = real_config("SGD", 2, kRows / 2, 1);
  run_ranks(2, [&](std::shared_ptr<comm::Group> group) {
    auto net = make_real_net(3);
    auto engine = initialize(net, cfg, group);
    std::vector<int64_t> bytes;
    for (int s = 0; s < 3; ++s) {
      Batch b = rank_micro_batch(global_batch(s, kRows), group->rank(), 2, 0, 1);
      engine.backward(mse(net->forward(b.x), b.y));
      engine.step();
      bytes.push_back(engine.memory_report().measured.comm_buffers);
    }
    // A bucket closes at >= 64 elements, so it holds at most 63 + 256 (the largest parameter)
    // elements, padded to 384 for 2 ranks: two buffer pairs (bucket + shard, fp32) at most.
    const int64_t two_pairs = 2 * (384 + 192) * 4;
    for (int64_t b : bytes) {
      EXPECT_GT(b, 0);
      EXPECT_LE(b, two_pairs);
      EXPECT_EQ(b, bytes.front()) << "the bucket pool grew";
    }
  });
}

// Bytes glibc has handed out and not got back: arenas plus mmapped chunks.
int64_t heap_in_use() {
  const struct mallinfo2 m = mallinfo2();
  return static_cast<int64_t>(m.uordblks + m.hblkhd);
}

// Six 512x512 layers, registered in forward order or reversed. Reversed, the engine's initial
// layout (reverse registration) puts the first layer's bucket first: the last to get gradients.
struct Chain : torch::nn::Module {
  explicit Chain(bool reversed) {
    layers.resize(6, torch::nn::Linear(nullptr));
    for (int i = 0; i < 6; ++i) {
      const int k = reversed ? 5 - i : i;
      layers[k] = register_module("l" + std::to_string(k), torch::nn::Linear(512, 512));
    }
  }
  at::Tensor forward(at::Tensor x) {
    for (auto& l : layers) x = at::tanh(l->forward(x));
    return x;
  }
  std::vector<torch::nn::Linear> layers;
};

// Heap (glibc's count, not the engine's) still held after 3 steps beyond what it held after
// initialize(), for a stage-2 engine with one bucket per layer.
int64_t heap_growth(bool reversed) {
  at::set_num_threads(1);
  Config cfg = real_config("SGD", 2, 8, 1);
  cfg.optimizer.momentum = 0;  // no optimizer state: nothing is allocated on the first step
  cfg.zero_optimization.reduce_bucket_size = 512 * 512;
  auto net = std::make_shared<Chain>(reversed);
  auto engine = initialize(net, cfg, comm::Group::single());
  const at::Tensor x = at::randn({8, 512});
  const int64_t before = heap_in_use();
  for (int s = 0; s < 3; ++s) {
    engine.backward(net->forward(x).square().mean());
    engine.step();
  }
  return heap_in_use() - before;
}

TEST(RealModelBuckets, OutOfOrderGradientsHoldNoMoreHeapThanInOrder) {
  const int64_t in_order = heap_growth(false);
  const int64_t reversed = heap_growth(true);
  const int64_t pair = 2 * (512 * 512 + 512) * 4;  // one bucket buffer pair (world 1), fp32
  std::printf("heap held after 3 steps beyond initialize: in order %.2f MiB, reversed %.2f MiB\n",
              in_order / 1048576.0, reversed / 1048576.0);
  // A growing pool would keep four more pairs (8 MiB) for the reversed chain.
  EXPECT_LT(reversed - in_order, pair / 2);
}

TEST(RealModelBuckets, Stage2PoolHighWaterIsInStats) {
  const Config cfg = real_config("SGD", 2, kRows / 2, 1);
  run_ranks(2, [&](std::shared_ptr<comm::Group> group) {
    auto net = make_real_net(3);
    auto engine = initialize(net, cfg, group);
    for (int s = 0; s < 3; ++s) {
      Batch b = rank_micro_batch(global_batch(s, kRows), group->rank(), 2, 0, 1);
      engine.backward(mse(net->forward(b.x), b.y));
      engine.step();
      EXPECT_EQ(engine.stats().bucket_buffers, 2);
      EXPECT_LE(engine.stats().bucket_buffers_in_use_peak, 2);
      EXPECT_GE(engine.stats().bucket_buffers_in_use_peak, 1);
    }
  });
}

// Tied weights shared by two checkpointed blocks: two nested backward passes accumulate into one
// parameter. Same result as the plain model trained by torch::optim.
TEST(RealModelCheckpoint, TiedWeightsAcrossCheckpointedBlocks) {
  for (int stage : {0, 2}) {
    const Config cfg = real_config("SGD", stage, kRows / 2, 1);
    auto ref = train_reference_net(cfg, kSteps, kRows, 5);
    std::vector<std::shared_ptr<RealNetImpl>> nets(2);
    run_ranks(2, [&](std::shared_ptr<comm::Group> group) {
      auto net = make_real_net(5, /*checkpointed=*/true);
      auto engine = initialize(net, cfg, group);
      for (int s = 0; s < kSteps; ++s) {
        Batch b = rank_micro_batch(global_batch(s, kRows), group->rank(), 2, 0, 1);
        engine.backward(mse(net->forward(b.x), b.y));
        engine.step();
      }
      nets[group->rank()] = net;
    });
    for (auto& n : nets) expect_same_model(*n, *ref, "stage " + std::to_string(stage));
  }
}

// `engine = initialize(model, ...)` again: the new engine takes the model over and trains; the
// old one was destroyed after the new one installed its hooks.
TEST(RealModelEngines, ReassigningTheEngineKeepsTraining) {
  const Config cfg = real_config("SGD", 2, kRows, 1);
  auto ref = train_reference_net(cfg, kSteps, kRows, 4);
  auto net = make_real_net(4);
  auto engine = initialize(net, cfg, comm::Group::single());
  engine = initialize(net, cfg, comm::Group::single());
  for (int s = 0; s < kSteps; ++s) {
    Batch b = global_batch(s, kRows);
    engine.backward(mse(net->forward(b.x), b.y));
    engine.step();
  }
  expect_same_model(*net, *ref, "second engine");
}

TEST(RealModelEngines, SecondEngineAfterTheFirstIsDestroyedTrains) {
  const Config cfg = real_config("AdamW", 1, kRows / 2, 1);
  auto ref = train_reference_net(cfg, kSteps, kRows, 4);
  std::vector<std::shared_ptr<RealNetImpl>> nets(2);
  run_ranks(2, [&](std::shared_ptr<comm::Group> group) {
    auto net = make_real_net(4);
    { auto first = initialize(net, cfg, group); }
    auto engine = initialize(net, cfg, group);
    for (int s = 0; s < kSteps; ++s) {
      Batch b = rank_micro_batch(global_batch(s, kRows), group->rank(), 2, 0, 1);
      engine.backward(mse(net->forward(b.x), b.y));
      engine.step();
    }
    nets[group->rank()] = net;
  });
  for (auto& n : nets) expect_same_model(*n, *ref, "second engine");
}

// A live engine whose model a newer engine took over says so instead of training nothing.
TEST(RealModelEngines, TheReplacedEngineSaysItWasReplaced) {
  const Config cfg = real_config("SGD", 0, kRows, 1);
  auto net = make_real_net(4);
  auto first = initialize(net, cfg, comm::Group::single());
  auto second = initialize(net, cfg, comm::Group::single());
  Batch b = global_batch(0, kRows);
  try {
    first.backward(mse(net->forward(b.x), b.y));
    FAIL() << "expected an error";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("another engine"), std::string::npos) << e.what();
  }
  second.backward(mse(net->forward(b.x), b.y));
  EXPECT_TRUE(second.step());
}

class CountingHook final : public torch::autograd::PostAccumulateGradHook {
 public:
  explicit CountingHook(std::atomic<int>* calls) : calls_(calls) {}
  void operator()(const torch::autograd::Variable& p) override {
    if (p.grad().defined()) ++*calls_;
  }

 private:
  std::atomic<int>* calls_;
};

// A user's post-accumulate hook sees the gradient first, then the engine takes it; it is back
// in place (alone) once the engine is gone.
TEST(RealModelEngines, UserPostAccumulateHookIsChained) {
  const Config cfg = real_config("SGD", 2, kRows, 1);
  auto net = make_real_net(4);
  std::atomic<int> calls{0};
  torch::autograd::impl::set_post_acc_grad_hooks(net->mid->weight,
                                                 std::make_unique<CountingHook>(&calls));
  {
    auto engine = initialize(net, cfg, comm::Group::single());
    for (int s = 0; s < 2; ++s) {
      Batch b = global_batch(s, kRows);
      engine.backward(mse(net->forward(b.x), b.y));
      engine.step();
    }
    EXPECT_EQ(calls.load(), 2);
  }
  Batch b = global_batch(0, kRows);
  mse(net->forward(b.x), b.y).backward();  // no engine: plain autograd, the user hook only
  EXPECT_EQ(calls.load(), 3);
  EXPECT_TRUE(net->mid->weight.grad().defined());
}

// bf16: frozen parameters and floating buffers are cast with the trainable ones (DeepSpeed casts
// the whole module), so a bf16 forward does not mix dtypes.
TEST(RealModelDtypes, FrozenParametersAndBuffersFollowBf16) {
  Config cfg = real_config("AdamW", 2, kRows, 1);
  cfg.bf16 = true;
  auto net = make_real_net(2);
  auto engine = initialize(net, cfg, comm::Group::single());
  EXPECT_EQ(net->gain.scalar_type(), at::kBFloat16);
  EXPECT_EQ(net->shift.scalar_type(), at::kBFloat16);
  EXPECT_EQ(net->mid->weight.scalar_type(), at::kBFloat16);
  Batch b = global_batch(0, kRows);
  engine.backward(mse(net->forward(b.x.to(at::kBFloat16)).to(at::kFloat), b.y));
  EXPECT_TRUE(engine.step());
}

TEST(RealModelDtypes, BufferOnAnotherDeviceIsNamed) {
  auto net = make_real_net(2);
  net->register_buffer("stray", at::empty({4}, at::TensorOptions().device(at::kMeta)));
  try {
    initialize(net, real_config("SGD", 0, kRows, 1), comm::Group::single());
    FAIL() << "expected an error";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("'stray'"), std::string::npos) << e.what();
  }
}

// A backward that throws half-way (after some buckets were launched) is discarded whole: the next
// steps train exactly as if that batch had never been seen.
TEST(RealModelFailures, FailedBackwardIsDiscarded) {
  for (int stage : {0, 1, 2}) {
    for (int accumulation : {1, 2}) {
      const Config cfg = real_config("SGD", stage, kRows / (2 * accumulation), accumulation);
      auto ref = train_reference_net(cfg, 4, kRows, 6, /*skip=*/{1});
      std::vector<std::shared_ptr<RealNetImpl>> nets(2);
      run_ranks(2, [&](std::shared_ptr<comm::Group> group) {
        auto net = make_real_net(6);
        auto engine = initialize(net, cfg, group);
        for (int s = 0; s < 4; ++s) {
          Batch global = global_batch(s, kRows);
          for (int m = 0; m < accumulation; ++m) {
            Batch b = rank_micro_batch(global, group->rank(), 2, m, accumulation);
            const bool fail = s == 1 && m == accumulation - 1;
            net->hook = [fail](at::Tensor g) {
              if (fail) throw std::runtime_error("data error in this batch");
              return g;
            };
            try {
              engine.backward(mse(net->forward(b.x), b.y));
            } catch (const std::exception& e) {
              EXPECT_TRUE(fail) << e.what();
              EXPECT_NE(std::string(e.what()).find("data error"), std::string::npos);
              break;  // the window is discarded: skip to the next global batch
            }
            engine.step();
          }
        }
        net->hook = nullptr;
        nets[group->rank()] = net;
      });
      for (auto& n : nets) {
        expect_same_model(*n, *ref,
                          "stage " + std::to_string(stage) + " ga " + std::to_string(accumulation));
      }
    }
  }
}

// One rank's backward throws; the other must not hang: it fails its next collective within the
// communication timeout, with an error, and the failing rank reports its own error.
TEST(RealModelFailures, OneRankThrowingEndsEveryRank) {
  for (int stage : {0, 2}) {
    const Config cfg = real_config("SGD", stage, kRows / 2, 1);
    std::vector<std::string> errors(2);
    run_ranks(
        2,
        [&](std::shared_ptr<comm::Group> group) {
          const int r = group->rank();
          auto net = make_real_net(6);
          auto engine = initialize(net, cfg, group);
          try {
            for (int s = 0; s < 3; ++s) {
              Batch b = rank_micro_batch(global_batch(s, kRows), r, 2, 0, 1);
              net->hook = [r, s](at::Tensor g) {
                if (r == 1 && s == 1) throw std::runtime_error("rank 1 lost its data");
                return g;
              };
              engine.backward(mse(net->forward(b.x), b.y));
              engine.step();
            }
          } catch (const std::exception& e) {
            errors[r] = e.what();
          }
        },
        std::chrono::seconds(5));
    EXPECT_NE(errors[1].find("rank 1 lost its data"), std::string::npos) << errors[1];
    // Rank 0 names itself, the collective that could not complete, and the likely cause.
    EXPECT_NE(errors[0].find("rank 0 of 2"), std::string::npos) << errors[0];
    EXPECT_NE(errors[0].find("peer rank"), std::string::npos) << errors[0];
  }
}

TEST(RealModelMisuse, TwoBackwardsWithoutStepAreAnError) {
  for (int stage : {0, 2}) {
    auto net = make_real_net(1);
    auto engine = initialize(net, real_config("SGD", stage, kRows, 1), comm::Group::single());
    Batch b = global_batch(0, kRows);
    engine.backward(mse(net->forward(b.x), b.y));
    try {
      engine.backward(mse(net->forward(b.x), b.y));
      FAIL() << "expected an error";
    } catch (const c10::Error& e) {
      EXPECT_NE(std::string(e.what()).find("step()"), std::string::npos) << e.what();
    }
    EXPECT_TRUE(engine.step());
  }
}

TEST(RealModelMisuse, StepWithoutBackwardIsAnError) {
  auto net = make_real_net(1);
  auto engine = initialize(net, real_config("SGD", 1, kRows, 1), comm::Group::single());
  try {
    engine.step();
    FAIL() << "expected an error";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("backward"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace zero::testing
