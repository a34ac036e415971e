// Activation checkpointing changes memory, never numbers: the same loss, input and parameter
// gradients bit for bit (dropout included), the same outer random stream, the parameter hooks
// the engine's gradient buckets rely on, and measurably less memory held between the passes.
#include <ATen/ATen.h>
#include <ATen/autocast_mode.h>
#include <gtest/gtest.h>
#include <malloc.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/dropout.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>

#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "support/block_mlp.hpp"
#include "zero/activation_checkpointing.hpp"

namespace zero::testing {
namespace {

using Mlp = BlockMlp;

struct Result {
  at::Tensor loss, x_grad, after;
  std::vector<at::Tensor> grads;
};

Result train(bool ckpt, int micro_batches = 1) {
  at::set_num_threads(1);
  at::manual_seed(0);
  Mlp net(8, 32, 0.1);
  CheckpointOptions opts;
  Result r;
  r.loss = at::zeros({});
  for (int m = 0; m < micro_batches; ++m) {
    at::Tensor x = at::randn({16, 32}).requires_grad_();
    // A random projection: the plain sum of a LayerNorm's output has (almost) zero gradient.
    at::Tensor probe = at::randn({16, 32});
    at::Tensor loss = (net.forward(x, ckpt ? &opts : nullptr) * probe).sum();
    loss.backward();
    r.loss += loss.detach();
    r.x_grad = x.grad();
  }
  r.after = at::rand({8});  // the outer program's next random numbers
  for (const at::Tensor& p : net.parameters()) r.grads.push_back(p.grad().clone());
  return r;
}

void expect_identical(const Result& a, const Result& b) {
  EXPECT_TRUE(at::equal(a.loss, b.loss));
  ASSERT_TRUE(a.x_grad.defined() && b.x_grad.defined());
  EXPECT_TRUE(at::equal(a.x_grad, b.x_grad));
  EXPECT_TRUE(at::equal(a.after, b.after)) << "checkpointing moved the outer random stream";
  ASSERT_EQ(a.grads.size(), b.grads.size());
  for (size_t i = 0; i < a.grads.size(); ++i) {
    EXPECT_TRUE(at::equal(a.grads[i], b.grads[i])) << "parameter " << i;
  }
}

TEST(Checkpoint, DeepModelIsBitwiseIdenticalWithDropout) {
  expect_identical(train(false), train(true));
}

TEST(Checkpoint, GradientAccumulationMatches) { expect_identical(train(false, 2), train(true, 2)); }

TEST(Checkpoint, WithoutRngReplayDropoutMasksDiffer) {
  // Shows that the RNG replay is what makes the equality above hold, not the model.
  auto first_grad = [](bool ckpt, bool preserve) {
    at::set_num_threads(1);
    at::manual_seed(0);
    Mlp net(4, 32, 0.5);
    at::Tensor x = at::randn({16, 32});
    at::Tensor probe = at::randn({16, 32});
    CheckpointOptions opts;
    opts.preserve_rng_state = preserve;
    (net.forward(x, ckpt ? &opts : nullptr) * probe).sum().backward();
    return net.parameters()[0].grad().clone();
  };
  EXPECT_TRUE(at::equal(first_grad(false, true), first_grad(true, true)));
  EXPECT_FALSE(at::equal(first_grad(false, true), first_grad(true, false)));
}

TEST(Checkpoint, AutocastRegionIsReplayedInRecomputation) {
  // backward() runs outside the autocast region; the recomputation must still run in bf16.
  auto first_grad = [](bool ckpt, bool autocast) {
    at::set_num_threads(1);
    at::manual_seed(0);
    Mlp net(3, 32, 0.1);
    at::Tensor x = at::randn({16, 32});
    at::Tensor probe = at::randn({16, 32});
    CheckpointOptions opts;
    at::autocast::set_autocast_dtype(at::kCPU, at::kBFloat16);
    at::autocast::set_autocast_enabled(at::kCPU, autocast);
    at::Tensor loss = (net.forward(x, ckpt ? &opts : nullptr).to(at::kFloat) * probe).sum();
    at::autocast::set_autocast_enabled(at::kCPU, false);
    at::autocast::clear_cache();
    loss.backward();
    return net.parameters()[0].grad().clone();
  };
  const at::Tensor bf16 = first_grad(false, true);
  EXPECT_FALSE(at::equal(bf16, first_grad(false, false))) << "autocast must matter for this test";
  EXPECT_TRUE(at::equal(bf16, first_grad(true, true)));
  EXPECT_FALSE(at::autocast::is_autocast_enabled(at::kCPU));
}

// Records, per parameter, how often its post-accumulate-grad hook fired, and in which order.
struct RecordingHook : torch::autograd::PostAccumulateGradHook {
  RecordingHook(std::string name, std::vector<std::string>* log)
      : name(std::move(name)), log(log) {}
  void operator()(const torch::autograd::Variable& p) override {
    EXPECT_TRUE(p.grad().defined()) << name;
    log->push_back(name);
  }
  std::string name;
  std::vector<std::string>* log;
};

TEST(Checkpoint, ParameterHooksFireForEveryParameterInReverseOrder) {
  at::manual_seed(0);
  Mlp net(6, 16, 0.1);
  std::vector<std::string> log;
  for (const auto& item : net.named_parameters()) {
    torch::autograd::impl::set_post_acc_grad_hooks(
        item.value(), std::make_unique<RecordingHook>(item.key(), &log));
  }
  CheckpointOptions opts;
  at::Tensor x = at::randn({4, 16});  // data: requires no grad, like a real first layer's input
  at::Tensor loss = net.forward(x, &opts).sum();
  EXPECT_TRUE(log.empty()) << "no gradient may be produced before backward";
  loss.backward();

  std::map<std::string, int> fired;
  for (const std::string& n : log) ++fired[n];
  ASSERT_EQ(fired.size(), net.parameters().size());
  for (const auto& [name, count] : fired) EXPECT_EQ(count, 1) << name;
  // Buckets fill from the last layer back: block k's parameters all come before block k-1's.
  auto block_of = [](const std::string& n) {
    return std::stoi(n.substr(n.find_first_of("0123456789")));
  };
  for (size_t i = 1; i < log.size(); ++i) EXPECT_LE(block_of(log[i]), block_of(log[i - 1]));
}

TEST(Checkpoint, EvalModeJustRunsTheBlock) {
  at::manual_seed(0);
  Mlp net(3, 16, 0.1);
  net.eval();
  at::Tensor x = at::randn({4, 16});
  at::NoGradGuard no_grad;
  int calls = 0;
  CheckpointOptions opts;
  at::Tensor y = checkpoint(
      [&](const at::Tensor& t) {
        ++calls;
        return net.forward(t);
      },
      x, opts);
  EXPECT_EQ(calls, 1);
  EXPECT_FALSE(y.requires_grad());
  EXPECT_TRUE(at::equal(y, net.forward(x)));
}

TEST(Checkpoint, MultipleInputsAndOutputs) {
  at::set_num_threads(1);
  at::manual_seed(0);
  const at::Tensor w = at::randn({8}).requires_grad_();
  Block fn = [&](const std::vector<at::Tensor>& in) -> std::vector<at::Tensor> {
    const at::Tensor& a = in[0];
    const at::Tensor& b = in[1];
    return {a * b + w, (a.sin() * w).sum(1), a.argmax(1), (b * 3).exp()};
  };
  auto run = [&](bool ckpt) {
    at::Tensor a = at::randn({4, 8}).requires_grad_();
    at::Tensor b = at::randn({4, 8}).requires_grad_();
    std::vector<at::Tensor> out = ckpt ? checkpoint(fn, {a, b}) : fn({a, b});
    EXPECT_FALSE(out[2].requires_grad()) << "an integer output is not differentiable";
    // out[3] is left out of the loss: its incoming gradient is undefined.
    (out[0].pow(2).sum() + out[1].pow(3).sum()).backward();
    std::vector<at::Tensor> g = {a.grad(), b.grad(), w.grad().clone()};
    w.mutable_grad().reset();
    return g;
  };
  at::manual_seed(3);
  auto plain = run(false);
  at::manual_seed(3);
  auto ckpt = run(true);
  for (size_t i = 0; i < plain.size(); ++i) EXPECT_TRUE(at::equal(plain[i], ckpt[i])) << i;
}

TEST(Checkpoint, InputsNotRequiringGradGetNone) {
  at::set_num_threads(1);
  at::manual_seed(0);
  torch::nn::Linear fc(8, 8);
  Block fn = [&](const std::vector<at::Tensor>& in) -> std::vector<at::Tensor> {
    return {fc(in[0]) * in[1]};
  };
  at::Tensor a = at::randn({4, 8}).requires_grad_();
  at::Tensor mask = (at::rand({4, 8}) > 0.5).to(at::kFloat);
  at::Tensor data = at::randn({4, 8});

  checkpoint(fn, {a, mask})[0].sum().backward();
  EXPECT_TRUE(a.grad().defined());
  EXPECT_FALSE(mask.grad().defined());
  fc->zero_grad();

  // No input requires grad at all: the block's parameters must still get their gradients.
  checkpoint(fn, {data, mask})[0].sum().backward();
  at::Tensor ckpt_grad = fc->weight.grad().clone();
  fc->zero_grad();
  fn({data, mask})[0].sum().backward();
  EXPECT_TRUE(at::equal(ckpt_grad, fc->weight.grad()));
}

TEST(Checkpoint, RetainGraphBackwardsTwiceAndPlainSecondBackwardFails) {
  at::manual_seed(0);
  Mlp net(3, 16, 0.1);
  CheckpointOptions opts;
  at::Tensor x = at::randn({4, 16});
  at::Tensor loss = (net.forward(x, &opts) * at::randn({4, 16})).sum();
  loss.backward({}, /*retain_graph=*/true);
  at::Tensor once = net.parameters()[0].grad().clone();
  loss.backward();
  EXPECT_TRUE(at::equal(net.parameters()[0].grad(), once * 2));
  EXPECT_THROW(loss.backward(), c10::Error);
}

// Bytes glibc has handed out and not got back: arenas plus mmapped chunks.
int64_t heap_in_use() {
  const struct mallinfo2 m = mallinfo2();
  return static_cast<int64_t>(m.uordblks + m.hblkhd);
}

int64_t held_after_forward(bool ckpt) {
  at::set_num_threads(1);
  at::manual_seed(0);
  Mlp net(16, 1024, 0.1);
  at::Tensor x = at::randn({64, 1024});
  CheckpointOptions opts;
  const int64_t before = heap_in_use();
  at::Tensor loss = net.forward(x, ckpt ? &opts : nullptr).sum();
  const int64_t held = heap_in_use() - before;
  loss.backward();  // and the graph is usable
  EXPECT_TRUE(net.parameters()[0].grad().defined());
  return held;
}

TEST(Checkpoint, HoldsMuchLessMemoryBetweenForwardAndBackward) {
  const int64_t plain = held_after_forward(false);
  const int64_t ckpt = held_after_forward(true);
  std::printf(
      "heap held after forward, 16 blocks of 64x1024: plain %.2f MiB, checkpointed %.2f MiB\n",
      plain / 1048576.0, ckpt / 1048576.0);
  // Each block saves ~4 activations of 256 KiB without checkpointing, one (its input) with it.
  EXPECT_GT(plain, 16 * 3 * 64 * 1024 * 4);
  EXPECT_LT(ckpt * 3, plain);
}

}  // namespace
}  // namespace zero::testing
