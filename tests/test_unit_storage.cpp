// Stage 3's release and re-gather of a unit's bytes (design sharded-units.md §3.2), on the CPU
// and on the fake accelerator: a model whose unit storage is freed after forward and refilled
// before backward computes gradients bitwise equal to an untouched copy's, because what autograd
// saved (the parameters, views such as weight.t()) sees the refilled bytes.
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>

#include <memory>
#include <vector>

#include "support/fake_device.hpp"
#include "zero/units/unit_storage.hpp"

namespace zero::units {
namespace {

struct Net : torch::nn::Module {
  Net() {
    embed = register_module("embed", torch::nn::Embedding(10, 8));
    fc = register_module("fc", torch::nn::Linear(8, 6));
    norm = register_module("norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({6})));
    out = register_module("out", torch::nn::Linear(6, 5));
  }
  // tokens [2, 3] -> a 3-D path (embedding, Linear on [2, 3, 8], LayerNorm) and a 2-D one (the
  // last Linear on the flattened rows).
  at::Tensor loss(const at::Tensor& tokens, const at::Tensor& x2d) {
    at::Tensor h = norm(fc(embed(tokens)));           // [2, 3, 6]
    at::Tensor y = out(at::gelu(h).reshape({6, 6}));  // [6, 5]
    at::Tensor z = out(x2d);                          // [4, 5]: x2d needs its own gradient
    return (y * y).sum() + (z * z * z).sum();
  }
  torch::nn::Embedding embed{nullptr};
  torch::nn::Linear fc{nullptr}, out{nullptr};
  torch::nn::LayerNorm norm{nullptr};
};

std::shared_ptr<Net> twin(const Net& src, c10::Device d) {
  auto n = std::make_shared<Net>();
  n->to(d);
  at::NoGradGuard g;
  auto from = src.parameters();
  auto to = n->parameters();
  for (size_t i = 0; i < to.size(); ++i) to[i].copy_(from[i]);
  return n;
}

// The net's parameters moved into one buffer, 3 elements of padding after each (a sharded
// layout pads), values copied in.
UnitStorage unit_of(Net& n) {
  std::vector<UnitStorage::Param> ps;
  int64_t offset = 0;
  for (const at::Tensor& p : n.parameters()) {
    ps.push_back({p, offset});
    offset += p.numel() + 3;
  }
  const at::Tensor first = n.parameters().front();
  at::Tensor buffer = at::zeros({offset}, first.options().requires_grad(false));
  {
    at::NoGradGuard g;
    for (const auto& p : ps)
      buffer.narrow(0, p.offset, p.tensor.numel()).copy_(p.tensor.reshape({-1}));
  }
  return UnitStorage(buffer, std::move(ps));
}

struct Grads {
  std::vector<at::Tensor> params;
  at::Tensor x2d;
};

Grads grads_of(Net& n, const at::Tensor& x2d) {
  Grads g;
  for (const at::Tensor& p : n.parameters()) g.params.push_back(p.grad().cpu());
  g.x2d = x2d.grad().cpu();
  return g;
}

// Forward on `n` (its parameters in `st`), release, refill with `refill(saved)`, backward.
Grads released_between(Net& n, UnitStorage& st, const at::Tensor& tokens, const at::Tensor& x,
                       const std::function<at::Tensor(const at::Tensor&)>& refill,
                       int64_t* freed_bytes, int fake_index = -1) {
  const at::Tensor x2d = x.clone().requires_grad_(true);
  at::Tensor loss = n.loss(tokens, x2d);
  const at::Tensor saved = st.buffer().clone();
  const int64_t before = fake_index >= 0 ? testing::fake::allocated_bytes(fake_index) : 0;
  st.release();
  EXPECT_FALSE(st.allocated());
  for (const at::Tensor& p : n.parameters()) EXPECT_EQ(p.numel(), 0);
  if (fake_index >= 0) *freed_bytes = before - testing::fake::allocated_bytes(fake_index);
  st.allocate();
  if (fake_index >= 0) {
    EXPECT_EQ(testing::fake::allocated_bytes(fake_index), before) << "allocate() returns the bytes";
  }
  {
    at::NoGradGuard g;
    st.buffer().copy_(refill(saved));
  }
  st.view_params();
  loss.backward();
  return grads_of(n, x2d);
}

void check_bitwise_on(c10::Device d, int fake_index) {
  Net ref_src;
  auto ref = twin(ref_src, d);
  auto net = twin(ref_src, d);
  UnitStorage st = unit_of(*net);
  const at::Tensor tokens = at::randint(0, 10, {2, 3}, at::kLong).to(d);
  const at::Tensor x = at::randn({4, 6}).to(d);

  const at::Tensor x2d_ref = x.clone().requires_grad_(true);
  ref->loss(tokens, x2d_ref).backward();
  const Grads want = grads_of(*ref, x2d_ref);

  int64_t freed = 0;
  const Grads got = released_between(
      *net, st, tokens, x, [](const at::Tensor& s) { return s; }, &freed, fake_index);
  ASSERT_EQ(got.params.size(), want.params.size());
  for (size_t i = 0; i < want.params.size(); ++i) {
    EXPECT_TRUE(at::equal(got.params[i], want.params[i])) << "parameter " << i;
  }
  EXPECT_TRUE(at::equal(got.x2d, want.x2d));
  if (fake_index >= 0) EXPECT_EQ(freed, st.nbytes());

  // The refilled bytes are what backward reads: refilled with zeros, the gradient that flows
  // through the weights (to x2d: dz @ W) is zero.
  for (auto& p : net->parameters()) p.mutable_grad() = at::Tensor();
  const Grads zeroed = released_between(
      *net, st, tokens, x, [](const at::Tensor& s) { return at::zeros_like(s); }, &freed,
      fake_index);
  EXPECT_TRUE(at::equal(zeroed.x2d, at::zeros_like(zeroed.x2d)));
  EXPECT_FALSE(at::equal(want.x2d, at::zeros_like(want.x2d)));
}

TEST(UnitStorage, ReleasedAndRefilledGradientsAreBitwiseTheUntouchedModelsOnCpu) {
  check_bitwise_on(c10::Device(c10::kCPU), -1);
}

TEST(UnitStorage, ReleasedAndRefilledGradientsAreBitwiseTheUntouchedModelsOnFakeDevice) {
  check_bitwise_on(testing::fake::device(1), 1);
}

TEST(UnitStorage, ReleaseFreesTheBytesAndAModuleRunOutsideItsUnitThrows) {
  const c10::Device d = testing::fake::device(2);
  Net src;
  auto net = twin(src, d);
  const int64_t before = testing::fake::allocated_bytes(2);
  UnitStorage st = unit_of(*net);  // the parameters' old storages go, the buffer comes
  const int64_t with_buffer = testing::fake::allocated_bytes(2);
  st.release();
  st.release();  // no-op
  EXPECT_EQ(with_buffer - testing::fake::allocated_bytes(2), st.nbytes());
  EXPECT_LE(testing::fake::allocated_bytes(2), before);
  const at::Tensor x = at::randn({4, 6}).to(d);
  EXPECT_THROW(net->out(x), c10::Error);  // PyTorch's shape error, not a read of freed memory
  EXPECT_THROW(st.view_params(), c10::Error);
  const int64_t released = testing::fake::allocated_bytes(2);
  st.allocate();
  st.allocate();  // no-op
  EXPECT_EQ(testing::fake::allocated_bytes(2) - released, st.nbytes());
  st.view_params();
  EXPECT_EQ(net->out->weight.sizes(), (at::IntArrayRef{5, 6}));
  // Each parameter (the same tensor object as before) is a view at its offset again.
  for (const auto& p : st.params()) {
    EXPECT_EQ(p.tensor.data_ptr(), static_cast<char*>(st.buffer().data_ptr()) +
                                       p.offset * static_cast<int64_t>(sizeof(float)));
  }
  EXPECT_TRUE(st.params()[5].tensor.is_same(net->out->weight));
}

TEST(UnitStorage, RejectsABufferThatDoesNotHoldItsParameters) {
  at::Tensor p = at::zeros({4});
  EXPECT_THROW(UnitStorage(at::zeros({3}), {{p, 0}}), c10::Error);
  EXPECT_THROW(UnitStorage(at::zeros({8}).narrow(0, 2, 5), {{p, 0}}), c10::Error);
  EXPECT_THROW(UnitStorage(at::zeros({8}, at::kDouble), {{p, 0}}), c10::Error);
}

}  // namespace
}  // namespace zero::units
