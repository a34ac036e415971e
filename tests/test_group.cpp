// comm::Group beyond the collectives: split() into subgroups, point-to-point send/recv (and what
// a receive whose sender never sends says), and the interface a fake group implements.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "comm/group.hpp"
#include "comm/mesh.hpp"
#include "support/thread_group.hpp"
#include "zero/errors.hpp"

namespace zero::comm {
namespace {

// Sum of (r + 1) over the world ranks `ranks`: what an all-reduce of (global rank + 1) gives.
float sum_of(const std::vector<int>& ranks) {
  float s = 0;
  for (int r : ranks) s += static_cast<float>(r + 1);
  return s;
}

float reduced(Group& g, float value) {
  at::Tensor t = at::full({4}, value);
  g.all_reduce_sum(t, "all_reduce in " + g.name()).wait();
  return t[0].item<float>();
}

// Ranks with the same color form a group, ordered by key (here: reversed), and each group's
// all-reduce sums over exactly its own ranks.
TEST(GroupSplit, ColorsFormGroupsOrderedByKey) {
  testing::run_ranks(5, [](std::shared_ptr<Group> world) {
    const int me = world->rank();
    auto g = world->split(me % 2, /*key=*/-me, "parity");
    ASSERT_TRUE(g);
    const std::vector<int> members =
        me % 2 == 0 ? std::vector<int>{4, 2, 0} : std::vector<int>{3, 1};
    ASSERT_EQ(g->size(), static_cast<int>(members.size()));
    EXPECT_EQ(g->name(), "parity");
    for (int i = 0; i < g->size(); ++i) EXPECT_EQ(g->global_rank(i), members[i]);
    EXPECT_EQ(members[g->rank()], me);
    EXPECT_EQ(reduced(*g, me + 1.0f), sum_of(members));

    // Broadcast from the group's rank 0 (world rank 4 or 3): group ranks, not world ranks.
    at::Tensor b = at::full({2}, static_cast<float>(me));
    g->broadcast(b, 0, "broadcast in parity").wait();
    EXPECT_EQ(b[0].item<float>(), static_cast<float>(members[0]));

    // The world still works beside its subgroups.
    EXPECT_EQ(reduced(*world, me + 1.0f), sum_of({0, 1, 2, 3, 4}));
  });
}

// A second split with the same colors gets a store namespace of its own, a split of a split
// works, and a negative color takes no part.
TEST(GroupSplit, RepeatedNestedAndLeftOut) {
  testing::run_ranks(4, [](std::shared_ptr<Group> world) {
    const int me = world->rank();
    auto a = world->split(me / 2, me);  // {0,1} {2,3}
    auto b = world->split(me / 2, me);  // the same ranks, another backend
    ASSERT_TRUE(a && b);
    EXPECT_EQ(a->name(), "world/split 0 color " + std::to_string(me / 2));
    EXPECT_EQ(b->name(), "world/split 1 color " + std::to_string(me / 2));
    const std::vector<int> pair = me < 2 ? std::vector<int>{0, 1} : std::vector<int>{2, 3};
    EXPECT_EQ(reduced(*b, me + 1.0f), sum_of(pair));
    EXPECT_EQ(reduced(*a, me + 1.0f), sum_of(pair));

    // Rank 3 sits this one out; the others form {0, 1, 2}.
    auto c = world->split(me == 3 ? -1 : 7, 0, "three");
    if (me == 3) {
      EXPECT_FALSE(c);
    } else {
      ASSERT_TRUE(c);
      EXPECT_EQ(c->size(), 3);
      EXPECT_EQ(reduced(*c, me + 1.0f), sum_of({0, 1, 2}));
      // Split the subgroup again: {0} and {1, 2} by group rank; world ranks follow.
      auto d = c->split(c->rank() == 0 ? 0 : 1, 0);
      ASSERT_TRUE(d);
      if (me == 0) {
        EXPECT_EQ(d->size(), 1);
        EXPECT_EQ(d->global_rank(0), 0);
      } else {
        EXPECT_EQ(d->size(), 2);
        EXPECT_EQ(d->global_rank(0), 1);
        EXPECT_EQ(d->global_rank(1), 2);
        EXPECT_EQ(reduced(*d, me + 1.0f), sum_of({1, 2}));
      }
    }
  });
}

// A ring: every rank sends to the next and receives from the previous, in the world and in a
// subgroup (whose ranks are group ranks).
TEST(GroupSendRecv, RingInWorldAndSubgroup) {
  testing::run_ranks(4, [](std::shared_ptr<Group> world) {
    const int me = world->rank(), n = world->size();
    at::Tensor out = at::arange(6, at::kFloat) + 100 * me;
    at::Tensor in = at::zeros({6});
    Work r = world->recv(in, (me + n - 1) % n, "ring recv");
    Work s = world->send(out, (me + 1) % n, "ring send");
    s.wait();
    r.wait();
    EXPECT_TRUE(in.equal(at::arange(6, at::kFloat) + 100 * ((me + n - 1) % n)));

    // Two messages to the same peer arrive in the order sent; tags keep streams apart.
    auto sub = world->split(me % 2, me);  // {0, 2} {1, 3}
    const int other = 1 - sub->rank();
    at::Tensor first = at::full({2}, 1.0f + me), second = at::full({2}, 2.0f + me);
    at::Tensor tagged = at::full({1}, -1.0f * me);
    at::Tensor got1 = at::zeros({2}), got2 = at::zeros({2}), got_tagged = at::zeros({1});
    std::vector<Work> works;
    if (sub->rank() == 0) {
      works.push_back(sub->send(tagged, other, "tagged", /*tag=*/5));
      works.push_back(sub->send(first, other, "first"));
      works.push_back(sub->send(second, other, "second"));
    } else {
      works.push_back(sub->recv(got1, other, "first"));
      works.push_back(sub->recv(got2, other, "second"));
      works.push_back(sub->recv(got_tagged, other, "tagged", /*tag=*/5));
    }
    for (auto& w : works) w.wait();
    if (sub->rank() == 1) {
      const int from = sub->global_rank(0);
      EXPECT_TRUE(got1.equal(at::full({2}, 1.0f + from)));
      EXPECT_TRUE(got2.equal(at::full({2}, 2.0f + from)));
      EXPECT_TRUE(got_tagged.equal(at::full({1}, -1.0f * from)));
    }
  });
}

TEST(GroupSendRecv, PeerMustBeAnotherRankOfTheGroup) {
  testing::run_ranks(2, [](std::shared_ptr<Group> g) {
    at::Tensor t = at::zeros({2});
    EXPECT_THROW(g->send(t, g->rank(), "to myself"), c10::Error);
    EXPECT_THROW(g->recv(t, 2, "from nowhere"), c10::Error);
  });
}

// A receive whose sender never sends ends within comm_timeout_s with a message naming this rank,
// the peer (group and world rank) and the timeout. The silent rank stays alive until then, so it
// is the bound that ends the wait, not a closed connection.
TEST(GroupSendRecv, ReceiveFromASilentPeerTimesOutNamingIt) {
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  std::string message;
  double waited = 0;
  testing::run_ranks(
      4,
      [&](std::shared_ptr<Group> world) {
        auto pair = world->split(world->rank() / 2, world->rank(), "pp");  // {0,1} {2,3}
        if (world->rank() == 3) {
          std::unique_lock<std::mutex> lock(mu);
          cv.wait_for(lock, std::chrono::seconds(60), [&] { return done; });
          return;
        }
        if (world->rank() != 2) return;
        at::Tensor t = at::zeros({4});
        const auto t0 = std::chrono::steady_clock::now();
        try {
          pair->recv(t, 1, "recv of activations for micro-batch 3").wait();
        } catch (const CommError& e) {
          message = e.what();
        }
        waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        std::lock_guard<std::mutex> lock(mu);
        done = true;
        cv.notify_all();
      },
      std::chrono::milliseconds(3000));
  RecordProperty("message", message);  // in --gtest_output=xml: how the error reads
  EXPECT_NE(message.find("rank 0 of 2 in group pp (global rank 2)"), std::string::npos) << message;
  EXPECT_NE(
      message.find("recv of activations for micro-batch 3 (recv from rank 1 (global rank 3))"),
      std::string::npos)
      << message;
  EXPECT_NE(message.find("comm_timeout_s = 3 s"), std::string::npos) << message;
  EXPECT_GE(waited, 2.5);
  EXPECT_LT(waited, 20.0);
}

// A fake group: what a unit test of code above comm/ implements to script a group without
// sockets. Here it records the splits a mesh asks for and completes work only when waited on.
class FakeGroup : public Group {
 public:
  FakeGroup(int rank, int size, std::string name)
      : rank_(rank), size_(size), name_(std::move(name)) {}
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string name() const override { return name_; }
  int global_rank(int r) const override { return r; }
  const GroupOptions& options() const override { return opts_; }
  Work all_reduce_sum(at::Tensor& t, const std::string&) override {
    // As if every rank held the same values: the sum is size() times this rank's.
    return Work([t, n = size_]() mutable { t.mul_(n); });
  }
  Work reduce_scatter_sum(at::Tensor& out, at::Tensor& in, const std::string&) override {
    out.copy_(in.chunk(size_)[rank_] * size_);
    return {};
  }
  Work all_gather(at::Tensor& out, at::Tensor& in, const std::string&) override {
    out.copy_(in.repeat(size_));
    return {};
  }
  Work all_to_all(at::Tensor& out, at::Tensor& in, const std::string&) override {
    out.copy_(in);
    return {};
  }
  Work broadcast(at::Tensor&, int, const std::string&) override { return {}; }
  void barrier(const std::string&) override {}
  Work send(at::Tensor&, int, const std::string&, int) override { return {}; }
  Work recv(at::Tensor&, int, const std::string&, int) override { return {}; }
  std::shared_ptr<Group> split(int color, int key, const std::string& name) override {
    splits.emplace_back(color, key, name);
    return std::make_shared<FakeGroup>(key, 2, name);
  }

