// Failure paths below the trainer: a manifest edited by hand is refused naming the file, the
// store heartbeat names the rank that stopped (not one that reported a failure of its own), and
// an exception in one rank's backward ends every rank with an error, never a hang.
// The end-to-end cases (processes, ports, launchers) are in tests/e2e/.
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/csrc/distributed/c10d/HashStore.hpp>

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <regex>
#include <sstream>
#include <thread>

#include "comm/group.hpp"
#include "comm/liveness.hpp"
#include "support/thread_group.hpp"
#include "support/tiny_net.hpp"
#include "zero/checkpoint_io.hpp"
#include "zero/engine.hpp"

using namespace zero;
using namespace zero::testing;
namespace fs = std::filesystem;

namespace {

std::string read_all(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

void write_all(const fs::path& p, const std::string& text) {
  std::ofstream(p, std::ios::binary | std::ios::trunc) << text;
}

std::string refusal(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const CheckpointError& e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace

TEST(ManifestChecksum, AnEditedManifestIsRefusedNamingTheFile) {
  const fs::path dir = fs::temp_directory_path() / ("zero_manifest_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  {
    auto net = make_tiny_net(3);
    auto e = initialize(net, test_config(2, 4, 1, 0.0), comm::Group::single());
    const Batch b = global_batch(0, 4);
    e.backward(mse(net->forward(b.x), b.y));
    e.step();
    e.save_checkpoint(dir.string());  // step1
  }
  const fs::path manifest = dir / "step1" / "manifest.json";
  const std::string good = read_all(manifest);
  EXPECT_EQ(read_checkpoint_info(dir.string()).optimizer_steps, 1);

  // The edit a user makes to "continue" from another step: valid JSON, wrong checksum.
  std::string edited =
      std::regex_replace(good, std::regex("\"optimizer_steps\": 1,"), "\"optimizer_steps\": 7,");
  ASSERT_NE(edited, good);
  write_all(manifest, edited);
  EXPECT_NE(
      refusal([&] {
        read_checkpoint_info(dir.string());
      }).find(manifest.string() + ": corrupted: the manifest does not match its manifest_checksum"),
      std::string::npos)
      << refusal([&] { read_checkpoint_info(dir.string()); });
  {
    auto net = make_tiny_net(3);
    auto e = initialize(net, test_config(2, 4, 1, 0.0), comm::Group::single());
    EXPECT_NE(refusal([&] { e.load_checkpoint(dir.string()); }).find(manifest.string()),
              std::string::npos);
    EXPECT_EQ(e.stats().optimizer_steps, 0) << "a refused load changes nothing";
  }

  // Removing the checksum line is no way around it.
  const std::string stripped =
      std::regex_replace(good, std::regex(",\n  \"manifest_checksum\": \"[0-9a-f]+\""), "");
  ASSERT_NE(stripped, good);
  write_all(manifest, stripped);
  EXPECT_NE(refusal([&] { read_checkpoint_info(dir.string()); }).find("has no manifest_checksum"),
            std::string::npos);

  write_all(manifest, good);
  EXPECT_EQ(read_checkpoint_info(dir.string()).optimizer_steps, 1) << "the original still loads";
  fs::remove_all(dir);
}

// A load on ranks whose groups.parts disagree with the model on one rank only (rank 1 says its
// block lies past the end of the whole tensor): that rank must not throw alone while rank 0
// waits in the load's next agreement until comm_timeout_s (20 s here). Both stop at once with
// the same CheckpointError, naming rank 1 and the fix, and neither engine changed.
TEST(CheckpointAgreement, OneRanksMisfitPartsStopEveryRanksLoadAtOnce) {
  const fs::path dir = fs::temp_directory_path() / ("zero_parts_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  std::vector<std::string> messages(2);
  std::vector<double> seconds(2);
  run_ranks(
      2,
      [&](std::shared_ptr<comm::Group> g) {
        const int r = g->rank();
        const Config cfg = test_config(1, 2, 1, 0.0);
        {
          auto net = make_tiny_net(3);
          auto e = initialize(net, cfg, g);
          const Batch b = rank_micro_batch(global_batch(0, 4), r, 2, 0, 1);
          e.backward(mse(net->forward(b.x), b.y));
          e.step();
          e.save_checkpoint(dir.string());
        }
        auto net = make_tiny_net(4);
        const auto named = net->named_parameters();
        const auto first = named.begin();
        const std::vector<int64_t> shape = first->value().sizes().vec();
        Groups groups{g, {}, {}};
        if (r == 1) {
          std::vector<int64_t> offset(shape.size(), 0);
          offset[0] = shape[0];  // one block past the end
          groups.parts.push_back({first->key(), shape, offset});
        }
        auto e = initialize(net, cfg, groups);
        const auto t0 = std::chrono::steady_clock::now();
        messages[r] = refusal([&] { e.load_checkpoint(dir.string()); });
        seconds[r] = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        EXPECT_EQ(e.stats().optimizer_steps, 0)
            << "rank " << r << ": a refused load changes nothing";
      },
      std::chrono::seconds(20));
  EXPECT_EQ(messages[0], messages[1]);
  EXPECT_NE(messages[0].find("failed on rank 1 of 2 (every rank stops)"), std::string::npos)
      << messages[0];
  EXPECT_NE(messages[0].find("groups.parts: parameter"), std::string::npos) << messages[0];
  for (int r = 0; r < 2; ++r) EXPECT_LT(seconds[r], 10.0) << "rank " << r << " waited";
  fs::remove_all(dir);
}

TEST(Liveness, NamesTheRankWhoseHeartbeatStoppedNotOneThatReportedAFailure) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  auto r0 = std::make_unique<comm::Liveness>(store, 0, 3, "rank 0");
  auto r1 = std::make_unique<comm::Liveness>(store, 1, 3, "rank 0");
  auto r2 = std::make_unique<comm::Liveness>(store, 2, 3, "rank 0");
  for (auto* l : {r0.get(), r1.get(), r2.get()}) l->announce();
  for (int r = 0; r < 3; ++r) EXPECT_TRUE(r0->arrived(r));
  for (auto* l : {r0.get(), r1.get(), r2.get()}) l->watch_peers();
  std::this_thread::sleep_for(std::chrono::milliseconds(1200));  // a few heartbeats

  // All alive: nobody is blamed.
  EXPECT_EQ(r0->diagnose(std::chrono::milliseconds(0)).find("is gone"), std::string::npos);

  // Rank 1 saw a failure and reported it, then ended; rank 2 just vanished.
  r1->diagnose(std::chrono::milliseconds(0));
  std::this_thread::sleep_for(std::chrono::milliseconds(1200));  // its report reaches the store
  r1.reset();
  r2.reset();
  const auto t = std::chrono::steady_clock::now();
  const std::string d = r0->diagnose(std::chrono::seconds(10));
  const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
  EXPECT_NE(d.find("rank 2 is gone"), std::string::npos) << d;
  EXPECT_EQ(d.find("rank 1 is gone"), std::string::npos) << d;
  EXPECT_LT(waited, 6.0) << "the diagnosis ends once the heartbeat is stale";
}

namespace {

using Clock = std::chrono::steady_clock;

double since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

struct RankEnd {
  std::string error;
  double at_s = -1;  // seconds after rank 1's backward threw
};

// Three ranks at stage 2 with several buckets; rank 1's backward throws at step 2 when a
// gradient in the middle of the pass arrives (as a CUDA OOM in a kernel would), after it has
// launched some of the pass's bucket collectives and before the others. With `keep_engine` the
// application catches the error and keeps the engine (and its process group) alive, as a
// trainer that catches errors would; otherwise the error ends the rank, as it ends a process.
std::vector<RankEnd> fail_one_backward(bool keep_engine, std::chrono::milliseconds timeout) {
  constexpr int kWorld = 3;
  std::mutex mu;
  std::vector<RankEnd> ends(kWorld);
  std::atomic<bool> thrown{false};
  std::atomic<int> peers_done{0};
  Clock::time_point thrown_at{};
  run_ranks(
      kWorld,
      [&](std::shared_ptr<comm::Group> group) {
        const int r = group->rank();
        RankEnd end;
        try {
          auto net = make_tiny_net(3);
          auto engine = initialize(net, test_config(2, 4, 1, 0, /*bucket=*/64), group);
          std::atomic<int> step{0};
          if (r == 1) {
            net->fc2->weight.register_hook([&](const at::Tensor& g) {
              if (step == 2) {
                {
                  std::lock_guard<std::mutex> lock(mu);
                  thrown_at = Clock::now();
                }
                thrown = true;
                throw std::runtime_error("CUDA out of memory (simulated in rank 1's backward)");
              }
              return g;
            });
          }
          for (int s = 0; s < 5; ++s) {
            step = s;
            const Batch b = rank_micro_batch(global_batch(s, 12), r, kWorld, 0, 1);
            try {
              engine.backward(mse(net->forward(b.x), b.y));
            } catch (const std::exception&) {
              if (r != 1 || !keep_engine) throw;
              // The application catches it and holds the engine (and its group) without
              // training on, until the peers ended (bounded).
              const auto t = Clock::now();
              while (peers_done < kWorld - 1 && since(t) < 60) {
                std::this_thread::sleep_for(std::chrono::milliseconds(50));
              }
              throw;
            }
            engine.step();
          }
        } catch (const std::exception& e) {
          end.error = e.what();
        }
        std::lock_guard<std::mutex> lock(mu);
        if (thrown) end.at_s = since(thrown_at);
        ends[r] = end;
        if (r != 1) ++peers_done;
      },
      timeout);
  return ends;
}

void expect_every_rank_ends(bool keep_engine, double bound_s) {
  const auto ends = fail_one_backward(keep_engine, std::chrono::milliseconds(3000));
  EXPECT_NE(ends[1].error.find("CUDA out of memory (simulated"), std::string::npos)
      << ends[1].error;
  for (int r : {0, 2}) {
    EXPECT_NE(ends[r].error.find("rank " + std::to_string(r) + " of 3"), std::string::npos)
        << "rank " << r << ": " << ends[r].error;
    EXPECT_GE(ends[r].at_s, 0) << "rank " << r << " ended before rank 1 failed";
    EXPECT_LT(ends[r].at_s, bound_s) << "rank " << r << ": " << ends[r].error;
  }
  if (keep_engine) {
    for (int r : {0, 2}) {
      EXPECT_NE(ends[r].error.find("comm_timeout_s = 3 s"), std::string::npos) << ends[r].error;
    }
  }
}

}  // namespace

// The failing rank's error ends it (as it ends a process): its connections close and the
// others' collectives fail at once, each naming its rank and the collective.
TEST(RankFailure, AnExceptionInOneRanksBackwardEndsTheOthersAtOnce) {
  expect_every_rank_ends(/*keep_engine=*/false, /*bound_s=*/2.5);
}

// The application catches the error and keeps the engine (and so its connections): the others
// end once comm_timeout_s (3 s here) has passed, naming the timeout. (Training on from there is
// safe only when every rank's backward failed in the same pass, a data error every rank sees:
// RealModelFailures.FailedBackwardIsDiscarded; otherwise this rank's next collectives would
// pair with the others' pending ones.)
TEST(RankFailure, AnExceptionCaughtByTheApplicationEndsTheOthersWithinTheTimeout) {
  expect_every_rank_ends(/*keep_engine=*/true, /*bound_s=*/3.0 + 5.0);
}
