// Failure paths below the trainer: a manifest edited by hand is refused naming the file, and the
// store heartbeat names the rank that stopped (not one that reported a failure of its own).
// The end-to-end cases (processes, ports, launchers) are in tests/e2e/.
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/csrc/distributed/c10d/HashStore.hpp>

#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>

#include "comm/group.hpp"
#include "comm/liveness.hpp"
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
