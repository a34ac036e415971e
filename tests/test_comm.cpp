// The communication layer: launcher environments, collectives over real gloo ranks, and what a
// failing collective says.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdlib>
#include <map>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "comm/agree.hpp"
#include "comm/arrivals.hpp"
#include "comm/group.hpp"
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

// comm/agree.hpp: ranks 0 and 2 of 3 fail, rank 1 does not; every rank gets both texts, in rank
// order, the same bytes (one of them longer than a status number, with a NUL-free UTF-8 dash); a
// round where no rank fails gives "" everywhere. A group of one needs no peer.
TEST(AgreeErrors, EveryRankGetsEveryFailingRanksTextInRankOrder) {
  std::vector<std::string> got(3), none(3);
  testing::run_ranks(3, [&](std::shared_ptr<Group> g) {
    const int r = g->rank();
    const std::string mine = r == 0   ? "bad batch \u2014 id 99"
                             : r == 2 ? std::string(300, 'x')
                                      : "";
    got[r] = agree_errors(*g, mine, c10::kCPU, "a test check");
    none[r] = agree_errors(*g, "", c10::kCPU, "a test check");
  });
  const std::string want = "rank 0: bad batch \u2014 id 99; rank 2: " + std::string(300, 'x');
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(got[r], want) << "rank " << r;
    EXPECT_EQ(none[r], "") << "rank " << r;
  }
  auto single = Group::single();
  EXPECT_EQ(agree_errors(*single, "", c10::kCPU, "a check"), "");
  EXPECT_EQ(agree_errors(*single, "oops", c10::kCPU, "a check"), "rank 0: oops");
}

// When more ranks fail than Agreement::kMaxTexts (an out of memory in the same shapes fails
// every rank), only the first kMaxTexts texts travel and the others are named by rank: a few
// broadcasts, not 8 per rank (review 2026-12-07c L4); every rank gets the same text.
TEST(AgreeErrors, BeyondTheFirstFailingRanksOnlyTheirNumbersTravel) {
  constexpr int kWorld = Agreement::kMaxTexts + 3;
  std::vector<std::string> got(kWorld);
  testing::run_ranks(kWorld, [&](std::shared_ptr<Group> g) {
    const int r = g->rank();
    // Rank 1 is fine; every other rank fails with its own text.
    got[r] = agree_errors(*g, r == 1 ? "" : "out of memory on " + std::to_string(r), c10::kCPU,
                          "a test check");
  });
  std::string want;
  std::vector<int> failing;
  for (int r = 0; r < kWorld; ++r) {
    if (r != 1) failing.push_back(r);
  }
  for (int i = 0; i < Agreement::kMaxTexts; ++i) {
    want += (i ? "; rank " : "rank ") + std::to_string(failing[i]) + ": out of memory on " +
            std::to_string(failing[i]);
  }
  const size_t more = failing.size() - Agreement::kMaxTexts;
  want += "; and " + std::to_string(more) + " more ranks failed (";
  for (size_t i = Agreement::kMaxTexts; i < failing.size(); ++i) {
    want +=
        (i > static_cast<size_t>(Agreement::kMaxTexts) ? ", " : "") + std::to_string(failing[i]);
  }
  want += ")";
  for (int r = 0; r < kWorld; ++r) EXPECT_EQ(got[r], want) << "rank " << r;
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
  EXPECT_EQ(a.entries, 2) << "rank 0 waits until both ranks that arrived have read this";

  // Garbage entries are skipped, a torn last entry is not counted yet.
  a = zero::comm::parse_arrivals(bytes("x,0:2,:,1:,9:2,1:2"), 2);
  EXPECT_EQ(a.missing, (std::vector<int>{1}));
  EXPECT_TRUE(a.other_sizes.empty());
  EXPECT_EQ(a.entries, 2);  // "0:2," and "9:2,"
  // The older form without the size ("RANK,") still counts as an arrival.
  a = zero::comm::parse_arrivals(bytes("0:3,2,"), 3);
  EXPECT_EQ(a.missing, (std::vector<int>{1}));
  EXPECT_TRUE(a.other_sizes.empty());
}

