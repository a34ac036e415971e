// Offload's gradient pieces leaving the fake accelerator (zero/grads/grad_to_host.hpp): the
// norm summed on the device, and later pieces finding a slot behind direct copies.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <chrono>

#include "device/pinned_host.hpp"
#include "support/fake_device.hpp"
#include "zero/grads/grad_to_host.hpp"

namespace zero::testing {
namespace {

// Offload's gradient pieces leave the device in fp32 (grad_to_host.hpp), and their squared norm
// is summed on the device as they go: the step reads no host memory for it. A range that gets a
// second piece (summed on the host) leaves the device without the norm, and so does a CPU run.
TEST(FakeDeviceGradToHost, NormOfTheShardIsSummedOnTheDevice) {
  const c10::Device d = fake::device(0);
  GradToHost to_host(d, /*slot_numel=*/5, at::kBFloat16, at::kFloat);
  at::Tensor shard = device::host_zeros(10, /*pin=*/true).fill_(7);  // last window's values
  auto gen = at::detail::createCPUGenerator(5);
  const at::Tensor values = at::randn({10}, gen).to(at::kBFloat16);
  to_host.new_window();
  for (int k = 0; k < 2; ++k) {
    const at::Tensor piece = values.narrow(0, 5 * k, 5).to(d);
    to_host.wait(to_host.send(piece, shard.narrow(0, 5 * k, 5), /*add=*/true));
  }
  to_host.finish(shard);
  EXPECT_TRUE(at::equal(shard, values.to(at::kFloat)));
  const at::Tensor sq = to_host.squared_norm();
  ASSERT_TRUE(sq.defined());
  EXPECT_EQ(sq.device(), d);
  const double want = shard.square().sum().item<double>();
  EXPECT_NEAR(sq.cpu().item<double>(), want, 1e-6 * want);
  // A second piece into a written range: the sum, and so the norm, is the host's.
  to_host.send(values.narrow(0, 0, 5).to(d), shard.narrow(0, 0, 5), /*add=*/true);
  to_host.finish(shard);
  EXPECT_FALSE(to_host.squared_norm().defined());
  to_host.new_window();
  GradToHost on_host(at::kCPU, 5, at::kBFloat16, at::kFloat);
  on_host.new_window();
  on_host.send(values.narrow(0, 0, 5), shard.narrow(0, 0, 5), /*add=*/true);
  EXPECT_FALSE(on_host.squared_norm().defined());
}

// Direct copies (a range's first piece) and slot copies (a later piece, summed on the host) share
// one queue: with every slot busy and direct copies older than them, the next later piece must
// land copies until a slot is free, not just the oldest (a direct one, which frees none). Three
// ranges first get one piece each (three direct copies in flight), then four more rounds of
// pieces go through the three slots; the events finish late, so nothing lands early.
TEST(FakeDeviceGradToHost, LaterPiecesFindASlotBehindDirectCopies) {
  fake::set_event_delay(std::chrono::milliseconds(2));
  struct Restore {
    ~Restore() { fake::set_event_delay(std::chrono::microseconds(0)); }
  } restore;
  const c10::Device d = fake::device(0);
  constexpr int kRanges = 3, kRounds = 5, kNumel = 4;
  GradToHost to_host(d, kNumel, at::kFloat, at::kFloat);
  at::Tensor shard = device::host_zeros(kRanges * kNumel, /*pin=*/true).fill_(7);
  auto gen = at::detail::createCPUGenerator(11);
  const at::Tensor pieces = at::randn({kRounds, kRanges * kNumel}, gen);
  to_host.new_window();
  for (int round = 0; round < kRounds; ++round) {
    for (int r = 0; r < kRanges; ++r) {
      const at::Tensor piece = pieces[round].narrow(0, r * kNumel, kNumel).to(d);
      to_host.wait(to_host.send(piece, shard.narrow(0, r * kNumel, kNumel), /*add=*/true));
    }
  }
  to_host.finish(shard);
  // The reference: the pieces summed in fp32 in the order they were sent.
  at::Tensor want = at::zeros({kRanges * kNumel});
  for (int round = 0; round < kRounds; ++round) want.add_(pieces[round]);
  EXPECT_TRUE(at::allclose(shard, want, 1e-6, 1e-6));
}

}  // namespace
}  // namespace zero::testing
