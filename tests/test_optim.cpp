// optim/: the shard optimizers against torch::optim on the same parameters (the lr schedules
// are in test_lr_schedule.cpp).
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>

#include <cmath>
#include <functional>
#include <limits>
#include <memory>
#include <numbers>
#include <vector>

#include "optim/adamw.hpp"
#include "optim/lr_schedule.hpp"
#include "optim/sgd.hpp"

namespace zero::optim {
namespace {

constexpr int kSteps = 20;

// Per-step lr that varies, so a wrong lr anywhere (or a stale one) shows.
double lr_for(int step) { return 1e-2 * (1.0 + 0.5 * std::sin(step)); }

// A small model's parameters in shard order. Shapes and sizes differ (odd sizes land in the
// vectorised kernels' tails) and some skip weight decay, like biases and norms would.
struct Model {
  struct Param {
    std::vector<int64_t> shape;
    bool decay;
  };
  std::vector<Param> layout = {{{4, 5}, true}, {{7}, false}, {{3, 2, 3}, true},
                               {{6}, true},    {{1}, false}, {{33}, true}};
  std::vector<at::Tensor> params;  // the torch reference's parameters

  explicit Model(at::Device device = at::kCPU) {
    at::manual_seed(1234);
    for (const auto& p : layout) {
      params.push_back(at::randn(p.shape, at::TensorOptions(device)).set_requires_grad(true));
    }
  }

  int64_t numel() const {
    int64_t n = 0;
    for (const auto& p : params) n += p.numel();
    return n;
  }
  at::Tensor flat() const {
    std::vector<at::Tensor> parts;
    for (const auto& p : params) parts.push_back(p.detach().reshape(-1));
    return at::cat(parts).contiguous();
  }
  // Shard ranges of the parameters that decay (adjacent ones left unmerged on purpose).
  std::vector<Range> decay_ranges() const {
    std::vector<Range> ranges;
    int64_t offset = 0;
    for (size_t i = 0; i < params.size(); ++i) {
      const int64_t n = params[i].numel();
      if (layout[i].decay) ranges.push_back({offset, offset + n});
      offset += n;
    }
    return ranges;
  }
  // One random gradient per parameter; returns them flattened into one shard.
  at::Tensor set_random_grads() {
    std::vector<at::Tensor> parts;
    for (auto& p : params) {
      at::Tensor g = at::randn(p.sizes(), p.options().requires_grad(false));
      p.mutable_grad() = g;
      parts.push_back(g.reshape(-1));
    }
    return at::cat(parts).contiguous();
  }
  std::vector<at::Tensor> decayed() const { return pick(true); }
  std::vector<at::Tensor> not_decayed() const { return pick(false); }

