// comm::LentTensor: a temporary handed to a gloo collective by pointer is freed when its owner
// is done with it, measured by the allocator, whatever c10d still holds of the finished work.
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <c10/core/StorageImpl.h>

#include <barrier>
#include <chrono>
#include <cstdio>
#include <stdexcept>
#include <thread>

#include "comm/lent_tensor.hpp"
#include "support/thread_group.hpp"
#include "zero/device.hpp"

namespace zero {
namespace {

constexpr int64_t kFloats = 4 << 20;  // 16 MiB per rank, well above the allocator's noise
constexpr int64_t kBytes = kFloats * 4;

int64_t settled_reading() {
  int64_t last = host_allocated_bytes();
  for (int same = 0, i = 0; same < 3 && i < 500; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
    const int64_t now = host_allocated_bytes();
    same = now == last ? same + 1 : 0;
    last = now;
  }
  return last;
}

// Both ranks broadcast a fresh buffer (a barrier queued behind it), wait, drop it; then, with no
// collective after it (a std::barrier, not the group's), rank 0 reads the allocator. Returns what
// stayed allocated.
int64_t bytes_left_after_a_broadcast(bool lend) {
  constexpr int kWorld = 2;
  std::barrier sync(kWorld);
  int64_t before = 0, after = 0;
  testing::run_ranks(kWorld, [&](std::shared_ptr<comm::Group> group) {
    group->barrier("warm-up");
    sync.arrive_and_wait();
    if (group->rank() == 0) before = settled_reading();
    sync.arrive_and_wait();
    {
      at::Tensor buffer = at::full({kFloats}, static_cast<float>(group->rank()));
      if (lend) {
        comm::LentTensor t(std::move(buffer));
        comm::Work w = group->broadcast(t.lent(), 0, "a lent broadcast");
        group->barrier("a barrier behind it");
        w.wait();
        EXPECT_EQ(t.owner()[kFloats - 1].item<float>(), 0.0f) << "rank 0's values arrived";
      } else {
        comm::Work w = group->broadcast(buffer, 0, "a plain broadcast");
        group->barrier("a barrier behind it");
        w.wait();
        EXPECT_EQ(buffer[kFloats - 1].item<float>(), 0.0f) << "rank 0's values arrived";
      }
    }
    sync.arrive_and_wait();
    if (group->rank() == 0) after = settled_reading();
    sync.arrive_and_wait();
  });
  return after - before;
}

TEST(LentTensor, FreedWhenItsOwnerIsDoneNotWhenGlooNextRuns) {
  const int64_t plain = bytes_left_after_a_broadcast(false);
  const int64_t lent = bytes_left_after_a_broadcast(true);
  std::printf("left allocated after a 2 x %lld B broadcast: handed directly %lld B, lent %lld B\n",
              static_cast<long long>(kBytes), static_cast<long long>(plain),
              static_cast<long long>(lent));
  // Handed directly, a buffer outlives its owner only on some runs (which thread runs what, and
  // when; seen in the engine's start-up under load, StagesAndDtypes/OffloadAllocator and
  // AllocatorMemory.Bf16GradientShardTakesTwoBytesPerElement), so only the lent one is asserted.
  EXPECT_LT(lent, kBytes / 4);
}

TEST(LentTensor, KeepsItsOwnerIfACollectiveOnItFailed) {
  c10::weak_intrusive_ptr<c10::StorageImpl> weak(c10::make_intrusive<c10::StorageImpl>(
      c10::StorageImpl::use_byte_size_t(), 0, at::DataPtr(), nullptr, false));
  try {
    comm::LentTensor t(at::zeros({16}));
    weak = c10::weak_intrusive_ptr<c10::StorageImpl>(t.owner().storage().getWeakStorageImpl());
    throw std::runtime_error("a collective failed");
  } catch (const std::runtime_error&) {
  }
  EXPECT_FALSE(weak.expired()) << "the collective might still write into it";
  {
    comm::LentTensor t(at::zeros({16}));
    weak = c10::weak_intrusive_ptr<c10::StorageImpl>(t.owner().storage().getWeakStorageImpl());
  }
  EXPECT_TRUE(weak.expired()) << "freed with its owner on the normal path";
}

// Device tensors (here a strided view, which cannot be lent either) go to the collective as they
// are.
TEST(LentTensor, LendsOnlyContiguousHostTensors) {
  at::Tensor strided = at::zeros({4, 4}).t();
  comm::LentTensor t(strided);
  EXPECT_TRUE(t.lent().is_same(strided));
  comm::LentTensor c(at::zeros({8}));
  EXPECT_FALSE(c.lent().is_same(c.owner()));
  EXPECT_EQ(c.lent().data_ptr(), c.owner().data_ptr());
}

}  // namespace
}  // namespace zero
