// Sharded checkpoints: exact resume, resharding N -> M ranks (and across stages), consolidation
// into safetensors, and failures (damaged, truncated, missing files, another model, NaN
// gradients) that stop every rank with a message naming the file, never one rank alone.
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <yaml-cpp/yaml.h>

#include <unistd.h>

#include <atomic>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <regex>

#include "support/thread_group.hpp"
#include "support/tiny_net.hpp"
#include "zero/checkpoint/checkpoint_format.hpp"
#include "zero/checkpoint_io.hpp"
#include "zero/engine.hpp"

namespace zero::testing {
namespace {
namespace fs = std::filesystem;

constexpr int64_t kRows = 48;  // divisible by 1, 2, 3 and 4 ranks

// A fresh directory under the system temp dir, removed at the end of the test.
struct TempDir {
  static inline std::atomic<int> counter{0};
  std::string path = (fs::temp_directory_path() /
                      ("zero_ckpt_" + std::to_string(::getpid()) + "_" + std::to_string(counter++)))
                         .string();
  ~TempDir() { fs::remove_all(path); }
};

Config make_config(int stage, int world, int accumulation = 1) {
  Config c = test_config(stage, kRows / (world * accumulation), accumulation, /*clip=*/0.5);
  c.scheduler.type = "WarmupLR";  // the lr changes every step: a resumed schedule must match
  c.scheduler.warmup_num_steps = 10;
  c.scheduler.warmup_type = "linear";
  return c;
}

// Optimizer steps [from, to) over the shared global batches; returns this rank's losses.
std::vector<double> train(Engine& e, TinyNetImpl& net, int from, int to) {
  const int acc = static_cast<int>(e.config().gradient_accumulation_steps);
  std::vector<double> losses;
  for (int s = from; s < to; ++s) {
    const Batch g = global_batch(s, kRows);
    for (int m = 0; m < acc; ++m) {
      const Batch b = rank_micro_batch(g, e.rank(), e.world_size(), m, acc);
      at::Tensor loss = mse(net.forward(b.x), b.y);
      losses.push_back(loss.item<double>());
      e.backward(loss);
      e.step();
    }
  }
  return losses;
}

bool same_tensors(const std::vector<std::pair<std::string, at::Tensor>>& a,
                  const std::vector<std::pair<std::string, at::Tensor>>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i].first != b[i].first || !at::equal(a[i].second, b[i].second)) return false;
  }
  return true;
}

// fn() must throw CheckpointError with a message containing the regex `pattern`.
void expect_refused(const std::function<void()>& fn, const std::string& pattern, int rank) {
  try {
    fn();
    ADD_FAILURE() << "rank " << rank << ": no error, expected '" << pattern << "'";
  } catch (const CheckpointError& e) {
    EXPECT_TRUE(std::regex_search(e.what(), std::regex(pattern)))
        << "rank " << rank << ": '" << pattern << "' not in: " << e.what();
  }
}

