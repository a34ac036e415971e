// data_types.grad_accum_dtype: with a bf16 model, micro-step gradients are summed in bf16 the
// way DeepSpeed 0.19.8 sums them (its default when the key is absent), or in fp32 when asked.
// The reference is written per parameter from DeepSpeed's source, independently of the engine:
//   stage 0/1: autograd adds each micro-step's bf16 .grad into the previous one (bf16), and the
//              window's sum is divided by the world size and reduced in bf16 at the boundary
//              (stage_1_and_2.py reduce_gradients -> average_tensor);
//   stage 2:   every micro-step's gradient is divided by the world size and reduced in bf16
//              (average_tensor), then added to the partition's running sum in bf16
//              (independent_gradient_partition_epilogue: accumulated_grad.add_(new_avg_grad)).
// fp32 accumulation keeps the same reductions but sums in fp32. Then torch::optim (SGD and
// AdamW) updates fp32 master copies, and the bf16 model is the master rounded.
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>

#include <cstdio>
#include <mutex>

#include "support/thread_group.hpp"
#include "support/tiny_net.hpp"
#include "zero/engine.hpp"

namespace zero::testing {
namespace {

constexpr int kWorld = 2;
constexpr int kAccum = 4;  // > 2: with two addends one bf16 rounding of an fp32 sum is the same
constexpr int kMicro = 4;
constexpr int kSteps = 3;
constexpr int64_t kRows = kMicro * kAccum * kWorld;

Config accum_config(int stage, const std::string& optimizer, std::optional<Dtype> accum) {
  Config c = test_config(stage, kMicro, kAccum, /*clip=*/0.0, /*bucket=*/100);
  c.bf16 = true;
  c.grad_accum_dtype = accum;
  c.optimizer.type = optimizer;
  // AdamW's first update is nearly +-lr; a power-of-two lr keeps the masters far from bf16
  // rounding midpoints, so the last-bit difference between two AdamW implementations (torch's
  // and zero's) cannot round a bf16 weight the other way and fork the runs.
  c.optimizer.lr = optimizer == "SGD" ? 0.2 : 0.0078125;
  return c;
}

// TinyNet with bf16-representable weights: stage 0 builds its fp32 master from the bf16 module
// (as DeepSpeed does), stages 1/2 from the fp32 values; equal when they are representable.
std::shared_ptr<TinyNetImpl> make_net() {
  auto net = make_tiny_net(11);
  at::NoGradGuard no_grad;
  for (auto& p : net->parameters()) p.copy_(p.to(at::kBFloat16));
  return net;
}

// The engine's fp32 master weights after kSteps optimizer steps, in named_parameters() order.
at::Tensor train_engine(const Config& cfg) {
  at::Tensor out;
  std::mutex mu;
  run_ranks(kWorld, [&](std::shared_ptr<comm::Group> group) {
    auto net = make_net();
    auto engine = initialize(net, cfg, group);
    for (int s = 0; s < kSteps; ++s) {
      const Batch g = global_batch(s, kRows);
      for (int m = 0; m < kAccum; ++m) {
        const Batch b = rank_micro_batch(g, group->rank(), kWorld, m, kAccum);
        engine.backward(mse(net->forward(b.x.to(at::kBFloat16)).to(at::kFloat), b.y));
        engine.step();
      }
    }
    const StateDict sd = engine.state_dict({.master = true});
    std::vector<at::Tensor> parts;
    for (const auto& [name, t] : sd) parts.push_back(t.reshape({-1}).to(at::kFloat));
    std::lock_guard<std::mutex> lock(mu);
    if (group->rank() == 0) out = at::cat(parts);
  });
  return out;
}

// a + b computed in `dtype` (bf16: one rounding of the exact sum, as c10::BFloat16's operator+
// and at::add on bf16 tensors do).
at::Tensor add_in(const at::Tensor& a, const at::Tensor& b, at::ScalarType dtype) {
  return (a.to(at::kFloat) + b.to(at::kFloat)).to(dtype);
}

at::Tensor reference(const Config& cfg) {
  const at::ScalarType acc = cfg.accum_dtype() == Dtype::kBFloat16 ? at::kBFloat16 : at::kFloat;
  const int stage = cfg.zero_optimization.stage;
  auto master_net = make_net();  // fp32 masters
  auto model = make_net();       // the bf16 copy that computes
  model->to(at::kBFloat16);
  std::vector<at::Tensor> masters = master_net->parameters();
  std::vector<at::Tensor> params = model->parameters();
  const auto& o = cfg.optimizer;
  std::unique_ptr<torch::optim::Optimizer> opt;
  if (o.type == "SGD") {
    opt = std::make_unique<torch::optim::SGD>(
        masters, torch::optim::SGDOptions(o.lr).weight_decay(o.weight_decay));
  } else {
    opt = std::make_unique<torch::optim::AdamW>(masters, torch::optim::AdamWOptions(o.lr)
                                                             .betas({o.beta1, o.beta2})
                                                             .eps(o.eps)
                                                             .weight_decay(o.weight_decay));
  }
  for (int s = 0; s < kSteps; ++s) {
    {
      at::NoGradGuard no_grad;
      for (size_t i = 0; i < params.size(); ++i) params[i].copy_(masters[i]);
    }
    // grads[r][m][i]: rank r's bf16 gradient of parameter i in micro-step m (loss / kAccum).
    std::vector<std::vector<std::vector<at::Tensor>>> grads(kWorld);
    const Batch g = global_batch(s, kRows);
    for (int r = 0; r < kWorld; ++r) {
      for (int m = 0; m < kAccum; ++m) {
        for (auto& p : params) p.mutable_grad() = at::Tensor();
        const Batch b = rank_micro_batch(g, r, kWorld, m, kAccum);
        (mse(model->forward(b.x.to(at::kBFloat16)).to(at::kFloat), b.y) * (1.0 / kAccum))
            .backward();
        std::vector<at::Tensor> gs;
        for (auto& p : params) gs.push_back(p.grad().clone());
        grads[r].push_back(std::move(gs));
      }
    }
    opt->zero_grad();
    for (size_t i = 0; i < params.size(); ++i) {
      // The reduction: each rank's bf16 tensor divided by the world size, summed in bf16.
      auto reduce = [&](const at::Tensor& a0, const at::Tensor& a1) {
        return add_in(a0.to(at::kBFloat16) / kWorld, a1.to(at::kBFloat16) / kWorld, at::kBFloat16);
      };
      at::Tensor avg;
      if (stage == 2) {
        for (int m = 0; m < kAccum; ++m) {
          at::Tensor red = reduce(grads[0][m][i], grads[1][m][i]);
          avg = m == 0 ? red.to(acc) : add_in(avg, red, acc);
        }
      } else {
        std::vector<at::Tensor> local(kWorld);
        for (int r = 0; r < kWorld; ++r) {
          for (int m = 0; m < kAccum; ++m) {
            const at::Tensor& gr = grads[r][m][i];
            local[r] = m == 0 ? gr.to(acc) : add_in(local[r], gr, acc);
          }
        }
        avg = reduce(local[0], local[1]);
      }
      masters[i].mutable_grad() = avg.to(at::kFloat);
    }
    opt->step();
  }
  std::vector<at::Tensor> parts;
  for (auto& p : masters) parts.push_back(p.detach().reshape({-1}));
  return at::cat(parts);
}

double max_diff(const at::Tensor& a, const at::Tensor& b) {
  return (a - b).abs().max().item<double>();
}

struct Case {
  int stage;
  const char* optimizer;
};

class GradAccumDtype : public ::testing::TestWithParam<Case> {};

TEST_P(GradAccumDtype, Bf16AndFp32AccumulationEachMatchTheirReference) {
  const Case c = GetParam();
  // One intra-op thread: LayerNorm's CPU backward sums gamma's gradient in per-thread partials
  // whose rows depend on scheduling, and the two rank threads share the pool; bit-identical
  // gradients need one fixed order.
  at::set_num_threads(1);
  // Absent key: DeepSpeed's default, the model dtype (bf16).
  const Config bf16_cfg = accum_config(c.stage, c.optimizer, std::nullopt);
  ASSERT_EQ(bf16_cfg.accum_dtype(), Dtype::kBFloat16);
  const Config fp32_cfg = accum_config(c.stage, c.optimizer, Dtype::kFloat32);
  const at::Tensor ref_bf16 = reference(bf16_cfg);
  const at::Tensor ref_fp32 = reference(fp32_cfg);
  const at::Tensor got_bf16 = train_engine(bf16_cfg);
  const at::Tensor got_fp32 = train_engine(fp32_cfg);
  const double gap = max_diff(ref_bf16, ref_fp32);
  const double e_bf16 = max_diff(got_bf16, ref_bf16);
  const double e_fp32 = max_diff(got_fp32, ref_fp32);
  std::printf(
      "stage %d %s: |engine-ref| bf16 accum %.2e, fp32 accum %.2e; bf16 vs fp32 refs %.2e\n",
      c.stage, c.optimizer, e_bf16, e_fp32, gap);
  // The two accumulations must really differ here, by far more than the tolerance.
  EXPECT_GT(gap, 1e-4);
  EXPECT_LE(e_bf16, 1e-6);
  EXPECT_LE(e_fp32, 1e-6);
}

INSTANTIATE_TEST_SUITE_P(Stages, GradAccumDtype,
                         ::testing::Values(Case{0, "SGD"}, Case{1, "SGD"}, Case{1, "AdamW"},
                                           Case{2, "SGD"}, Case{2, "AdamW"}),
                         [](const auto& info) {
                           return "stage" + std::to_string(info.param.stage) + "_" +
                                  info.param.optimizer;
                         });

}  // namespace
}  // namespace zero::testing