// A blocking wait would spin the host on every bucket's collective: it is dropped with the
// reason before an NCCL group is made; a value that leaves it off is dropped silently.
TEST(LauncherEnv, NcclBlockingWaitIsUnsetWithTheReason) {
  ::setenv("TORCH_NCCL_BLOCKING_WAIT", "1", 1);
  ::setenv("NCCL_BLOCKING_WAIT", "0", 1);
  const std::string w = drop_nccl_blocking_wait();
  EXPECT_NE(w.find("TORCH_NCCL_BLOCKING_WAIT=1"), std::string::npos) << w;
  EXPECT_EQ(w.find("NCCL_BLOCKING_WAIT=0"), std::string::npos) << w;
  EXPECT_NE(w.find("comm_timeout_s"), std::string::npos) << w;
  EXPECT_EQ(std::getenv("TORCH_NCCL_BLOCKING_WAIT"), nullptr);
  EXPECT_EQ(std::getenv("NCCL_BLOCKING_WAIT"), nullptr);
  EXPECT_EQ(drop_nccl_blocking_wait(), "");
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

// A TCP port nothing listens on right now (the kernel's pick).
int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  EXPECT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&a), len), 0);
  EXPECT_EQ(::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len), 0);
  ::close(fd);
  return ntohs(a.sin_port);
}

// Start-up runs under its own deadline; the process group and the store it keeps get the whole
// comm_timeout_s for what comes after (NCCL's watchdog times every collective with the
// backend's timeout). Rank 1 comes 2 s late, so rank 0 has waited 2 s of its start-up budget
// when it builds the backend: it used to be left with that remainder. from_env reads the
// launcher's variables, so the ranks are processes, forked here.
TEST(Group, FromEnvGivesTheGroupAndItsStoreTheWholeCommTimeout) {
  const std::string port = std::to_string(free_port());
  const auto budget = std::chrono::milliseconds(8000);
  std::array<std::array<int, 2>, 2> pipes{};
  std::array<pid_t, 2> pids{};
  for (int r = 0; r < 2; ++r) {
    ASSERT_EQ(::pipe(pipes[r].data()), 0);
    pids[r] = ::fork();
    ASSERT_GE(pids[r], 0);
    if (pids[r] != 0) continue;
    // The child: rank r of 2 under torchrun's variables; it reports what its group holds.
    for (const char* v : {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "SLURM_PROCID",
                          "SLURM_NTASKS", "TORCHELASTIC_USE_AGENT_STORE"}) {
      ::unsetenv(v);
    }
    ::setenv("RANK", std::to_string(r).c_str(), 1);
    ::setenv("LOCAL_RANK", std::to_string(r).c_str(), 1);
    ::setenv("WORLD_SIZE", "2", 1);
    ::setenv("MASTER_ADDR", "127.0.0.1", 1);
    ::setenv("MASTER_PORT", port.c_str(), 1);
    if (r == 1) std::this_thread::sleep_for(std::chrono::seconds(2));
    std::array<int64_t, 2> seen{-1, -1};
    try {
      GroupOptions o;
      o.timeout = budget;
      const auto g = Group::from_env(o);
      seen = {g->timeouts().backend.count(), g->timeouts().store.count()};
      g->barrier("the test's last barrier");  // neither rank leaves while the other reads
    } catch (const std::exception& e) {
      std::fprintf(stderr, "rank %d: %s\n", r, e.what());
    }
    const ssize_t n = ::write(pipes[r][1], seen.data(), sizeof seen);
    ::_exit(n == sizeof seen ? 0 : 1);
  }
  for (int r = 0; r < 2; ++r) {
    ::close(pipes[r][1]);
    std::array<int64_t, 2> seen{-1, -1};
    EXPECT_EQ(::read(pipes[r][0], seen.data(), sizeof seen), static_cast<ssize_t>(sizeof seen));
    ::close(pipes[r][0]);
    int status = 0;
    ::waitpid(pids[r], &status, 0);
    EXPECT_EQ(seen[0], budget.count()) << "rank " << r << ": the process group's timeout";
    EXPECT_EQ(seen[1], budget.count()) << "rank " << r << ": the store's timeout";
  }
}

TEST(Group, ShapeMismatchIsCaughtBeforeTheBackend) {
  auto g = Group::single();
  at::Tensor in = at::zeros({5});
  at::Tensor out = at::zeros({2});
  EXPECT_THROW(g->reduce_scatter_sum(out, in, "x"), c10::Error);
}

}  // namespace
}  // namespace zero::comm
