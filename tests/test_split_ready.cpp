// The agreement C10dGroup::split makes before ncclCommSplit (review 2026-12-07a L3): the split
// blocks without a timeout, so a rank that fails before it (its NCCL group could not be made, the
// parent has no communicator) or never comes must be known to every rank before any enters it.
// comm::agree_through_store over one store, ranks as threads: every rank gets the same text
// naming the failing rank and its reason, or the rank that never posted, within the timeout.
#include <gtest/gtest.h>
#include <torch/csrc/distributed/c10d/HashStore.hpp>

#include <algorithm>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "comm/c10d_group.hpp"

namespace zero::comm {
namespace {

using std::chrono::milliseconds;

// Runs agree_through_store on `size` threads, rank r posting problems[r]; ranks listed in
// `absent` never post. Returns each posting rank's result and the seconds it took.
std::vector<std::pair<std::string, double>> agree(int size,
                                                  const std::vector<std::string>& problems,
                                                  const std::vector<int>& absent,
                                                  milliseconds timeout) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  std::vector<std::pair<std::string, double>> out(size);
  std::vector<std::thread> threads;
  for (int r = 0; r < size; ++r) {
    if (std::find(absent.begin(), absent.end(), r) != absent.end()) continue;
    threads.emplace_back([&, r] {
      const auto t0 = std::chrono::steady_clock::now();
      out[r].first = agree_through_store(*store, "split/0/ready/", r, size, problems[r], timeout);
      out[r].second = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    });
  }
  for (auto& t : threads) t.join();
  return out;
}

TEST(SplitReady, EveryRankReadyAgreesOnNothing) {
  for (const auto& [text, seconds] : agree(4, {"", "", "", ""}, {}, milliseconds(5000))) {
    EXPECT_EQ(text, "");
    EXPECT_LT(seconds, 2.0);
  }
}

TEST(SplitReady, AFailedRankIsNamedOnEveryRankWithItsReason) {
  const auto got =
      agree(3, {"", "making its NCCL group failed (no GPU 5)", ""}, {}, milliseconds(5000));
  for (const auto& [text, seconds] : got) {
    EXPECT_EQ(text, "rank 1: making its NCCL group failed (no GPU 5)");
    EXPECT_LT(seconds, 2.0);  // no one waited for the timeout
  }
}

TEST(SplitReady, ARankThatNeverComesIsNamedAfterTheTimeout) {
  const auto got = agree(3, {"", "", "no communicator"}, {1}, milliseconds(500));
  for (int r : {0, 2}) {
    SCOPED_TRACE("rank " + std::to_string(r));
    EXPECT_EQ(got[r].first, "rank 2: no communicator; rank 1 did not reach it within 0.5 s");
    EXPECT_GE(got[r].second, 0.45);
    EXPECT_LT(got[r].second, 5.0);
  }
}

}  // namespace
}  // namespace zero::comm
