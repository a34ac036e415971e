// comm::unowned_view and Work::hold: a temporary handed to a gloo collective as a view that does
// not own it lives exactly as long as the caller or the backend needs it, measured by the
// allocator and by the storage's own reference count.
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <c10/core/StorageImpl.h>

#include <barrier>
#include <cstdio>

#include "comm/unowned_view.hpp"
#include "support/allocator_run.hpp"
#include "support/thread_group.hpp"

namespace zero {
namespace {

using WeakStorage = c10::weak_intrusive_ptr<c10::StorageImpl>;

WeakStorage weak_storage(const at::Tensor& t) {
  return WeakStorage(t.storage().getWeakStorageImpl());
}

TEST(UnownedView, DoesNotKeepItsOwnersMemory) {
  at::Tensor owner = at::arange(8, at::kFloat);
  const WeakStorage weak = weak_storage(owner);
  at::Tensor view = comm::unowned_view(owner);
  EXPECT_EQ(view.data_ptr(), owner.data_ptr());
  EXPECT_TRUE(at::equal(view, owner));
  owner.reset();
  EXPECT_TRUE(weak.expired()) << "the view must not own the memory";
}

// A strided view cannot be handed out by pointer, nor a device tensor: they go as they are.
TEST(UnownedView, ReturnsOtherTensorsAsTheyAre) {
  at::Tensor strided = at::zeros({4, 4}).t();
  EXPECT_TRUE(comm::unowned_view(strided).is_same(strided));
}

TEST(WorkHold, AScriptedWorkKeepsWhatItHoldsUntilWaitedOn) {
  at::Tensor owner = at::zeros({16});
  const WeakStorage weak = weak_storage(owner);
  comm::Work w([] {});
  w.hold(std::move(owner));
  EXPECT_FALSE(weak.expired());
  w.wait();
  EXPECT_TRUE(weak.expired());
}

// The caller drops its owner before waiting: the work keeps the memory while gloo may write into
// it and lets go as it completes, before wait() returns.
TEST(WorkHold, AGlooWorkLetsGoAsItCompletes) {
  testing::run_ranks(2, [](std::shared_ptr<comm::Group> group) {
    for (int round = 0; round < 20; ++round) {
      at::Tensor owner = at::full({1 << 16}, static_cast<float>(group->rank() + 1));
      const WeakStorage weak = weak_storage(owner);
      at::Tensor view = comm::unowned_view(owner);
      comm::Work w = group->broadcast(view, 0, "a broadcast into a held buffer");
      w.hold(std::move(owner));
      w.wait();
      EXPECT_TRUE(weak.expired()) << "round " << round;
    }
    // And what arrives through the view is the root's.
    at::Tensor owner = at::full({1 << 16}, static_cast<float>(group->rank() + 1));
    at::Tensor view = comm::unowned_view(owner);
    group->broadcast(view, 0, "a broadcast through a view").hold(owner).wait();
    EXPECT_TRUE(at::all(owner.eq(1.0f)).item<bool>());
  });
}

// Both ranks broadcast a fresh 16 MiB buffer with a barrier queued behind it, wait, drop it;
// then, with no collective after it (a std::barrier, not the group's), rank 0 reads the
// allocator. Handed over as a view, nothing of it stays.
TEST(WorkHold, NothingOfAHeldBufferStaysAllocated) {
  constexpr int kWorld = 2;
  constexpr int64_t kFloats = 4 << 20;
  std::barrier sync(kWorld);
  int64_t before = 0, after = 0;
  testing::run_ranks(kWorld, [&](std::shared_ptr<comm::Group> group) {
    group->barrier("warm-up");
    sync.arrive_and_wait();
    if (group->rank() == 0) before = testing::settled_host_allocated_bytes();
    sync.arrive_and_wait();
    {
      at::Tensor owner = at::full({kFloats}, static_cast<float>(group->rank()));
      at::Tensor view = comm::unowned_view(owner);
      comm::Work w = group->broadcast(view, 0, "a broadcast").hold(owner);
      group->barrier("a barrier behind it");
      w.wait();
      EXPECT_EQ(owner[kFloats - 1].item<float>(), 0.0f) << "rank 0's values arrived";
    }
    sync.arrive_and_wait();
    if (group->rank() == 0) after = testing::settled_host_allocated_bytes();
    sync.arrive_and_wait();
  });
  std::printf("left allocated after two 16 MiB buffers were broadcast and dropped: %lld B\n",
              static_cast<long long>(after - before));
  EXPECT_LT(after - before, kFloats);  // a quarter of one buffer
}

}  // namespace
}  // namespace zero