 private:
  std::vector<at::Tensor> pick(bool decay) const {
    std::vector<at::Tensor> out;
    for (size_t i = 0; i < params.size(); ++i) {
      if (layout[i].decay == decay) out.push_back(params[i]);
    }
    return out;
  }
};

at::TensorOptions fp32(at::Device device = at::kCPU) {
  return at::TensorOptions().dtype(at::kFloat).device(device);
}

void expect_close(const at::Tensor& ours, const at::Tensor& ref, int step) {
  const double max_abs = (ours - ref).abs().max().item<double>();
  // 1e-6 relative; the absolute floor only matters for elements that are (nearly) zero.
  EXPECT_TRUE(at::allclose(ours, ref, /*rtol=*/1e-6, /*atol=*/1e-8))
      << "after step " << step << ": max |ours - torch| = " << max_abs;
}

// Runs kSteps through torch's optimizer and ours on the same gradients and compares the
// parameters after every step.
void run_against_torch(Model& m, torch::optim::Optimizer& ref, ShardOptimizer& ours) {
  at::Tensor shard = m.flat();
  for (int s = 0; s < kSteps; ++s) {
    const double lr = lr_for(s);
    at::Tensor grad = m.set_random_grads();
    for (auto& group : ref.param_groups()) group.options().set_lr(lr);
    ref.step();
    ours.step(shard, grad, lr);
    expect_close(shard, m.flat(), s);
  }
  EXPECT_EQ(ours.steps(), kSteps);
}

torch::optim::AdamWOptions torch_adamw(const AdamWOptions& o) {
  return torch::optim::AdamWOptions(1.0)
      .betas({o.beta1, o.beta2})
      .eps(o.eps)
      .weight_decay(o.weight_decay);  // torch's default is 1e-2; ours is 0
}

torch::optim::SGDOptions torch_sgd(const SgdOptions& o) {
  return torch::optim::SGDOptions(1.0)
      .momentum(o.momentum)
      .dampening(o.dampening)
      .weight_decay(o.weight_decay)
      .nesterov(o.nesterov);
}

// Torch parameter groups that mirror the decay ranges: the excluded ones get weight_decay 0.
// torch merges each group's options with the optimizer's defaults and lets a field equal to
// its constructor default (SGD's weight_decay 0) inherit the optimizer's value, so the
// optimizer itself must be built with without_decay(opts) for the exclusion to hold.
template <typename TorchOptions>
TorchOptions without_decay(TorchOptions opts) {
  return opts.weight_decay(0);
}
template <typename TorchOptions>
std::vector<torch::optim::OptimizerParamGroup> groups(const Model& m, const TorchOptions& opts) {
  std::vector<torch::optim::OptimizerParamGroup> g;
  g.emplace_back(m.decayed(), std::make_unique<TorchOptions>(opts));
  g.emplace_back(m.not_decayed(), std::make_unique<TorchOptions>(without_decay(opts)));
  return g;
}

// Guards the reference itself: the excluded group really runs without decay.
template <typename TorchOptions>
void expect_groups_decay(torch::optim::Optimizer& ref, double weight_decay) {
  ASSERT_EQ(ref.param_groups().size(), 2u);
  EXPECT_EQ(static_cast<TorchOptions&>(ref.param_groups()[0].options()).weight_decay(),
            weight_decay);
  EXPECT_EQ(static_cast<TorchOptions&>(ref.param_groups()[1].options()).weight_decay(), 0);
}

std::vector<Range> everything(const Model& m) { return {{0, m.numel()}}; }

// ---------------------------------------------------------------------------------------------
// AdamW

TEST(AdamW, MatchesTorchWithoutWeightDecay) {
  Model m;
  AdamWOptions o;
  torch::optim::AdamW ref(m.params, torch_adamw(o));
  auto ours = make_adamw(o, m.numel(), everything(m), fp32());
  run_against_torch(m, ref, *ours);
}

TEST(AdamW, MatchesTorchWithWeightDecayOnEverything) {
  Model m;
  AdamWOptions o;
  o.beta1 = 0.8;
  o.beta2 = 0.99;
  o.eps = 1e-6;
  o.weight_decay = 0.1;
  torch::optim::AdamW ref(m.params, torch_adamw(o));
  auto ours = make_adamw(o, m.numel(), everything(m), fp32());
  run_against_torch(m, ref, *ours);
}

TEST(AdamW, WeightDecayOnlyInsideDecayRanges) {
  Model m;
  AdamWOptions o;
  o.weight_decay = 0.3;
  torch::optim::AdamW ref(groups(m, torch_adamw(o)), without_decay(torch_adamw(o)));
  expect_groups_decay<torch::optim::AdamWOptions>(ref, o.weight_decay);
  auto ours = make_adamw(o, m.numel(), m.decay_ranges(), fp32());
  run_against_torch(m, ref, *ours);
}

// DeepSpeed's torch_adam: torch.optim.AdamW's ops one at a time. Within torch::optim::AdamW's
// rounding like the fused kernel (the C++ optimizer updates the first moment with mul_/add_,
// Python's with lerp_, so neither is bit for bit the other; bench/ds_parity.py shows the
// op-by-op form bit for bit DeepSpeed's torch.optim.AdamW over 30 bf16 steps).
TEST(AdamW, OpByOpMatchesTorch) {
  Model m;
  AdamWOptions o;
  o.weight_decay = 0.3;
  o.op_by_op = true;
  torch::optim::AdamW ref(groups(m, torch_adamw(o)), without_decay(torch_adamw(o)));
  auto ours = make_adamw(o, m.numel(), m.decay_ranges(), fp32());
  EXPECT_EQ(ours->name(), "adamw") << "one state format: checkpoints move between the two forms";
  run_against_torch(m, ref, *ours);
}

// grad_mul (DeepSpeed's clip multiplier) applies after grad_scale, as a rounding step of its own.
TEST(AdamW, OpByOpMultipliesTheScaledGradient) {
  const int64_t n = 300;
  AdamWOptions o;
  o.weight_decay = 0.1;
  o.op_by_op = true;
  auto a = make_adamw(o, n, {{0, 200}}, fp32()), b = make_adamw(o, n, {{0, 200}}, fp32());
  at::Tensor pa = at::randn({n}), pb = pa.clone();
  for (int s = 0; s < 3; ++s) {
    const at::Tensor g = at::randn({n}), mul = at::full({1}, 0.3 + 0.1 * s);
    a->step(pa, (g / 3.0).mul_(mul), 0.1);
    b->step(pb, g.clone(), 0.1, {at::full({1}, 3.0), at::zeros({1}), mul});
  }
  EXPECT_TRUE(at::equal(pa, pb));
}

TEST(AdamW, StateIsTwoShardSizedFp32Tensors) {
  const int64_t n = 1000;
  auto opt = make_adamw({}, n, {{0, n}}, fp32());
  EXPECT_EQ(opt->name(), "adamw");
  EXPECT_EQ(opt->numel(), n);
  auto state = opt->state();
  ASSERT_EQ(state.size(), 2u);
  EXPECT_EQ(state[0].first, "exp_avg");
  EXPECT_EQ(state[1].first, "exp_avg_sq");
  for (const auto& [name, t] : state) {
    EXPECT_EQ(t.dim(), 1) << name;
    EXPECT_EQ(t.numel(), n) << name;
    EXPECT_EQ(t.scalar_type(), at::kFloat) << name;
    EXPECT_TRUE(t.is_contiguous()) << name;
    EXPECT_EQ(t.count_nonzero().item<int64_t>(), 0) << name;
  }
  EXPECT_EQ(opt->state_bytes(), 2 * 4 * n);
  EXPECT_EQ(opt->scratch_bytes(), 0) << "the fused kernel needs no denominator buffer";
}

TEST(AdamW, StateAliasesTheOptimizersStorage) {
  const int64_t n = 16;
  auto opt = make_adamw({}, n, {}, fp32());
  at::Tensor p = at::zeros({n});
  opt->step(p, at::ones({n}), 0.0);
  for (const auto& [name, t] : opt->state()) t.fill_(7);
  for (const auto& [name, t] : opt->state()) EXPECT_EQ(t[3].item<float>(), 7.0f) << name;
}

// ---------------------------------------------------------------------------------------------
// SGD

struct SgdCase {
  const char* name;
  SgdOptions options;
  bool partial_decay;  // decay ranges (and torch groups) rather than the whole shard
};

class SgdVsTorch : public ::testing::TestWithParam<SgdCase> {};

TEST_P(SgdVsTorch, MatchesTorch) {
  const SgdCase& c = GetParam();
  Model m;
  std::unique_ptr<torch::optim::SGD> ref;
  std::unique_ptr<ShardOptimizer> ours;
  if (c.partial_decay) {
    ref = std::make_unique<torch::optim::SGD>(groups(m, torch_sgd(c.options)),
                                              without_decay(torch_sgd(c.options)));
    expect_groups_decay<torch::optim::SGDOptions>(*ref, c.options.weight_decay);
    ours = make_sgd(c.options, m.numel(), m.decay_ranges(), fp32());
  } else {
    ref = std::make_unique<torch::optim::SGD>(m.params, torch_sgd(c.options));
    ours = make_sgd(c.options, m.numel(), everything(m), fp32());
  }
  run_against_torch(m, *ref, *ours);
}

SgdOptions sgd(double momentum, double dampening, double weight_decay, bool nesterov) {
  SgdOptions o;
  o.momentum = momentum;
  o.dampening = dampening;
  o.weight_decay = weight_decay;
  o.nesterov = nesterov;
  return o;
}

INSTANTIATE_TEST_SUITE_P(
    Sgd, SgdVsTorch,
    ::testing::Values(SgdCase{"plain", sgd(0, 0, 0, false), false},
                      SgdCase{"weight_decay", sgd(0, 0, 0.1, false), false},
                      SgdCase{"weight_decay_in_ranges", sgd(0, 0, 0.1, false), true},
                      SgdCase{"momentum", sgd(0.9, 0, 0, false), false},
                      SgdCase{"momentum_dampening", sgd(0.9, 0.3, 0, false), false},
                      SgdCase{"momentum_weight_decay_in_ranges", sgd(0.9, 0.1, 0.05, false), true},
                      SgdCase{"nesterov", sgd(0.9, 0, 0, true), false},
                      SgdCase{"nesterov_weight_decay_in_ranges", sgd(0.8, 0, 0.2, true), true}),
    [](const ::testing::TestParamInfo<SgdCase>& info) { return std::string(info.param.name); });

TEST(Sgd, StateOnlyWithMomentum) {
  const int64_t n = 100;
  auto plain = make_sgd({}, n, {{0, n}}, fp32());
  EXPECT_EQ(plain->name(), "sgd");
  EXPECT_TRUE(plain->state().empty());
  EXPECT_EQ(plain->state_bytes(), 0);
  EXPECT_EQ(plain->scratch_bytes(), 0);

  auto momentum = make_sgd(sgd(0.9, 0, 0, false), n, {{0, n}}, fp32());
  auto state = momentum->state();
  ASSERT_EQ(state.size(), 1u);
  EXPECT_EQ(state[0].first, "momentum_buffer");
  EXPECT_EQ(state[0].second.numel(), n);
  EXPECT_EQ(state[0].second.scalar_type(), at::kFloat);
  EXPECT_EQ(momentum->state_bytes(), 4 * n);
  EXPECT_EQ(momentum->scratch_bytes(), 0);

  // The fused kernel keeps a decayed or Nesterov gradient in registers: no scratch either.
  EXPECT_EQ(make_sgd(sgd(0, 0, 0.1, false), n, {{0, n}}, fp32())->scratch_bytes(), 0);
  EXPECT_EQ(make_sgd(sgd(0.9, 0, 0, true), n, {{0, n}}, fp32())->scratch_bytes(), 0);
}

// The engine's device scalars: grad_scale divides the gradient inside the kernel, found_inf = 1
// leaves parameters and state alone, and a step cut into windows (the engine's bucket-by-bucket
// update) equals the whole step. For the fused AdamW and SGD and the op-by-op AdamW alike.
// The fused ones first (kFusedKernels of them), then the op-by-op AdamW.
constexpr size_t kFusedKernels = 2;
std::vector<std::unique_ptr<ShardOptimizer>> kernels(int64_t n, const std::vector<Range>& decay) {
  AdamWOptions a;
  a.weight_decay = 0.1;
  std::vector<std::unique_ptr<ShardOptimizer>> out;
  out.push_back(make_adamw(a, n, decay, fp32()));
  out.push_back(make_sgd(sgd(0.9, 0.1, 0.1, false), n, decay, fp32()));
  a.op_by_op = true;
  out.push_back(make_adamw(a, n, decay, fp32()));
  return out;
}

// The fused kernels fold the clip into grad_scale; a separate multiplier reaching one of them
// would be dropped, so it is refused.
TEST(DeviceScalars, FusedKernelsRefuseASeparateMultiplier) {
  const int64_t n = 64;
  auto all = kernels(n, {{0, n}});
  for (size_t k = 0; k < kFusedKernels; ++k) {
    at::Tensor p = at::randn({n});
    EXPECT_THROW(all[k]->step(p, at::randn({n}), 0.1, {{}, {}, at::ones({1})}), c10::Error)
        << all[k]->name();
  }
}

TEST(DeviceScalars, GradScaleDividesTheGradient) {
  const int64_t n = 300;
  const std::vector<Range> decay = {{0, 100}, {150, 300}};
  auto a = kernels(n, decay), b = kernels(n, decay);
  for (size_t k = 0; k < a.size(); ++k) {
    at::Tensor pa = at::randn({n}), pb = pa.clone();
    for (int s = 0; s < 3; ++s) {
      const at::Tensor g = at::randn({n});
      a[k]->step(pa, g * 0.25, 0.1);  // a power of two: exact in both forms
      b[k]->step(pb, g.clone(), 0.1, {at::full({1}, 4.0), at::zeros({1})});
    }
    EXPECT_TRUE(at::equal(pa, pb)) << a[k]->name();
  }
}

TEST(DeviceScalars, FoundInfLeavesEverythingUntouched) {
  const int64_t n = 200;
  for (auto& opt : kernels(n, {{0, 120}})) {
    at::Tensor p = at::randn({n});
    opt->step(p, at::randn({n}), 0.1);
    const at::Tensor p0 = p.clone();
    std::vector<at::Tensor> s0;
    for (const auto& [name, t] : opt->state()) s0.push_back(t.clone());
    opt->step(p, at::full({n}, std::numeric_limits<float>::infinity()), 0.1,
              {at::ones({1}), at::ones({1})});
    EXPECT_TRUE(at::equal(p, p0)) << opt->name();
    for (size_t i = 0; i < s0.size(); ++i) EXPECT_TRUE(at::equal(opt->state()[i].second, s0[i]));
    // The engine learns of the skip afterwards and takes the step back.
    EXPECT_EQ(opt->steps(), 2);
    opt->undo_step();
    EXPECT_EQ(opt->steps(), 1);
  }
}

TEST(DeviceScalars, StepInWindowsEqualsOneStep) {
  const int64_t n = 500;
  const std::vector<Range> decay = {{0, 100}, {220, 400}};
  auto a = kernels(n, decay), b = kernels(n, decay);
  for (size_t k = 0; k < a.size(); ++k) {
    at::Tensor pa = at::randn({n}), pb = pa.clone();
    for (int s = 0; s < 3; ++s) {
      const at::Tensor g = at::randn({n});
      a[k]->step(pa, g.clone(), 0.1);
      b[k]->begin_step(pb, g, 0.1);
      for (const Range w : {Range{0, 50}, Range{50, 250}, Range{250, 260}, Range{260, 500}}) {
        b[k]->update(pb, g, 0.1, {}, w);
      }
    }
    // Not bit for bit: on CPU a slice's vectorised body and scalar tail round differently
    // (FMA), and these windows cut at odd offsets (the engine's start at 64-element multiples).
    EXPECT_TRUE(at::allclose(pa, pb, /*rtol=*/1e-6, /*atol=*/1e-7)) << a[k]->name();
  }
}

// ---------------------------------------------------------------------------------------------
// Resume: a fresh optimizer given the state, the step count and the parameters continues
// exactly where the first one was.

using Factory = std::function<std::unique_ptr<ShardOptimizer>()>;

void expect_resume_identical(const Factory& make) {
  const int64_t n = 257;
  at::manual_seed(7);
  std::vector<at::Tensor> grads;
  for (int s = 0; s < kSteps; ++s) grads.push_back(at::randn({n}));

  auto a = make();
  at::Tensor pa = at::randn({n});
  for (int s = 0; s < kSteps / 2; ++s) a->step(pa, grads[s], lr_for(s));

  // What a checkpoint holds, copied into a new optimizer.
  auto b = make();
  at::Tensor pb = pa.clone();
  auto sa = a->state();
  auto sb = b->state();
  ASSERT_EQ(sa.size(), sb.size());
  for (size_t i = 0; i < sa.size(); ++i) {
    ASSERT_EQ(sa[i].first, sb[i].first);
    sb[i].second.copy_(sa[i].second);
  }
  b->set_steps(a->steps());
  EXPECT_EQ(b->steps(), kSteps / 2);

  for (int s = kSteps / 2; s < kSteps; ++s) {
    a->step(pa, grads[s], lr_for(s));
    b->step(pb, grads[s], lr_for(s));
    ASSERT_TRUE(at::equal(pa, pb)) << a->name() << " diverges at step " << s;
  }
  EXPECT_EQ(b->steps(), kSteps);
}

TEST(Resume, AdamWContinuesIdentically) {
  AdamWOptions o;
  o.weight_decay = 0.1;
  expect_resume_identical([&] { return make_adamw(o, 257, {{0, 100}, {150, 257}}, fp32()); });
}

TEST(Resume, SgdMomentumContinuesIdentically) {
  // After a resume the buffer must be decayed and added to, not re-initialised to the gradient.
  expect_resume_identical([] {
    return make_sgd(sgd(0.9, 0.2, 0.01, false), 257, {{0, 257}}, fp32());
  });
}

TEST(Resume, NegativeStepCountIsRejected) {
  auto opt = make_adamw({}, 4, {}, fp32());
  EXPECT_THROW(opt->set_steps(-1), c10::Error);
}

// ---------------------------------------------------------------------------------------------
// Decay ranges and argument checks

TEST(DecayRanges, AdjacentMergedAndEmptyDropped) {
  auto opt = make_adamw({}, 100, {{0, 10}, {10, 20}, {25, 25}, {30, 40}, {40, 100}}, fp32());
  const auto& r = opt->decay_ranges();
  ASSERT_EQ(r.size(), 2u);
  EXPECT_EQ(r[0].begin, 0);
  EXPECT_EQ(r[0].end, 20);
  EXPECT_EQ(r[1].begin, 30);
  EXPECT_EQ(r[1].end, 100);
}

TEST(DecayRanges, PiecesCoveringTheShardBecomeOne) {
  auto opt = make_adamw({}, 100, {{0, 50}, {50, 100}}, fp32());
  ASSERT_EQ(opt->decay_ranges().size(), 1u);
  EXPECT_EQ(opt->decay_ranges()[0].begin, 0);
  EXPECT_EQ(opt->decay_ranges()[0].end, 100);
}

TEST(DecayRanges, InvalidRangesAreRejected) {
  auto make = [](std::vector<Range> r) { return make_adamw({}, 100, std::move(r), fp32()); };
  EXPECT_THROW(make({{20, 30}, {10, 15}}), c10::Error);  // unsorted
  EXPECT_THROW(make({{0, 30}, {20, 40}}), c10::Error);   // overlapping
  EXPECT_THROW(make({{90, 101}}), c10::Error);           // past the end
  EXPECT_THROW(make({{-1, 5}}), c10::Error);             // before the start
  EXPECT_THROW(make({{10, 5}}), c10::Error);             // reversed
  EXPECT_THROW(make_sgd({}, 10, {{0, 11}}, fp32()), c10::Error);
}

// Parameter groups must tile the shard: an element in two groups or in none is a bug upstream.
TEST(ParamGroups, GroupsMustCoverTheShardOnce) {
  auto make = [](std::vector<ParamGroup> g) {
    return make_grouped_adamw({}, 100, std::move(g), fp32());
  };
  EXPECT_NO_THROW(make({{{{0, 40}, {60, 100}}, 1.0, {}}, {{{40, 60}}, 0.1, 0.0}}));
  EXPECT_THROW(make({{{{0, 50}}, 1.0, {}}, {{{40, 100}}, 0.1, {}}}), c10::Error);  // overlap
  EXPECT_THROW(make({{{{0, 50}}, 1.0, {}}, {{{60, 100}}, 0.1, {}}}), c10::Error);  // gap
  EXPECT_THROW(make({{{{0, 100}}, -1.0, {}}}), c10::Error);                        // lr_scale
  EXPECT_THROW(make_grouped_sgd({}, 10, {{{{0, 10}}, 1.0, -0.5}}, fp32()), c10::Error);
  // The decay ranges are the groups that use the optimizer's own weight decay.
  auto opt = make({{{{0, 40}, {60, 100}}, 1.0, {}}, {{{40, 60}}, 0.1, 0.0}});
  ASSERT_EQ(opt->decay_ranges().size(), 2u);
  EXPECT_EQ(opt->decay_ranges()[1].begin, 60);
  EXPECT_EQ(opt->groups().size(), 2u);
}

TEST(StepArgs, MismatchedTensorsAndBadLrAreRejected) {
  const int64_t n = 8;
  auto opt = make_adamw({}, n, {}, fp32());
  at::Tensor p = at::zeros({n});
  const at::Tensor g = at::zeros({n});
  at::Tensor short_p = at::zeros({n - 1});
  at::Tensor p2d = at::zeros({2, n / 2});
  at::Tensor p64 = at::zeros({n}, at::kDouble);
  at::Tensor strided = at::zeros({2 * n}).slice(0, 0, 2 * n, 2);
  EXPECT_THROW(opt->step(short_p, g, 0.1), c10::Error);
  EXPECT_THROW(opt->step(p2d, g, 0.1), c10::Error);
  EXPECT_THROW(opt->step(p64, g, 0.1), c10::Error);
  EXPECT_THROW(opt->step(strided, g, 0.1), c10::Error);
  EXPECT_THROW(opt->step(p, at::zeros({n}, at::kHalf), 0.1), c10::Error);
  EXPECT_THROW(opt->step(p, at::Tensor(), 0.1), c10::Error);
  EXPECT_THROW(opt->step(p, g, -0.1), c10::Error);
  EXPECT_THROW(opt->step(p, g, std::nan("")), c10::Error);
  EXPECT_EQ(opt->steps(), 0) << "a rejected step must not count";
  opt->step(p, g, 0.1);
  EXPECT_EQ(opt->steps(), 1);
}

TEST(Options, InvalidOptimizerOptionsAreRejected) {
  auto adamw = [](auto set) {
    AdamWOptions o;
    set(o);
    return make_adamw(o, 4, {}, fp32());
  };
  EXPECT_THROW(adamw([](AdamWOptions& o) { o.beta1 = 1.0; }), c10::Error);
  EXPECT_THROW(adamw([](AdamWOptions& o) { o.beta2 = -0.1; }), c10::Error);
  EXPECT_THROW(adamw([](AdamWOptions& o) { o.eps = -1; }), c10::Error);
  EXPECT_THROW(adamw([](AdamWOptions& o) { o.weight_decay = -0.01; }), c10::Error);
  EXPECT_THROW(make_adamw({}, -1, {}, fp32()), c10::Error);
  EXPECT_THROW(make_adamw({}, 4, {}, at::TensorOptions().dtype(at::kHalf)), c10::Error);

  EXPECT_THROW(make_sgd(sgd(-0.5, 0, 0, false), 4, {}, fp32()), c10::Error);
  EXPECT_THROW(make_sgd(sgd(0, 0, -1, false), 4, {}, fp32()), c10::Error);
  EXPECT_THROW(make_sgd(sgd(0, 0, 0, true), 4, {}, fp32()), c10::Error);      // no momentum
  EXPECT_THROW(make_sgd(sgd(0.9, 0.1, 0, true), 4, {}, fp32()), c10::Error);  // dampening
  try {
    make_sgd(sgd(0.9, 0.1, 0, true), 4, {}, fp32());
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("nesterov"), std::string::npos) << e.what();
  }
}

TEST(Optimizers, EmptyShardIsANoOp) {
  // A rank can own no elements when the model is smaller than the world.
  at::Tensor p = at::zeros({0});
  const at::Tensor g = at::zeros({0});
  for (auto& opt :
       {make_adamw({}, 0, {}, fp32()), make_sgd(sgd(0.9, 0, 0.1, true), 0, {}, fp32())}) {
    opt->step(p, g, 0.1);
    EXPECT_EQ(opt->steps(), 1);
    EXPECT_EQ(opt->state_bytes(), 0);
  }
}

// On a GPU the kernels differ from the CPU ones, so check torch parity there too.
TEST(AdamW, MatchesTorchOnCuda) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device";
  Model m(at::Device(at::kCUDA, 0));
  AdamWOptions o;
  o.weight_decay = 0.1;
  torch::optim::AdamW ref(groups(m, torch_adamw(o)), without_decay(torch_adamw(o)));
  auto ours = make_adamw(o, m.numel(), m.decay_ranges(), fp32(at::Device(at::kCUDA, 0)));
  run_against_torch(m, ref, *ours);
}

TEST(Sgd, MatchesTorchOnCuda) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device";
  Model m(at::Device(at::kCUDA, 0));
  const SgdOptions o = sgd(0.9, 0, 0.05, true);
  torch::optim::SGD ref(groups(m, torch_sgd(o)), without_decay(torch_sgd(o)));
  auto ours = make_sgd(o, m.numel(), m.decay_ranges(), fp32(at::Device(at::kCUDA, 0)));
  run_against_torch(m, ref, *ours);
}

}  // namespace
}  // namespace zero::optim