  std::vector<std::tuple<int, int, std::string>> splits;

 private:
  int rank_, size_;
  std::string name_;
  GroupOptions opts_;
};

TEST(FakeGroup, MeshAsksForMegatronsSplits) {
  // World rank 5 of 8 = tp 1, dp 0, pp 1: its pp group {1, 5} (color 1), dp group {5, 7}
  // (color 5), tp group {4, 5} (color 4); the key is its coordinate in each.
  auto fake = std::make_shared<FakeGroup>(5, 8, "world");
  Mesh mesh = Mesh::megatron(fake, 2, 2);
  using Split = std::tuple<int, int, std::string>;
  EXPECT_EQ(fake->splits, (std::vector<Split>{{1, 1, "pp"}, {5, 0, "dp"}, {4, 1, "tp"}}));
  EXPECT_EQ(mesh["tp"]->name(), "tp");
  EXPECT_EQ(mesh.group("dp")->rank(), 0);
  // The public handle is the same object.
  zero::Group& handle = *mesh.world();
  EXPECT_EQ(handle.rank(), 5);
  EXPECT_EQ(&of(handle), fake.get());
}

TEST(FakeGroup, WorkCompletesWhenTheTestSaysSo) {
  FakeGroup g(0, 4, "fake");
  at::Tensor t = at::ones({3});
  Work w = g.all_reduce_sum(t, "x");
  EXPECT_TRUE(w.pending());
  EXPECT_TRUE(t.equal(at::ones({3}))) << "nothing happens before the wait";
  w.wait();
  EXPECT_FALSE(w.pending());
  EXPECT_TRUE(t.equal(at::full({3}, 4.0f)));
  w.wait();  // once only
  EXPECT_TRUE(t.equal(at::full({3}, 4.0f)));
}

}  // namespace
}  // namespace zero::comm
