// The engine's gradient norm on a CPU run against the same gradient's norm in double: ATen's
// fp32 vector_norm over one bucket of 2^24 elements is 1.3e-3 off (it accumulates the whole
// tensor in float lanes), which clipping would carry into every step.
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>

#include <torch/nn/modules/linear.h>

#include <mutex>

#include "support/thread_group.hpp"
#include "zero/engine.hpp"

namespace zero::testing {
namespace {

TEST(GradNorm, LargeBucketWithinAMillionthOfTheDoubleNorm) {
  // One parameter of 4096 x 4099 = 2^24 + 12288 elements: its bucket (and shard at world 1) is
  // that large.
  const int64_t in = 4099, out = 4096;
  for (const int stage : {1, 2}) {
    SCOPED_TRACE("stage " + std::to_string(stage));
    Config cfg;
    cfg.zero_optimization.stage = stage;
    cfg.train_micro_batch_size_per_gpu = 2;
    cfg.optimizer.type = "SGD";
    cfg.optimizer.lr = 0.0;
    double got = 0, want = 0;
    run_ranks(1, [&](std::shared_ptr<comm::Group> group) {
      at::Generator gen = at::detail::createCPUGenerator(5);
      torch::nn::Linear net(torch::nn::LinearOptions(in, out).bias(false));
      {
        at::NoGradGuard no_grad;
        net->weight.copy_(at::randn({out, in}, gen) * 0.01);
      }
      const at::Tensor x = at::randn({2, in}, gen), w = at::randn({2, out}, gen);
      // The reference gradient, by plain autograd before the engine takes the module.
      const at::Tensor ref = torch::autograd::grad({(net->forward(x) * w).sum()}, {net->weight})[0];
      want = std::sqrt(ref.to(at::kDouble).square().sum().item<double>());
      auto engine = initialize(net.ptr(), cfg, group);
      engine.backward((net->forward(x) * w).sum());
      engine.step();
      got = engine.stats().last_grad_norm;
    });
    EXPECT_NEAR(got, want, 1e-6 * want);
  }
}

}  // namespace
}  // namespace zero::testing
