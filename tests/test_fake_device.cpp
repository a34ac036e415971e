// The engine on a fake accelerator (tests/support/fake_device.hpp): parameters that are not CPU
// tensors, so the device half of every path runs (pinned staging, copy streams and events, the
// device read-back, collectives staged through the host), and a host/device mix-up throws.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "support/fake_device.hpp"

namespace zero::testing {
namespace {

// The device itself first: what the engine tests below rely on.
TEST(FakeDevice, CountsEveryByteAndCopiesBetweenDistinctMemories) {
  const c10::Device dev = fake::device(3);
  const int64_t before = fake::allocated_bytes(3);
  fake::reset_peak(3);
  {
    at::Tensor host = at::arange(10, at::kFloat);
    at::Tensor d = host.to(dev);
    EXPECT_EQ(d.device(), dev);
    EXPECT_EQ(fake::allocated_bytes(3) - before, 40);
    // Kernels run (CPU fallback); views alias.
    at::Tensor v = d.narrow(0, 2, 4);
    v.mul_(2);
    at::Tensor back = d.cpu();
    EXPECT_EQ(back[3].item<float>(), 6.0f);
    EXPECT_EQ(host[3].item<float>(), 3.0f);  // distinct memory: the host copy is untouched
    at::Tensor sum = (d + d).sum();
    EXPECT_EQ(sum.device(), dev);
    EXPECT_EQ(sum.item<float>(), 2 * (45.0f + 2 + 3 + 4 + 5));
    // A mix-up throws as on a GPU.
    EXPECT_ANY_THROW(d.add_(host));
  }
  EXPECT_EQ(fake::allocated_bytes(3), before);
  EXPECT_GE(fake::peak_bytes(3) - before, 80);
  // Pinned host memory is the backend's, and counted.
  const int64_t pinned = fake::pinned_bytes();
  at::Tensor p = at::empty({256}, at::TensorOptions().pinned_memory(true));
  EXPECT_TRUE(p.is_pinned());
  EXPECT_EQ(fake::pinned_bytes() - pinned, 1024);
}

}  // namespace
}  // namespace zero::testing