std::string read_all(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

TEST(Crc32, MatchesZlib) {
  EXPECT_EQ(ckpt::crc32(0, "123456789", 9), 0xCBF43926u);
  EXPECT_EQ(ckpt::crc32(ckpt::crc32(0, "12345", 5), "6789", 4), 0xCBF43926u);
}

class ExactResume : public ::testing::TestWithParam<std::pair<int, int>> {};  // stage, GA

TEST_P(ExactResume, BitwiseSameAsUninterrupted) {
  const auto [stage, acc] = GetParam();
  constexpr int K = 3;
  TempDir dir;
  const Config cfg = make_config(stage, 2, acc);
  run_ranks(2, [&](std::shared_ptr<comm::Group> group) {
    auto net = make_tiny_net(3);
    auto e = initialize(net, cfg, group);
    train(e, *net, 0, K);
    e.save_checkpoint(dir.path);
    const double lr_at_k = e.lr();
    const auto ref_losses = train(e, *net, K, 2 * K);

    auto net2 = make_tiny_net(77);  // other initial weights: all of them must come from disk
    auto e2 = initialize(net2, cfg, group);
    EXPECT_EQ(e2.load_checkpoint(dir.path), "step" + std::to_string(K));
    EXPECT_EQ(e2.stats().optimizer_steps, K);
    EXPECT_EQ(e2.stats().micro_steps, K * acc);
    EXPECT_EQ(e2.lr(), lr_at_k);
    const auto losses = train(e2, *net2, K, 2 * K);
    EXPECT_EQ(losses, ref_losses) << "rank " << group->rank();
    EXPECT_TRUE(at::equal(e2.flat_parameters(), e.flat_parameters()));
    EXPECT_TRUE(at::equal(flatten(*net2), flatten(*net)));
  });
}

INSTANTIATE_TEST_SUITE_P(Stages, ExactResume,
                         ::testing::Values(std::pair{0, 1}, std::pair{1, 1}, std::pair{2, 1},
                                           std::pair{2, 2}));

struct ReshardCase {
  int save_world, save_stage, load_world, load_stage;
};
void PrintTo(const ReshardCase& c, std::ostream* os) {
  *os << c.save_world << " ranks stage " << c.save_stage << " -> " << c.load_world
      << " ranks stage " << c.load_stage;
}
class Reshard : public ::testing::TestWithParam<ReshardCase> {};

TEST_P(Reshard, SameStatesAndContinuation) {
  const ReshardCase c = GetParam();
  constexpr int K = 3;
  TempDir a, b;
  at::Tensor continued, saved_params, loaded_params, resharded;  // rank 0 writes them
  run_ranks(c.save_world, [&](std::shared_ptr<comm::Group> group) {
    auto net = make_tiny_net(5);
    auto e = initialize(net, make_config(c.save_stage, c.save_world), group);
    train(e, *net, 0, K);
    e.save_checkpoint(a.path);
    at::Tensor p = e.flat_parameters();
    train(e, *net, K, 2 * K);
    if (group->rank() == 0) saved_params = p, continued = e.flat_parameters();
  });
  run_ranks(c.load_world, [&](std::shared_ptr<comm::Group> group) {
    auto net = make_tiny_net(6);
    auto e = initialize(net, make_config(c.load_stage, c.load_world), group);
    e.load_checkpoint(a.path);
    const at::Tensor p = e.flat_parameters();
    EXPECT_TRUE(at::equal(flatten(*net), p));  // the module itself, not only the engine's copy
    e.save_checkpoint(b.path, "resaved");
    train(e, *net, K, 2 * K);
    if (group->rank() == 0) loaded_params = p, resharded = e.flat_parameters();
  });
  EXPECT_TRUE(at::equal(loaded_params, saved_params));
  // Every optimizer state, element for element, after a round trip through the M-rank layout.
  const CheckpointInfo info = read_checkpoint_info(b.path);
  EXPECT_EQ(info.world_size, c.load_world);
  EXPECT_EQ(info.optimizer_steps, K);
  ASSERT_EQ(info.state_names, (std::vector<std::string>{"exp_avg", "exp_avg_sq"}));
  for (const std::string kind : {"master", "exp_avg", "exp_avg_sq"}) {
    EXPECT_TRUE(same_tensors(read_consolidated(a.path, "", kind),
                             read_consolidated(b.path, "resaved", kind)))
        << kind;
  }
  // Another world size sums gradients in another order: close, not bitwise.
  EXPECT_LT((resharded - continued).abs().max().item<double>(), 2e-5);
  EXPECT_GT((continued - saved_params).abs().max().item<double>(), 1e-3);
}

INSTANTIATE_TEST_SUITE_P(Worlds, Reshard,
                         ::testing::Values(ReshardCase{2, 1, 1, 1}, ReshardCase{2, 1, 3, 1},
                                           ReshardCase{2, 1, 4, 1}, ReshardCase{2, 2, 1, 2},
                                           ReshardCase{2, 2, 3, 2}, ReshardCase{2, 2, 4, 2},
                                           ReshardCase{4, 2, 2, 2}, ReshardCase{2, 2, 3, 1},
                                           ReshardCase{2, 0, 3, 2}, ReshardCase{3, 2, 2, 0}));

// A minimal safetensors reader: u64 header length, JSON header, raw data.
struct Safetensors {
  YAML::Node header;
  std::string data;
};
Safetensors parse_safetensors(const std::string& path) {
  const std::string bytes = read_all(path);
  EXPECT_GE(bytes.size(), 8u);
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= static_cast<uint64_t>(static_cast<uint8_t>(bytes[i])) << (8 * i);
  return {YAML::Load(bytes.substr(8, n)), bytes.substr(8 + n)};
}

TEST(Consolidate, SafetensorsHoldsTheUnpaddedModel) {
  TempDir dir;
  at::Tensor flat;
  std::vector<std::pair<std::string, std::vector<int64_t>>> shapes;
  run_ranks(3, [&](std::shared_ptr<comm::Group> group) {
    auto net = make_tiny_net(9);
    auto e = initialize(net, make_config(2, 3), group);
    train(e, *net, 0, 2);
    e.save_checkpoint(dir.path);
    if (group->rank() != 0) return;
    flat = e.flat_parameters();
    for (const auto& p : net->named_parameters()) {
      shapes.emplace_back(p.key(), p.value().sizes().vec());
    }
  });
  const auto tensors = read_consolidated(dir.path);
  ASSERT_EQ(tensors.size(), shapes.size());
  std::vector<at::Tensor> parts;
  for (size_t i = 0; i < tensors.size(); ++i) {
    EXPECT_EQ(tensors[i].first, shapes[i].first);
    EXPECT_EQ(tensors[i].second.sizes().vec(), shapes[i].second);
    parts.push_back(tensors[i].second.reshape({-1}));
  }
  EXPECT_TRUE(at::equal(at::cat(parts), flat));

  for (const auto dtype : {at::kFloat, at::kBFloat16}) {
    const std::string out = dir.path + "/model.safetensors";
    write_safetensors(out, tensors, dtype, {{"format", "pt"}});
    const Safetensors st = parse_safetensors(out);
    EXPECT_EQ(st.header["__metadata__"]["format"].as<std::string>(), "pt");
    const int64_t elem = dtype == at::kFloat ? 4 : 2;
    uint64_t expected = 0;
    for (const auto& [name, t] : tensors) {
      const YAML::Node h = st.header[name];
      ASSERT_TRUE(h.IsMap()) << name;
      EXPECT_EQ(h["dtype"].as<std::string>(), dtype == at::kFloat ? "F32" : "BF16");
      EXPECT_EQ(h["shape"].as<std::vector<int64_t>>(), t.sizes().vec());
      const auto off = h["data_offsets"].as<std::vector<uint64_t>>();
      ASSERT_EQ(off[1] - off[0], static_cast<uint64_t>(t.numel() * elem)) << "no padding";
      at::Tensor want = t.to(dtype).contiguous();
      EXPECT_EQ(std::memcmp(st.data.data() + off[0], want.data_ptr(), off[1] - off[0]), 0) << name;
      expected += off[1] - off[0];
    }
    EXPECT_EQ(st.data.size(), expected) << "the data section holds exactly the parameters";
  }
}

// Copies `src` (a checkpoint dir) to a new dir and applies `damage` to it.
std::string damaged_copy(const std::string& src, const std::string& name,
                         const std::function<void(const fs::path&)>& damage) {
  const std::string dst = src + "_" + name;
  fs::remove_all(dst);
  fs::copy(src, dst, fs::copy_options::recursive);
  damage(fs::path(dst) / "step2");
  return dst;
}

// The shards hold fp32 masters whatever the compute dtype: a bf16 run's checkpoint resumes an
// fp32 run (and the other way round) with the same masters and optimizer states.
TEST(CrossDtype, MastersLoadIntoARunOfAnotherComputeDtype) {
  // Optimizer steps [from, to) with inputs in the model's dtype.
  const auto steps = [](Engine& e, TinyNetImpl& net, int from, int to) {
    const auto dtype = net.fc1->weight.scalar_type();
    for (int s = from; s < to; ++s) {
      const Batch b = rank_micro_batch(global_batch(s, kRows), e.rank(), e.world_size(), 0, 1);
      e.backward(mse(net.forward(b.x.to(dtype)).to(at::kFloat), b.y));
      e.step();
    }
  };
  for (const bool saved_bf16 : {true, false}) {
    TempDir a, b;
    Config save_cfg = make_config(2, 2);
    save_cfg.bf16 = saved_bf16;
    Config load_cfg = make_config(1, 2);
    load_cfg.bf16 = !saved_bf16;
    run_ranks(2, [&](std::shared_ptr<comm::Group> group) {
      auto net = make_tiny_net(5);
      auto e = initialize(net, save_cfg, group);
      steps(e, *net, 0, 2);
      e.save_checkpoint(a.path);
    });
    ::testing::internal::CaptureStderr();
    run_ranks(2, [&](std::shared_ptr<comm::Group> group) {
      auto net = make_tiny_net(6);
      auto e = initialize(net, load_cfg, group);
      e.load_checkpoint(a.path);
      EXPECT_EQ(e.stats().optimizer_steps, 2);
      e.save_checkpoint(b.path, "resaved");
      steps(e, *net, 2, 3);  // and it trains on
    });
    // Allowed, but the precision changes: said once (rank 0), naming both dtypes.
    const std::string err = ::testing::internal::GetCapturedStderr();
    const std::string from = saved_bf16 ? "bf16" : "fp32", to = saved_bf16 ? "fp32" : "bf16";
    const std::string want = "zero: warning: " + a.path +
                             "/step2 was saved by a run computing in " + from +
                             "; this run computes in " + to;
    EXPECT_NE(err.find(want), std::string::npos) << err;
    EXPECT_EQ(err.find(want), err.rfind(want)) << "once, not per rank: " << err;
    EXPECT_NE(err.find(saved_bf16 ? "set bf16.enabled: true)"
                                  : "set bf16.enabled and fp16.enabled false)"),
              std::string::npos)
        << err;
    for (const std::string kind : {"master", "exp_avg", "exp_avg_sq"}) {
      EXPECT_TRUE(same_tensors(read_consolidated(a.path, "", kind),
                               read_consolidated(b.path, "resaved", kind)))
          << kind << (saved_bf16 ? " bf16 -> fp32" : " fp32 -> bf16");
    }
  }
}

void flip_byte(const fs::path& file, int64_t from_end) {
  std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(-from_end, std::ios::end);
  char c;
  f.get(c);
  f.seekp(-from_end, std::ios::end);
  f.put(static_cast<char>(c ^ 0x10));
}

TEST(Failures, EveryRankRefusesWithTheFileNamed) {
  TempDir dir;
  run_ranks(2, [&](std::shared_ptr<comm::Group> group) {
    auto net = make_tiny_net(4);
    auto e = initialize(net, make_config(2, 2), group);
    train(e, *net, 0, 1);
    e.save_checkpoint(dir.path);  // step1
    train(e, *net, 1, 2);
    e.save_checkpoint(dir.path);  // step2
  });
  const std::string shard1 = "shard_rank1_of_2.bin";
  const auto size = [&](const fs::path& d) { return fs::file_size(d / shard1); };
  struct Case {
    std::string dir, tag, pattern;  // pattern: a regex the message must contain
  };
  std::vector<Case> cases;
  const auto add = [&](const char* name, const char* tag, const std::string& pattern,
                       const std::function<void(const fs::path&)>& damage) {
    cases.push_back({damaged_copy(dir.path, name, damage), tag, pattern});
  };
  // Only rank 1 checksums file 1's data: rank 0 must still stop, with rank 1's message.
  add("flip", "step2", "rank 1 of 2 .*" + shard1 + ": corrupted: the data checksum",
      [&](auto d) { flip_byte(d / shard1, 3); });
  add("header", "step2", shard1 + ": corrupted: the header checksum",
      [&](auto d) { flip_byte(d / shard1, size(d) - 20); });
  add("trunc", "step2", shard1 + ": truncated",
      [&](auto d) { fs::resize_file(d / shard1, size(d) - 100); });
  add("missing", "step2", shard1 + ": missing", [&](auto d) { fs::remove(d / shard1); });
  add("nomanifest", "", "step2/manifest.json: missing",
      [&](auto d) { fs::remove(d / "manifest.json"); });
  add("mixed", "step2", shard1 + ": .* from another save", [&](auto d) {
    fs::copy_file(d.parent_path() / "step1" / shard1, d / shard1,
                  fs::copy_options::overwrite_existing);
  });
  add("none", "", "_none/latest: missing", [&](auto d) { fs::remove_all(d.parent_path()); });
  // Binary garbage in `latest`: escaped, not cut at the first NUL byte.
  add("garbage", "",
      R"(_garbage/latest: does not hold a checkpoint tag but 8 bytes of other data )"
      R"(\("\\x00\\x13\\xffstep2"\): the file is damaged; write the tag of a complete )"
      R"(checkpoint into it)",
      [&](auto d) {
        std::ofstream(d.parent_path() / "latest", std::ios::binary | std::ios::trunc)
            << std::string("\0\x13\xffstep2", 8);
      });
  // Loading reads; it never writes.
  const std::string flipped = cases[0].dir + "/step2/" + shard1;
  const std::string bytes_before = read_all(flipped);
  run_ranks(2, [&](std::shared_ptr<comm::Group> group) {
    auto net = make_tiny_net(8);
    auto e = initialize(net, make_config(2, 2), group);
    const at::Tensor before = e.flat_parameters();
    for (const Case& c : cases) {
      expect_refused([&] { e.load_checkpoint(c.dir, c.tag); }, c.pattern, group->rank());
      EXPECT_TRUE(at::equal(e.flat_parameters(), before)) << "a refused load changed nothing";
    }
    // The earlier checkpoint next to the damaged one still loads.
    EXPECT_EQ(e.load_checkpoint(cases[0].dir, "step1"), "step1");
    EXPECT_EQ(e.stats().optimizer_steps, 1);

    // Another model: names the parameter and both shapes.
    auto other = std::make_shared<TinyNetImpl>(12, 16, 5);
    auto e2 = initialize(other, make_config(2, 2), group);
    expect_refused([&] { e2.load_checkpoint(dir.path); },
                   "different model: parameter 'fc1\\.weight' has shape \\[24, 12\\] in the "
                   "checkpoint but \\[16, 12\\]",
                   group->rank());
  });
  EXPECT_EQ(read_all(flipped), bytes_before);
  for (const Case& c : cases) fs::remove_all(c.dir);
}

// A load that fails after every file checked out (here: rank 1's saved generator state does not
// fit this LibTorch) leaves the run exactly as it was: it trains on as if never asked to load.
TEST(Failures, ALoadThatFailsLateChangesNothing) {
  TempDir dir;
  run_ranks(2, [&](std::shared_ptr<comm::Group> group) {
    auto net = make_tiny_net(4);
    auto e = initialize(net, make_config(2, 2), group);
    train(e, *net, 0, 2);
    e.save_checkpoint(dir.path);  // step2
  });
  // Rank 1's shard rewritten with the same data and a generator state of the wrong size; its
  // checksums and the manifest's record of it are made consistent again.
  const fs::path step = fs::path(dir.path) / "step2";
  const std::string name = ckpt::shard_file_name(1, 2);
  {
    const ckpt::ShardReader reader((step / name).string());
    ckpt::ShardIndex index = reader.index();
    index.rng_state = "not a generator state";
    std::vector<std::vector<float>> blocks;
    for (const ckpt::ShardEntry& e : index.entries) {
      for (size_t t = 0; t <= index.state_names.size(); ++t) {
        blocks.emplace_back(e.count);
        reader.read(e, static_cast<int>(t), 0, e.count, blocks.back().data());
      }
    }
    ckpt::ShardWriter writer((step / name).string(), index);
    for (const auto& b : blocks) writer.append(b.data(), static_cast<int64_t>(b.size()));
    const ckpt::WrittenFile written = writer.finish();
    const std::string manifest = (step / "manifest.json").string();
    ckpt::Manifest man = ckpt::parse_manifest(read_all(manifest), manifest);
    for (auto& f : man.files) {
      if (f.name == name) f.bytes = written.bytes, f.payload_crc = written.payload_crc;
    }
    std::ofstream(manifest, std::ios::trunc) << ckpt::manifest_to_json(man);
  }
  run_ranks(2, [&](std::shared_ptr<comm::Group> group) {
    auto net = make_tiny_net(8);
    auto e = initialize(net, make_config(2, 2), group);
    train(e, *net, 0, 1);
    expect_refused([&] { e.load_checkpoint(dir.path); }, "random-generator state", group->rank());
    EXPECT_EQ(e.stats().optimizer_steps, 1);
    train(e, *net, 1, 3);
    // The same run, never asked to load.
    auto twin_net = make_tiny_net(8);
    auto twin = initialize(twin_net, make_config(2, 2), group);
    train(twin, *twin_net, 0, 3);
    EXPECT_TRUE(at::equal(e.flat_parameters(), twin.flat_parameters())) << group->rank();
  });
}

TEST(Atomicity, LeftoversOfACrashedSaveAreIgnoredAndReplaced) {
  TempDir dir;
  run_ranks(2, [&](std::shared_ptr<comm::Group> group) {
    auto net = make_tiny_net(4);
    auto e = initialize(net, make_config(1, 2), group);
    train(e, *net, 0, 2);
    e.save_checkpoint(dir.path);
    const at::Tensor at2 = e.flat_parameters();
    group->barrier("test: saved");
    if (group->rank() == 0) {
      // What a save killed half-way leaves: a partial tag.tmp and a partial latest.tmp.
      fs::create_directories(dir.path + "/step3.tmp");
      std::ofstream(dir.path + "/step3.tmp/shard_rank0_of_2.bin") << "partial";
      std::ofstream(dir.path + "/latest.tmp") << "ste";
    }
    group->barrier("test: crashed");
    train(e, *net, 2, 3);
    auto net2 = make_tiny_net(5);
    auto e2 = initialize(net2, make_config(1, 2), group);
    EXPECT_EQ(e2.load_checkpoint(dir.path), "step2");
    EXPECT_TRUE(at::equal(e2.flat_parameters(), at2));
    e.save_checkpoint(dir.path);  // step3 replaces the leftovers
    EXPECT_EQ(e2.load_checkpoint(dir.path), "step3");
    EXPECT_TRUE(at::equal(e2.flat_parameters(), e.flat_parameters()));
    e.save_checkpoint(dir.path);  // the same tag again: replaced in place
    EXPECT_EQ(e2.load_checkpoint(dir.path, "step3"), "step3");
  });
  EXPECT_FALSE(fs::exists(dir.path + "/step3.tmp"));
}

TEST(KeepLast, PrunesOlderCheckpointsAfterLatestMoved) {
  TempDir dir;
  run_ranks(2, [&](std::shared_ptr<comm::Group> group) {
    auto net = make_tiny_net(4);
    auto e = initialize(net, make_config(2, 2), group);
    for (int s = 0; s < 4; ++s) {
      train(e, *net, s, s + 1);
      e.save_checkpoint(dir.path, "", /*keep_last=*/2);
    }
  });
  EXPECT_FALSE(fs::exists(dir.path + "/step1") || fs::exists(dir.path + "/step2"));
  EXPECT_TRUE(fs::exists(dir.path + "/step3/manifest.json"));
  EXPECT_EQ(latest_checkpoint_tag(dir.path), "step4");
}

TEST(NanGradients, ClearErrorOnEveryRankAndMasterUntouched) {
  TempDir dir;
  std::atomic<int> threw{0};
  run_ranks(2, [&](std::shared_ptr<comm::Group> group) {
    auto net = make_tiny_net(4);
    auto e = initialize(net, make_config(2, 2), group);
    train(e, *net, 0, 1);
    e.save_checkpoint(dir.path, "before");
    const at::Tensor before = e.flat_parameters();
    const Batch b = rank_micro_batch(global_batch(1, kRows), e.rank(), 2, 0, 1);
    // Only rank 1's loss is NaN: the global norm still stops both ranks.
    const double poison = group->rank() == 1 ? std::nan("") : 1.0;
    e.backward(mse(net->forward(b.x), b.y) * poison);
    try {
      e.step();
    } catch (const c10::Error& err) {
      EXPECT_TRUE(
          std::regex_search(err.what(), std::regex("norm is nan.*weights were not updated")));
      ++threw;
    }
    EXPECT_TRUE(at::equal(e.flat_parameters(), before));
    EXPECT_EQ(e.stats().optimizer_steps, 1);
    e.save_checkpoint(dir.path, "after");
  });
  EXPECT_EQ(threw.load(), 2);
  EXPECT_TRUE(
      same_tensors(read_consolidated(dir.path, "before"), read_consolidated(dir.path, "after")));
  EXPECT_TRUE(same_tensors(read_consolidated(dir.path, "before", "exp_avg"),
                           read_consolidated(dir.path, "after", "exp_avg")));
}

}  // namespace
}  // namespace zero::testing
