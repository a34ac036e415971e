// Checkpoint parameter records carry each parameter's global shape and N-dimensional offset
// (whole today: its own shape, zeros), and checkpoints written before those fields existed
// still load and resume training as single-process training continues.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>

#include "support/thread_group.hpp"
#include "support/tiny_net.hpp"
#include "zero/checkpoint/checkpoint_format.hpp"
#include "zero/checkpoint_io.hpp"
#include "zero/engine.hpp"

namespace zero::testing {
namespace {
namespace fs = std::filesystem;

constexpr int64_t kRows = 48;
constexpr int kWorld = 2;
const std::string kChecksum = ",\n  \"manifest_checksum\": \"";

struct TempDir {
  static inline std::atomic<int> counter{0};
  std::string path = (fs::temp_directory_path() / ("zero_records_" + std::to_string(::getpid()) +
                                                   "_" + std::to_string(counter++)))
                         .string();
  ~TempDir() { fs::remove_all(path); }
};

std::string read(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Applies `edit` to the manifest's text and seals it with a fresh checksum, as a manifest
// written by that (older or other) code would be.
void rewrite_manifest(const fs::path& manifest,
                      const std::function<std::string(std::string)>& edit) {
  std::string text = read(manifest);
  const size_t at = text.rfind(kChecksum);
  ASSERT_NE(at, std::string::npos);
  const std::string body = edit(text.substr(0, at));
  std::ofstream(manifest) << body + kChecksum + ckpt::fnv1a_hex(body) + "\"\n}\n";
}

void train(Engine& e, TinyNetImpl& net, int from, int to) {
  for (int s = from; s < to; ++s) {
    const Batch b = rank_micro_batch(global_batch(s, kRows), e.rank(), e.world_size(), 0, 1);
    e.backward(mse(net.forward(b.x), b.y));
    e.step();
  }
}

// Saves after 2 steps on 2 ranks (stage 2), lets `edit` rewrite the manifest, then loads into
// fresh engines (built from another seed) and trains 2 more steps; returns rank 0's parameters,
// or rethrows the load's error.
at::Tensor save_edit_resume(const Config& cfg, const std::string& dir,
                            const std::function<std::string(std::string)>& edit) {
  run_ranks(kWorld, [&](std::shared_ptr<comm::Group> g) {
    auto net = make_tiny_net(3);
    auto e = initialize(net, cfg, g);
    train(e, *net, 0, 2);
    e.save_checkpoint(dir, "t");
  });
  rewrite_manifest(fs::path(dir) / "t" / "manifest.json", edit);
  at::Tensor out;
  run_ranks(kWorld, [&](std::shared_ptr<comm::Group> g) {
    auto net = make_tiny_net(77);
    auto e = initialize(net, cfg, g);
    e.load_checkpoint(dir, "t");
    train(e, *net, 2, 4);
    if (g->rank() == 0) out = e.flat_parameters();
  });
  return out;
}

TEST(CheckpointRecords, ParametersAreRecordedWhole) {
  TempDir dir;
  const Config cfg = test_config(2, kRows / kWorld, 1, 0.5);
  run_ranks(kWorld, [&](std::shared_ptr<comm::Group> g) {
    auto net = make_tiny_net(3);
    auto e = initialize(net, cfg, g);
    train(e, *net, 0, 1);
    e.save_checkpoint(dir.path, "t");
  });
  const CheckpointInfo info = read_checkpoint_info(dir.path, "t");
  auto net = make_tiny_net(3);
  const auto named = net->named_parameters();
  ASSERT_EQ(info.params.size(), named.size());
  for (size_t i = 0; i < named.size(); ++i) {
    const CheckpointParam& p = info.params[i];
    const std::vector<int64_t> shape(named[i].value().sizes().begin(),
                                     named[i].value().sizes().end());
    EXPECT_EQ(p.name, named[i].key());
    EXPECT_EQ(p.shape, shape);
    EXPECT_EQ(p.global_shape, shape) << p.name;
    EXPECT_EQ(p.offset, std::vector<int64_t>(shape.size(), 0)) << p.name;
    EXPECT_TRUE(p.whole());
  }
  EXPECT_NE(read(fs::path(dir.path) / "t" / "manifest.json").find("\"global_shape\": ["),
            std::string::npos);
}

// The record format before global shapes and offsets: {"name", "shape"} only.
TEST(CheckpointRecords, OldRecordsLoadAndResume) {
  TempDir dir;
  const Config cfg = test_config(2, kRows / kWorld, 1, 0.5);
  const at::Tensor ref = train_reference(cfg, 4, kRows, 3).params;
  int stripped = 0;
  const at::Tensor resumed = save_edit_resume(cfg, dir.path, [&](std::string text) {
    const std::regex extra(", \"global_shape\": \\[[0-9, ]*\\], \"offset\": \\[[0-9, ]*\\]");
    stripped = static_cast<int>(std::distance(std::sregex_iterator(text.begin(), text.end(), extra),
                                              std::sregex_iterator()));
    return std::regex_replace(text, extra, "");
  });
  EXPECT_EQ(stripped, static_cast<int>(make_tiny_net(3)->parameters().size()));
  ASSERT_TRUE(resumed.defined());
  EXPECT_LT((resumed - ref).abs().max().item<double>(), 2e-5);
}

// A parameter saved as a part of a larger tensor does not load into a run whose tensor of that
// name is smaller: the whole tensors' shapes must agree (blocks of them reshard).
TEST(CheckpointRecords, APartDoesNotLoadAsAWhole) {
  TempDir dir;
  const Config cfg = test_config(1, kRows / kWorld, 1, 0);
  try {
    save_edit_resume(cfg, dir.path, [](std::string text) {
      // head.weight [5, 24] as rows 5..9 of a [10, 24] tensor.
      const std::string whole =
          "\"head.weight\", \"shape\": [5, 24], \"global_shape\": [5, 24], \"offset\": [0, 0]";
      const size_t at = text.find(whole);
      EXPECT_NE(at, std::string::npos);
      return text.replace(
          at, whole.size(),
          "\"head.weight\", \"shape\": [5, 24], \"global_shape\": [10, 24], \"offset\": [5, 0]");
    });
    ADD_FAILURE() << "loaded";
  } catch (const CheckpointError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("parameter 'head.weight' has shape [10, 24] in the checkpoint but [5, 24] "
                     "in this model"),
              std::string::npos)
        << m;
  }
  // And a record whose part lies outside its global shape is a corrupted manifest.
  TempDir dir2;
  try {
    save_edit_resume(cfg, dir2.path, [](std::string text) {
      return std::regex_replace(text, std::regex("\"offset\": \\[0, 0\\]"), "\"offset\": [1, 0]");
    });
    ADD_FAILURE() << "loaded";
  } catch (const CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find("does not lie inside its global shape"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace zero::testing
