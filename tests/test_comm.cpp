// The communication layer: launcher environments, collectives over real gloo ranks, and what a
// failing collective says.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "comm/arrivals.hpp"
#include "comm/launcher_env.hpp"
#include "support/thread_group.hpp"
#include "zero/errors.hpp"

namespace zero::comm {
namespace {

LaunchInfo read(const std::map<std::string, std::string>& env) {
  return read_launch_env([&](const char* name) -> const char* {
    auto it = env.find(name);
    return it == env.end() ? nullptr : it->second.c_str();
  });
}

std::string launch_error(const std::map<std::string, std::string>& env) {
  try {
    read(env);
  } catch (const LaunchError& e) {
    return e.what();
  }
  return "";
}

TEST(LauncherEnv, NothingSetIsASingleProcess) {
  auto info = read({});
  EXPECT_EQ(info.world_size, 1);
  EXPECT_EQ(info.rank, 0);
  EXPECT_EQ(info.launcher, "none");
}

TEST(LauncherEnv, Torchrun) {
  auto info = read({{"RANK", "3"},
                    {"WORLD_SIZE", "4"},
                    {"LOCAL_RANK", "1"},
                    {"MASTER_ADDR", "10.0.0.1"},
                    {"MASTER_PORT", "29600"},
                    {"TORCHELASTIC_USE_AGENT_STORE", "True"},
                    {"TORCHELASTIC_RESTART_COUNT", "2"}});
  EXPECT_EQ(info.launcher, "torchrun");
  EXPECT_EQ(info.rank, 3);
  EXPECT_EQ(info.world_size, 4);
  EXPECT_EQ(info.local_rank, 1);
  EXPECT_EQ(info.master_addr, "10.0.0.1");
  EXPECT_EQ(info.master_port, 29600);
  EXPECT_TRUE(info.agent_store);
  EXPECT_EQ(info.restart_count, 2);
}

TEST(LauncherEnv, SlurmAndOpenMpi) {
  auto slurm = read({{"SLURM_PROCID", "5"},
                     {"SLURM_NTASKS", "8"},
                     {"SLURM_LOCALID", "1"},
                     {"MASTER_ADDR", "node1"}});
  EXPECT_EQ(slurm.launcher, "slurm");
  EXPECT_EQ(slurm.rank, 5);
  EXPECT_EQ(slurm.world_size, 8);
  EXPECT_EQ(slurm.master_port, 29500);
  auto mpi = read({{"OMPI_COMM_WORLD_RANK", "1"},
                   {"OMPI_COMM_WORLD_SIZE", "2"},
                   {"SLURM_PROCID", "0"},
                   {"SLURM_NTASKS", "1"},
                   {"MASTER_ADDR", "h"}});
  EXPECT_EQ(mpi.launcher, "openmpi") << "the launcher inside the allocation wins over Slurm";
  EXPECT_EQ(mpi.world_size, 2);
}

TEST(LauncherEnv, BadEnvironmentsSayWhatToSet) {
  EXPECT_NE(launch_error({{"RANK", "0"}, {"WORLD_SIZE", "2"}}).find("MASTER_ADDR"),
            std::string::npos);
  EXPECT_NE(launch_error({{"RANK", "2"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "h"}})
                .find("must be in [0, WORLD_SIZE=2)"),
            std::string::npos);
  EXPECT_NE(launch_error({{"RANK", "x"}, {"WORLD_SIZE", "2"}}).find("RANK='x' is not an integer"),
            std::string::npos);
  EXPECT_NE(launch_error({{"RANK", "0"}}).find("WORLD_SIZE is not set"), std::string::npos);
  EXPECT_NE(
      launch_error({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "h"}, {"MASTER_PORT", "0"}})
          .find("MASTER_PORT"),
      std::string::npos);
}

// The start-up handshake's arrival list carries each rank's WORLD_SIZE: a rank launched with
// another one is named as such, not as a rank that never arrived (or, for the ranks that agree,
// a connection failure that reads like the network).
TEST(Arrivals, MissingRanksAndOtherWorldSizes) {
  const auto bytes = [](const std::string& s) { return std::vector<uint8_t>(s.begin(), s.end()); };
  std::string key = zero::comm::arrival_entry(2, 4) + zero::comm::arrival_entry(0, 4);
  EXPECT_EQ(key, "2:4,0:4,");
  auto a = zero::comm::parse_arrivals(bytes(key), 4);
  EXPECT_EQ(a.missing, (std::vector<int>{1, 3}));
  EXPECT_TRUE(a.other_sizes.empty());
  key += zero::comm::arrival_entry(1, 4) + zero::comm::arrival_entry(3, 4);
  EXPECT_TRUE(zero::comm::parse_arrivals(bytes(key), 4).missing.empty());

  // Rank 1 launched with WORLD_SIZE=3 next to a rank launched with 2.
  a = zero::comm::parse_arrivals(bytes("0:2,1:3,"), 2);
  EXPECT_EQ(a.missing, (std::vector<int>{1}));
  ASSERT_EQ(a.other_sizes.size(), 1u);
  EXPECT_EQ(a.other_sizes[0], (std::pair<int, int>{1, 3}));
  EXPECT_EQ(zero::comm::world_size_mismatch(0, 2, a),
            "rank 1 was launched with WORLD_SIZE=3, this rank (rank 0) with WORLD_SIZE=2: the "
            "ranks disagree on the world size; launch every rank with the same WORLD_SIZE "
            "(torchrun: the same --nnodes and --nproc-per-node on every node)");
  // And as rank 1 sees it.
  a = zero::comm::parse_arrivals(bytes("0:2,1:3,"), 3);
  EXPECT_EQ(a.missing, (std::vector<int>{0, 2}));
  ASSERT_EQ(a.other_sizes.size(), 1u);
  EXPECT_EQ(a.other_sizes[0], (std::pair<int, int>{0, 2}));

  // Garbage entries are skipped, a torn last entry is not counted yet.
  a = zero::comm::parse_arrivals(bytes("x,0:2,:,1:,9:2,1:2"), 2);
  EXPECT_EQ(a.missing, (std::vector<int>{1}));
  EXPECT_TRUE(a.other_sizes.empty());
  // The older form without the size ("RANK,") still counts as an arrival.
  a = zero::comm::parse_arrivals(bytes("0:3,2,"), 3);
  EXPECT_EQ(a.missing, (std::vector<int>{1}));
  EXPECT_TRUE(a.other_sizes.empty());
}

TEST(Group, SizeOneCollectivesAreLocal) {
  auto g = Group::single();
  at::Tensor t = at::arange(6, at::kFloat);
  g->all_reduce_sum(t, "x").wait();
  EXPECT_TRUE(t.equal(at::arange(6, at::kFloat)));
  at::Tensor out = at::zeros({6});
  g->reduce_scatter_sum(out, t, "x").wait();
  EXPECT_TRUE(out.equal(t));
}

TEST(Group, CollectivesOverFourGlooRanks) {
  const int world = 4;
  testing::run_ranks(world, [&](std::shared_ptr<Group> g) {
    const int r = g->rank();
    at::Tensor t = at::full({8}, static_cast<float>(r + 1));
    g->all_reduce_sum(t, "all_reduce").wait();
    EXPECT_TRUE(t.equal(at::full({8}, 10.0f)));

    at::Tensor in = at::arange(8, at::kFloat) * (r + 1);
    at::Tensor out = at::empty({2});
    g->reduce_scatter_sum(out, in, "reduce_scatter").wait();
    EXPECT_TRUE(out.equal(at::arange(2 * r, 2 * r + 2, at::kFloat) * 10));

    at::Tensor mine = at::full({3}, static_cast<float>(r));
    at::Tensor all = at::empty({12});
    g->all_gather(all, mine, "all_gather").wait();
    EXPECT_TRUE(all.equal(at::arange(4, at::kFloat).repeat_interleave(3)));

    at::Tensor b = at::full({2}, static_cast<float>(r));
    g->broadcast(b, 2, "broadcast").wait();
    EXPECT_TRUE(b.equal(at::full({2}, 2.0f)));
  });
}

// A rank that stops taking part: the others get an error naming their rank, the collective and
// the timeout, well before anything like a hang.
TEST(Group, AbsentPeerTimesOutWithRankAndCollective) {
  std::string message;
  const auto t0 = std::chrono::steady_clock::now();
  testing::run_ranks(
      2,
      [&](std::shared_ptr<Group> g) {
        if (g->rank() == 1) return;  // never joins the collective below
        at::Tensor t = at::ones({4});
        try {
          g->all_reduce_sum(t, "all_reduce of gradient bucket 7").wait();
        } catch (const CommError& e) {
          message = e.what();
        }
      },
      std::chrono::milliseconds(1500));
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_NE(message.find("rank 0 of 2"), std::string::npos) << message;
  EXPECT_NE(message.find("all_reduce of gradient bucket 7"), std::string::npos) << message;
  EXPECT_NE(message.find("comm_timeout_s"), std::string::npos) << message;
  EXPECT_LT(secs, 30.0);
}

TEST(Group, ShapeMismatchIsCaughtBeforeTheBackend) {
  auto g = Group::single();
  at::Tensor in = at::zeros({5});
  at::Tensor out = at::zeros({2});
  EXPECT_THROW(g->reduce_scatter_sum(out, in, "x"), c10::Error);
}

}  // namespace
}  // namespace zero::comm
