// The offload optimizers (optim/cpu_adamw.hpp) against torch::optim per parameter, the compute
// dtype copy they write in the same pass, and the step scalars.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <gtest/gtest.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>

#include <cmath>
#include <filesystem>
#include <iterator>

#include "optim/cpu_adamw.hpp"

namespace zero::optim {
namespace {

constexpr int kSteps = 12;
double lr_for(int step) { return 1e-2 * (1.0 + 0.5 * std::sin(step)); }

// Parameters of odd sizes (vector tails) and one large enough to be split over threads; every
// other one without weight decay, like biases.
struct Model {
  std::vector<int64_t> sizes = {20, 7, 100'003, 6, 1, 70'001, 33};
  std::vector<at::Tensor> params;
  Model() {
    at::manual_seed(7);
    for (int64_t n : sizes) params.push_back(at::randn({n}).set_requires_grad(true));
  }
  bool decays(size_t i) const { return i % 2 == 0; }
  int64_t numel() const {
    int64_t n = 0;
    for (int64_t s : sizes) n += s;
    return n;
  }
  at::Tensor flat() const {
    std::vector<at::Tensor> parts;
    for (const auto& p : params) parts.push_back(p.detach());
    return at::cat(parts).contiguous();
  }
  std::vector<Range> decay_ranges() const {
    std::vector<Range> r;
    int64_t at = 0;
    for (size_t i = 0; i < sizes.size(); ++i) {
      if (decays(i)) r.push_back({at, at + sizes[i]});
      at += sizes[i];
    }
    return r;
  }
  std::vector<at::Tensor> pick(bool decay) const {
    std::vector<at::Tensor> out;
    for (size_t i = 0; i < params.size(); ++i) {
      if (decays(i) == decay) out.push_back(params[i]);
    }
    return out;
  }
  at::Tensor set_random_grads() {
    std::vector<at::Tensor> parts;
    for (auto& p : params) {
      p.mutable_grad() = at::randn(p.sizes());
      parts.push_back(p.grad());
    }
    return at::cat(parts).contiguous();
  }
};

template <typename Options>
std::vector<torch::optim::OptimizerParamGroup> groups(const Model& m, const Options& o) {
  std::vector<torch::optim::OptimizerParamGroup> g;
  g.emplace_back(m.pick(true), std::make_unique<Options>(o));
  g.emplace_back(m.pick(false), std::make_unique<Options>(Options(o).weight_decay(0)));
  return g;
}

// Within 1e-6 of the parameter's largest magnitude, per parameter: both round after every op,
// but not always the same ops (fused multiply-adds in torch's vector kernels), so single
// elements differ by an ulp or two.
void expect_close_per_parameter(const at::Tensor& ours, const at::Tensor& ref,
                                const std::vector<int64_t>& sizes, int step) {
  int64_t at = 0;
  for (int64_t n : sizes) {
    const at::Tensor a = ours.narrow(0, at, n), b = ref.narrow(0, at, n);
    const double diff = (a - b).abs().max().item<double>();
    EXPECT_LE(diff, 1e-6 * b.abs().max().item<double>())
        << "step " << step << ", parameter at " << at << " (" << n << " elements)";
    at += n;
  }
}

// Steps torch and ours on the same gradients, in two windows with the bf16 copy written;
// compares the master with torch and the copy with the master rounded (exact).
void run_against_torch(Model& m, torch::optim::Optimizer& ref, HostShardOptimizer& ours) {
  at::Tensor shard = m.flat();
  const int64_t n = shard.numel(), half = n / 3;
  at::Tensor out = at::empty({n}, at::kBFloat16);
  for (int s = 0; s < kSteps; ++s) {
    const double lr = lr_for(s);
    at::Tensor grad = m.set_random_grads();
    for (auto& group : ref.param_groups()) group.options().set_lr(lr);
    ref.step();
    ours.begin_step(shard, grad, lr);
    ours.update_to(shard, grad, lr, {}, {0, half}, out.narrow(0, 0, half));
    ours.update_to(shard, grad, lr, {}, {half, n}, out.narrow(0, half, n - half));
    expect_close_per_parameter(shard, m.flat(), m.sizes, s);
    EXPECT_TRUE(at::equal(out, shard.to(at::kBFloat16))) << "step " << s;
  }
}

TEST(CpuAdamW, MatchesTorchPerParameterWithDecayGroups) {
  Model m;
  AdamWOptions o{0.9, 0.95, 1e-8, 0.1};
  torch::optim::AdamW ref(groups(m, torch::optim::AdamWOptions(1.0)
                                        .betas({o.beta1, o.beta2})
                                        .eps(o.eps)
                                        .weight_decay(o.weight_decay)),
                          torch::optim::AdamWOptions(1.0).weight_decay(0));
  auto ours = make_cpu_adamw(o, m.numel(), m.decay_ranges(), at::kFloat, {/*threads=*/2});
  run_against_torch(m, ref, *ours);
}

struct SgdCase {
  const char* name;
  SgdOptions o;
};
class CpuSgdVsTorch : public ::testing::TestWithParam<SgdCase> {};

TEST_P(CpuSgdVsTorch, MatchesTorchPerParameter) {
  const SgdOptions o = GetParam().o;
  Model m;
  const auto opts = torch::optim::SGDOptions(1.0)
                        .momentum(o.momentum)
                        .dampening(o.dampening)
                        .weight_decay(o.weight_decay)
                        .nesterov(o.nesterov);
  torch::optim::SGD ref(groups(m, opts), torch::optim::SGDOptions(opts).weight_decay(0));
  auto ours = make_cpu_sgd(o, m.numel(), m.decay_ranges(), at::kFloat);
  run_against_torch(m, ref, *ours);
}

INSTANTIATE_TEST_SUITE_P(Sgd, CpuSgdVsTorch,
                         ::testing::Values(SgdCase{"plain", {0, 0, 0, false}},
                                           SgdCase{"weight_decay", {0, 0, 0.1, false}},
                                           SgdCase{"momentum_dampening", {0.9, 0.3, 0.05, false}},
                                           SgdCase{"nesterov", {0.8, 0, 0.2, true}}),
                         [](const auto& info) { return std::string(info.param.name); });

// The engine's scalars: grad_scale divides the gradient; found_inf skips the step (the copy
// still receives the unchanged master).
TEST(CpuAdamW, GradScaleAndFoundInf) {
  const int64_t n = 1000;
  at::manual_seed(3);
  at::Tensor p = at::randn({n}), g = at::randn({n});
  auto a = make_cpu_adamw({}, n, {{0, n}}, at::kFloat);
  auto b = make_cpu_adamw({}, n, {{0, n}}, at::kFloat);
  at::Tensor pa = p.clone(), pb = p.clone();
  a->step(pa, g * 4, 0.01, {at::full({1}, 4.0f), at::zeros({1})});
  b->step(pb, g, 0.01);
  EXPECT_TRUE(at::allclose(pa, pb, 1e-6, 1e-8));

  at::Tensor before = pa.clone(), m_before = a->state()[0].second.clone();
  at::Tensor out = at::zeros({n}, at::kHalf);
  a->begin_step(pa, g, 0.01);
  a->update_to(pa, g, 0.01, {at::ones({1}), at::ones({1})}, {0, n}, out);
  EXPECT_TRUE(at::equal(pa, before));
  EXPECT_TRUE(at::equal(a->state()[0].second, m_before));
  EXPECT_TRUE(at::equal(out, before.to(at::kHalf)));
}

// Reading a device scalar per update window was two host syncs per bucket under offload: the
// CPU optimizer takes host scalars only, and the engine reads them back once a step
// (OptimizerOffload::host_scalars).
TEST(CpuAdamW, TakesItsStepScalarsFromHostMemoryOnly) {
  auto a = make_cpu_adamw({}, 10, {{0, 10}}, at::kFloat);
  at::Tensor p = at::zeros({10}), g = at::ones({10});
  a->begin_step(p, g, 0.01);
  const at::Tensor meta = at::empty({1}, at::TensorOptions().device(at::kMeta));
  EXPECT_THROW(a->update_to(p, g, 0.01, {meta, {}}, {0, 10}, {}), c10::Error);
  EXPECT_THROW(a->update_to(p, g, 0.01, {{}, meta}, {0, 10}, {}), c10::Error);
  EXPECT_TRUE(at::equal(p, at::zeros({10}))) << "nothing applied";
}

TEST(CpuAdamW, CopyInEveryComputeDtypeIsTheMasterRounded) {
  const int64_t n = 40'001;
  at::Tensor g = at::randn({n});
  for (const auto dtype : {at::kFloat, at::kBFloat16, at::kHalf}) {
    at::Tensor p = at::randn({n});
    auto opt = make_cpu_adamw({}, n, {{0, n}}, at::kFloat);
    at::Tensor out = at::empty({n}, dtype);
    opt->begin_step(p, g, 1e-3);
    opt->update_to(p, g, 1e-3, {}, {0, n}, out);
    EXPECT_TRUE(at::equal(out, p.to(dtype))) << dtype;
  }
}

// What the engine's non-offloaded path runs (ATen's fused kernel, `fused`) and ours are
// bit-identical: parameters, every state and the bf16 copy, over two decay groups and two update
// windows whose slices end in every remainder a vector of 8 or 16 floats leaves (ATen's remainder
// loop rounds otherwise than its vector body, issue 21), unscaled, with a power-of-two scale
// (ours multiplies by its exact reciprocal) and with a clip-like one (a division).
template <typename MakeFused, typename MakeOurs>
void expect_bit_identical(MakeFused make_fused, MakeOurs make_ours, const std::string& what) {
  for (const int64_t n : {int64_t{5}, int64_t{24}, int64_t{1000}, int64_t{4099}}) {
    for (const float scale : {1.0f, 4.0f, 3.0f}) {
      const int64_t cut = n / 3 + 1, window = n / 2 + 3;  // odd places: every slice has a remainder
      std::unique_ptr<ShardOptimizer> fused = make_fused(n, std::vector<Range>{{0, cut}});
      std::unique_ptr<HostShardOptimizer> ours = make_ours(n, std::vector<Range>{{0, cut}});
      at::manual_seed(n);
      at::Tensor a = at::randn({n}) * 0.3, b = a.clone();
      at::Tensor out = at::empty({n}, at::kBFloat16);
      ShardOptimizer::Scalars scalars;
      if (scale != 1.0f) scalars.grad_scale = at::full({1}, scale);
      for (int s = 0; s < kSteps; ++s) {
        const at::Tensor g = at::randn({n}) * scale * std::pow(10.0f, -static_cast<float>(s));
        fused->begin_step(a, g, lr_for(s));
        ours->begin_step(b, g, lr_for(s));
        for (const Range w : {Range{0, std::min(window, n)}, Range{std::min(window, n), n}}) {
          fused->update(a, g.clone(), lr_for(s), scalars, w);
          ours->update_to(b, g, lr_for(s), scalars, w, out.narrow(0, w.begin, w.end - w.begin));
        }
        const std::string at_step = what + ", n " + std::to_string(n) + ", grad_scale " +
                                    std::to_string(scale) + ", step " + std::to_string(s);
        ASSERT_TRUE(at::equal(a, b))
            << at_step << ": " << a.ne(b).sum().item<int64_t>() << " parameters differ";
        ASSERT_EQ(fused->state().size(), ours->state().size());
        for (size_t k = 0; k < ours->state().size(); ++k) {
          EXPECT_TRUE(at::equal(fused->state()[k].second, ours->state()[k].second))
              << at_step << ", " << ours->state()[k].first;
        }
        EXPECT_TRUE(at::equal(out, b.to(at::kBFloat16))) << at_step;
      }
    }
  }
}

TEST(CpuAdamW, BitIdenticalToTheFusedShardOptimizer) {
  const AdamWOptions o{0.9, 0.999, 1e-8, 0.1};
  expect_bit_identical(
      [&](int64_t n, std::vector<Range> decay) { return make_adamw(o, n, decay, at::kFloat); },
      [&](int64_t n, std::vector<Range> decay) { return make_cpu_adamw(o, n, decay, at::kFloat); },
      "AdamW");
}

// Momentum with dampening, Nesterov, none, and no decay: each path of the kernel.
TEST(CpuSgd, BitIdenticalToTheFusedShardOptimizer) {
  for (const SgdOptions o : {SgdOptions{0.9, 0.1, 0.01, false}, SgdOptions{0.9, 0, 0.01, true},
                             SgdOptions{0, 0, 0.01, false}, SgdOptions{0.9, 0, 0, false}}) {
    expect_bit_identical(
        [&](int64_t n, std::vector<Range> decay) { return make_sgd(o, n, decay, at::kFloat); },
        [&](int64_t n, std::vector<Range> decay) { return make_cpu_sgd(o, n, decay, at::kFloat); },
        "SGD momentum " + std::to_string(o.momentum) + " dampening " + std::to_string(o.dampening) +
            (o.nesterov ? " nesterov" : ""));
  }
}

// The host shard's norm over pieces on the optimizer's threads: the pieces' squared norms summed
// in order (holes left out), reduced in fixed chunks summed in double, so 1 and 3
// threads give the same bits, and the fp64 sum of squares within 1e-6.
TEST(CpuOptim, SquaredNormOverPiecesOnItsThreads) {
  const int64_t big = (int64_t{1} << 24) + 4099, n = big + 3000;
  at::manual_seed(21);
  const at::Tensor g = at::randn({n});
  g.narrow(0, big, 1000).fill_(1e6);  // a hole between the pieces: must not count
  const std::vector<Range> pieces = {{0, big}, {big + 1000, big + 1777}, {big + 1777, n}};
  double want = 0;
  for (const Range& r : pieces) {
    want += g.narrow(0, r.begin, r.end - r.begin).to(at::kDouble).square().sum().item<double>();
  }
  std::vector<float> got;
  for (const int threads : {1, 3}) {
    auto opt = make_cpu_sgd({0.9, 0, 0, false}, n, {}, at::kFloat, {threads, false});
    const at::Tensor sq = opt->squared_norm(g, pieces);
    ASSERT_TRUE(sq.is_cpu() && sq.scalar_type() == at::kFloat && sq.numel() == 1);
    got.push_back(sq.item<float>());
    EXPECT_NEAR(got.back(), want, 1e-6 * want) << threads << " threads";
  }
  EXPECT_EQ(got[0], got[1]) << "the thread count changed the bits";
}

// The kernels unscale the gradient by multiplying with 1 / grad_scale when that reciprocal is
// exact (a power of two: the engine's usual scale), else by dividing; either way each element
// must be grad / grad_scale rounded once, as ATen's fused kernel computes it: the same bits as
// an unscaled step on at::div(grad, grad_scale). Some gradients make subnormal quotients.
TEST(CpuOptim, UnscalingIsOneCorrectlyRoundedDivision) {
  const int64_t n = 4099;  // a vector tail too
  for (const float scale : {1.0f, 4.0f, 0.25f, 1024.0f, 3.0f, 6.5f, 1e-3f}) {
    at::manual_seed(11);
    at::Tensor p0 = at::randn({n});
    auto scaled = make_cpu_adamw({}, n, {{0, n / 2}}, at::kFloat);
    auto plain = make_cpu_adamw({}, n, {{0, n / 2}}, at::kFloat);
    auto sgd_scaled = make_cpu_sgd({0.9, 0, 0.01, false}, n, {{0, n}}, at::kFloat);
    auto sgd_plain = make_cpu_sgd({0.9, 0, 0.01, false}, n, {{0, n}}, at::kFloat);
    at::Tensor a = p0.clone(), b = p0.clone(), c = p0.clone(), d = p0.clone();
    const at::Tensor s = at::full({1}, scale);
    for (int step = 0; step < 4; ++step) {
      at::Tensor g = at::randn({n}) * scale;
      g.narrow(0, 0, 8).mul_(1e-37);
      scaled->step(a, g, lr_for(step), {s, at::zeros({1})});
      plain->step(b, at::div(g, scale), lr_for(step));
      sgd_scaled->step(c, g, lr_for(step), {s, at::zeros({1})});
      sgd_plain->step(d, at::div(g, scale), lr_for(step));
    }
    EXPECT_TRUE(at::equal(a, b)) << "AdamW, grad_scale " << scale;
    EXPECT_TRUE(at::equal(c, d)) << "SGD, grad_scale " << scale;
  }
}

// torchrun sets OMP_NUM_THREADS=1: a configured thread count must still be used (the optimizer's
// own pool: the process gains threads - 1 threads at the first update large enough to split),
// and the split must not change a bit of the result.
TEST(CpuOptim, UsesItsThreadsWhateverTorchsIntraOpCountAndSplitsExactly) {
  const int torch_threads = at::get_num_threads();
  at::set_num_threads(1);
  const auto threads_now = [] {
    return std::distance(std::filesystem::directory_iterator("/proc/self/task"),
                         std::filesystem::directory_iterator());
  };
  const int64_t n = 300'001;
  at::manual_seed(13);
  const at::Tensor p0 = at::randn({n});
  auto one = make_cpu_adamw({}, n, {{0, n / 3}}, at::kFloat, {1, false});
  auto three = make_cpu_adamw({}, n, {{0, n / 3}}, at::kFloat, {3, false});
  at::Tensor a = p0.clone(), b = p0.clone();
  at::Tensor out_a = at::empty({n}, at::kBFloat16), out_b = at::empty({n}, at::kBFloat16);
  const auto before = threads_now();
  for (int step = 0; step < 3; ++step) {
    const at::Tensor g = at::randn({n});
    one->begin_step(a, g, lr_for(step));
    one->update_to(a, g, lr_for(step), {}, {0, n}, out_a);
    three->begin_step(b, g, lr_for(step));
    three->update_to(b, g, lr_for(step), {}, {0, n}, out_b);
  }
  EXPECT_EQ(threads_now() - before, 2) << "a pool of 2 besides the calling thread";
  EXPECT_TRUE(at::equal(a, b));
  EXPECT_TRUE(at::equal(out_a, out_b));
  EXPECT_TRUE(at::equal(one->state()[1].second, three->state()[1].second));
  at::set_num_threads(torch_threads);
}

TEST(CpuOptim, RejectsDeviceShardsAndBadCopies) {
  EXPECT_THROW(make_cpu_adamw({}, 10, {}, at::TensorOptions().dtype(at::kFloat).device(at::kMeta)),
               c10::Error);
  auto opt = make_cpu_sgd({}, 10, {}, at::kFloat);
  at::Tensor p = at::zeros({10}), g = at::zeros({10});
  opt->begin_step(p, g, 0.1);
  EXPECT_THROW(opt->update_to(p, g, 0.1, {}, {0, 10}, at::empty({9})), c10::Error);
  EXPECT_THROW(opt->update_to(p, g, 0.1, {}, {0, 10}, at::empty({10}, at::kInt)), c10::Error);
}

}  // namespace
}  // namespace zero::optim
