// The fake accelerator itself (tests/support/fake_device.hpp), what the test_fake_device_*.cpp
// engine tests rely on: its allocator counts every byte, its memory is distinct from the host's,
// its collectives are staged through the host, and the host's wait for its events sleeps.
#include <ATen/ATen.h>
#include <c10/core/Event.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <gtest/gtest.h>
#include <time.h>

#include <chrono>
#include <memory>

#include "device/event_wait.hpp"
#include "support/fake_device.hpp"
#include "support/thread_group.hpp"

namespace zero::testing {
namespace {

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
  // Pinned host memory is the backend's, and counted; as CUDA's caching host allocator does,
  // it rounds a block up to a power of two (1000 bytes take 1024).
  const int64_t pinned = fake::pinned_in_use_bytes();
  at::Tensor p = at::empty({250}, at::TensorOptions().pinned_memory(true));
  EXPECT_TRUE(p.is_pinned());
  EXPECT_EQ(fake::pinned_in_use_bytes() - pinned, 1024);
}

// Gloo cannot read fake tensors: a group on the fake device type runs each collective on host
// copies and copies the result back at wait(). Each rank's values differ, so a result left on
// the host copy, or a rank's chunk misplaced, shows.
TEST(FakeDeviceGroup, CollectivesStagedThroughTheHostReachTheDevice) {
  run_ranks(
      2,
      [](std::shared_ptr<comm::Group> g) {
        const c10::Device d = fake::device(g->rank());
        const double r = g->rank();
        at::Tensor t = at::full({4}, r + 1, at::TensorOptions().device(d));
        g->all_reduce_sum(t, "all_reduce").wait();
        EXPECT_EQ(t.device(), d);
        EXPECT_TRUE(at::equal(t.cpu(), at::full({4}, 3.0)));

        at::Tensor in = at::arange(6, at::kFloat).add(10 * r).to(d);  // rank r: 10r + [0..5]
        at::Tensor out = at::empty({3}, in.options());
        g->reduce_scatter_sum(out, in, "reduce_scatter").wait();
        // Chunk k summed over ranks: (0+10) + 2 x [3k..3k+2].
        EXPECT_TRUE(at::equal(out.cpu(), at::arange(3, at::kFloat).add(3 * r).mul(2).add(10)));

        at::Tensor mine = at::full({2}, r, in.options());
        at::Tensor all = at::empty({4}, in.options());
        g->all_gather(all, mine, "all_gather").wait();
        EXPECT_TRUE(at::equal(all.cpu(), at::tensor({0.0f, 0.0f, 1.0f, 1.0f})));

        // all_to_all: chunk s of rank r's input becomes chunk r of rank s's output.
        at::Tensor send = at::arange(4, at::kFloat).add(10 * r).to(d);  // 10r + [0..3]
        at::Tensor recv = at::empty({4}, send.options());
        g->all_to_all(recv, send, "all_to_all").wait();
        EXPECT_EQ(recv.device(), d);
        EXPECT_TRUE(at::equal(
            recv.cpu(), at::tensor({2 * r, 2 * r + 1, 10 + 2 * r, 11 + 2 * r}).to(at::kFloat)));

        at::Tensor b = at::full({3}, r + 5, in.options());
        g->broadcast(b, 1, "broadcast").wait();
        EXPECT_TRUE(at::equal(b.cpu(), at::full({3}, 6.0)));
        // A host tensor handed to a fake-device group is a mix-up, refused by name.
        at::Tensor host = at::ones({2});
        EXPECT_THROW(g->all_reduce_sum(host, "all_reduce of a host tensor"), c10::Error);
      },
      std::chrono::seconds(60), fake::device().type());
}

// The host's wait for a device event polls and sleeps instead of spinning (cudaEventSynchronize
// spins under CUDA's default scheduling): over a 40 ms wait the thread uses a fraction of a core.
TEST(FakeDeviceEvents, HostWaitForAnEventSleeps) {
  fake::set_event_delay(std::chrono::milliseconds(40));
  struct Restore {
    ~Restore() { fake::set_event_delay(std::chrono::microseconds(0)); }
  } restore;
  const c10::Device d = fake::device(0);
  const c10::impl::VirtualGuardImpl guard(d.type());
  c10::Event event(d.type());
  event.record(guard.getStream(d));
  const auto cpu_now = [] {
    timespec ts{};
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return std::chrono::seconds(ts.tv_sec) + std::chrono::nanoseconds(ts.tv_nsec);
  };
  const auto wall0 = std::chrono::steady_clock::now();
  const auto cpu0 = cpu_now();
  device::wait_for_event(event);
  const auto wall = std::chrono::steady_clock::now() - wall0;
  const auto cpu = cpu_now() - cpu0;
  EXPECT_TRUE(event.query());
  EXPECT_GE(wall, std::chrono::milliseconds(35));
  EXPECT_LT(cpu, wall / 4) << "cpu " << std::chrono::duration<double>(cpu).count() << " s of "
                           << std::chrono::duration<double>(wall).count() << " s";
}

}  // namespace
}  // namespace zero::testing
