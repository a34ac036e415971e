// Checkpoints at ZeRO stage 3, on real gloo ranks (threads): each rank writes only its own
// shard of every unit (no rank gathers the model), the manifest records the unit layout, a
// resume on the same world size continues bit for bit, and a resume on another world size or
// at stage 2 (and a stage-2 save resumed at stage 3) holds the same state per parameter and
// continues within fp32 tolerance of the uninterrupted run and of single-process training
// (torch's own optimizers on the whole batch). stage3_gather_16bit_weights_on_model_save adds
// the gathered compute-dtype weights as <tag>/model.safetensors.
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>
#include <torch/nn/modules/linear.h>
#include <unistd.h>
#include <yaml-cpp/yaml.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <mutex>

#include "support/stage3_net.hpp"
#include "support/thread_group.hpp"
#include "support/tiny_net.hpp"
#include "zero/checkpoint/checkpoint_format.hpp"
#include "zero/checkpoint_io.hpp"
#include "zero/engine.hpp"
#include "zero/safetensors.hpp"
#include "zero/sharding.hpp"

namespace zero::testing {
namespace {
namespace fs = std::filesystem;

constexpr int64_t kWidth = kStage3Width;
constexpr int kBlocks = kStage3Blocks;
constexpr int64_t kRows = 48;  // divisible by 1, 2, 3 and 4 ranks, with accumulation 2
constexpr int K = 3;           // steps before the save, and after it

struct TempDir {
  static inline std::atomic<int> counter{0};
  std::string path = (fs::temp_directory_path() /
                      ("zero_s3ck_" + std::to_string(::getpid()) + "_" + std::to_string(counter++)))
                         .string();
  ~TempDir() { fs::remove_all(path); }
};

using Net = Stage3NetImpl;

std::shared_ptr<Net> make_net(uint64_t seed, bool mark = true) {
  return make_stage3_net(seed, mark);
}

// Constant lr (the reference has no scheduler); clipping active; persistence 0: every block
// parameter sharded and gathered on use.
Config make_config(int stage, int world, bool sgd, int accumulation = 1) {
  Config c = test_config(stage, kRows / (world * accumulation), accumulation, /*clip=*/0.3);
  if (sgd) {
    c.optimizer.type = "SGD";
    c.optimizer.lr = 0.05;
    c.optimizer.momentum = 0.9;
    c.optimizer.weight_decay = 0.01;
  }
  c.zero_optimization.stage3.param_persistence_threshold = 0;
  return c;
}

// Optimizer steps [from, to); per micro-step this rank's loss and the mean over ranks (the
// loss of the global micro-batch: every rank has as many rows).
struct Losses {
  std::vector<double> mine, global;
};
Losses train(Engine& e, Net& net, int from, int to) {
  const int acc = static_cast<int>(e.config().gradient_accumulation_steps);
  Losses out;
  for (int s = from; s < to; ++s) {
    const Batch g = global_batch(s, kRows);
    for (int m = 0; m < acc; ++m) {
      const Batch b = rank_micro_batch(g, e.rank(), e.world_size(), m, acc);
      at::Tensor loss = mse(net.forward(b.x), b.y);
      out.mine.push_back(loss.item<double>());
      out.global.push_back(e.all_reduce_mean(out.mine.back()));
      e.backward(loss);
      e.step();
    }
  }
  return out;
}

double max_abs(const at::Tensor& a, const at::Tensor& b) {
  return (a - b).abs().max().item<double>();
}

// Between steps a marked block holds no parameter bytes, whatever a load did.
void expect_released(Net& net) {
  for (size_t i = 0; i < net.body->size(); ++i) {
    EXPECT_EQ(net.body->block_module(i).fc->weight.numel(), 0) << "block " << i;
  }
}

struct ResumeCase {
  bool sgd;
  int accumulation;
};
void PrintTo(const ResumeCase& c, std::ostream* os) {
  *os << (c.sgd ? "SGD" : "AdamW") << ", accumulation " << c.accumulation;
}
class Stage3ExactResume : public ::testing::TestWithParam<ResumeCase> {};

TEST_P(Stage3ExactResume, BitwiseSameAsUninterrupted) {
  const ResumeCase c = GetParam();
  TempDir dir;
  const Config cfg = make_config(3, 2, c.sgd, c.accumulation);
  run_ranks(2, [&](std::shared_ptr<comm::Group> group) {
    auto net = make_net(3);
    auto e = initialize(net, cfg, group);
    train(e, *net, 0, K);
    e.save_checkpoint(dir.path);
    const Losses ref = train(e, *net, K, 2 * K);

    auto net2 = make_net(77);  // other initial weights: every value must come from disk
    auto e2 = initialize(net2, cfg, group);
    ASSERT_EQ(e2.stage(), 3);
    EXPECT_EQ(e2.load_checkpoint(dir.path), "step" + std::to_string(K));
    expect_released(*net2);
    EXPECT_EQ(e2.stats().optimizer_steps, K);
    EXPECT_EQ(e2.stats().micro_steps, K * c.accumulation);
    const Losses resumed = train(e2, *net2, K, 2 * K);
    EXPECT_EQ(resumed.mine, ref.mine) << "rank " << group->rank();
    EXPECT_TRUE(at::equal(e2.flat_parameters(), e.flat_parameters()));
  });
}

INSTANTIATE_TEST_SUITE_P(Optimizers, Stage3ExactResume,
                         ::testing::Values(ResumeCase{false, 1}, ResumeCase{false, 2},
                                           ResumeCase{true, 2}),
                         [](const auto& info) {
                           return std::string(info.param.sgd ? "sgd" : "adamw") + "_ga" +
                                  std::to_string(info.param.accumulation);
                         });

struct ReshardCase {
  int save_world, save_stage, load_world, load_stage;
  bool sgd;
};
void PrintTo(const ReshardCase& c, std::ostream* os) {
  *os << c.save_world << " ranks stage " << c.save_stage << " -> " << c.load_world
      << " ranks stage " << c.load_stage << (c.sgd ? ", SGD" : ", AdamW");
}
std::string reshard_name(const ::testing::TestParamInfo<ReshardCase>& info) {
  const ReshardCase& c = info.param;
  return "n" + std::to_string(c.save_world) + "s" + std::to_string(c.save_stage) + "_to_n" +
         std::to_string(c.load_world) + "s" + std::to_string(c.load_stage) +
         (c.sgd ? "_sgd" : "_adamw");
}
class Stage3Reshard : public ::testing::TestWithParam<ReshardCase> {};

TEST_P(Stage3Reshard, SameStatesAndContinuation) {
  const ReshardCase c = GetParam();
  TempDir a, b;
  at::Tensor saved_params, continued, loaded_params, resharded;  // rank 0 writes them
  std::vector<double> continued_losses, resharded_losses;
  run_ranks(c.save_world, [&](std::shared_ptr<comm::Group> group) {
    auto net = make_net(5);
    auto e = initialize(net, make_config(c.save_stage, c.save_world, c.sgd), group);
    train(e, *net, 0, K);
    e.save_checkpoint(a.path);
    const at::Tensor p = e.flat_parameters();
    const Losses l = train(e, *net, K, 2 * K);
    const at::Tensor end = e.flat_parameters();
    if (group->rank() == 0) saved_params = p, continued = end, continued_losses = l.global;
  });
  run_ranks(c.load_world, [&](std::shared_ptr<comm::Group> group) {
    auto net = make_net(6);
    auto e = initialize(net, make_config(c.load_stage, c.load_world, c.sgd), group);
    e.load_checkpoint(a.path);
    const at::Tensor p = e.flat_parameters();
    if (c.load_stage == 3) expect_released(*net);
    e.save_checkpoint(b.path, "resaved");
    const Losses l = train(e, *net, K, 2 * K);
    const at::Tensor end = e.flat_parameters();
    if (group->rank() == 0) loaded_params = p, resharded = end, resharded_losses = l.global;
  });
  ASSERT_TRUE(saved_params.defined() && loaded_params.defined());
  // The fp32 masters are copied, not recomputed: the loaded parameters are the saved ones.
  EXPECT_TRUE(at::equal(loaded_params, saved_params));
  // Every optimizer state, element for element, after a round trip through the other layout.
  const CheckpointInfo saved = read_checkpoint_info(a.path);
  const CheckpointInfo info = read_checkpoint_info(b.path);
  EXPECT_EQ(saved.stage, c.save_stage);
  EXPECT_EQ(info.stage, c.load_stage);
  EXPECT_EQ(info.world_size, c.load_world);
  EXPECT_EQ(info.optimizer_steps, K);
  ASSERT_FALSE(info.state_names.empty());
  std::vector<std::string> kinds{"master"};
  for (const auto& s : info.state_names) kinds.push_back(s);
  for (const std::string& kind : kinds) {
    const auto x = read_consolidated(a.path, "", kind);
    const auto y = read_consolidated(b.path, "resaved", kind);
    ASSERT_EQ(x.size(), y.size()) << kind;
    for (size_t i = 0; i < x.size(); ++i) {
      EXPECT_EQ(x[i].first, y[i].first);
      EXPECT_TRUE(at::equal(x[i].second, y[i].second)) << kind << " " << x[i].first;
    }
  }
  // Another world size sums gradients in another order: close, not bitwise.
  ASSERT_EQ(resharded_losses.size(), continued_losses.size());
  for (size_t i = 0; i < continued_losses.size(); ++i) {
    EXPECT_NEAR(resharded_losses[i], continued_losses[i], 1e-5 * std::abs(continued_losses[i]))
        << "step " << K + i;
  }
  EXPECT_LT(max_abs(resharded, continued), 2e-5);
  EXPECT_GT(max_abs(continued, saved_params), 1e-3);  // the continuation moved the parameters
  // And both against single-process training on the whole batch for all 2K steps.
  auto ref_net = make_net(5, /*mark=*/false);
  const ReferenceResult ref =
      train_reference(make_config(3, 1, c.sgd), 2 * K, kRows, *ref_net,
                      [&](const at::Tensor& x) { return ref_net->forward(x); });
  EXPECT_LT(max_abs(resharded, ref.params), 2e-5);
  EXPECT_LT(max_abs(continued, ref.params), 2e-5);
  std::cerr << reshard_name({c, 0}) << ": max |resharded - uninterrupted| "
            << max_abs(resharded, continued) << ", vs single process "
            << max_abs(resharded, ref.params) << "\n";
}

INSTANTIATE_TEST_SUITE_P(
    Worlds, Stage3Reshard,
    ::testing::Values(ReshardCase{2, 3, 4, 3, false}, ReshardCase{4, 3, 2, 3, false},
                      ReshardCase{2, 3, 4, 3, true}, ReshardCase{4, 3, 2, 3, true},
                      ReshardCase{2, 2, 2, 3, false}, ReshardCase{2, 3, 2, 2, false},
                      ReshardCase{2, 3, 3, 2, true}, ReshardCase{4, 2, 3, 3, true}),
    reshard_name);

// What a stage-3 save writes: rank r's file holds rank r's shard of every unit (each element
// of the model in exactly one file, no file near the whole model), and the manifest lists the
// units with their parameters and offsets.
TEST(Stage3Checkpoint, EachRankWritesItsShardAndTheManifestRecordsTheUnits) {
  constexpr int N = 4;
  TempDir dir;
  int64_t num_params = 0, padding = 0;
  run_ranks(N, [&](std::shared_ptr<comm::Group> group) {
    auto net = make_net(3);
    auto e = initialize(net, make_config(3, N, false), group);
    train(e, *net, 0, 1);
    e.save_checkpoint(dir.path, "t");
    const MemoryReport mr = e.memory_report();
    if (group->rank() == 0) num_params = mr.num_params, padding = mr.padded_params - mr.num_params;
  });
  const std::string tag_dir = dir.path + "/t";
  int64_t total = 0;
  std::map<std::string, int64_t> per_param;
  for (int r = 0; r < N; ++r) {
    const ckpt::ShardReader reader(tag_dir + "/" + ckpt::shard_file_name(r, N));
    int64_t mine = 0;
    for (const auto& entry : reader.index().entries) {
      mine += entry.count;
      per_param[entry.name] += entry.count;
    }
    // A quarter of the model, up to the layout's padding (the buckets' shards are equal).
    EXPECT_LE(mine, num_params / N + padding) << "rank " << r;
    EXPECT_GE(mine, num_params / N - padding) << "rank " << r;
    total += mine;
  }
  EXPECT_EQ(total, num_params);  // each element once: no two ranks wrote the same piece
  auto net = make_net(3);
  for (const auto& item : net->named_parameters()) {
    EXPECT_EQ(per_param[item.key()], item.value().numel()) << item.key();
  }

  const YAML::Node man = YAML::LoadFile(tag_dir + "/manifest.json");
  // What a loader reads back: the same units.
  const ckpt::Manifest parsed = ckpt::parse_manifest(
      ckpt::read_text(tag_dir + "/manifest.json", "the test's save"), tag_dir + "/manifest.json");
  ASSERT_EQ(parsed.units.size(), 1u + kBlocks);
  EXPECT_EQ(parsed.units.front().name, "<root>");
  EXPECT_EQ(parsed.units.front().params.size(), 4u);
  EXPECT_EQ(man["stage"].as<int>(), 3);
  const YAML::Node units = man["units"];
  ASSERT_TRUE(units.IsSequence());
  ASSERT_EQ(units.size(), 1u + kBlocks);
  std::map<std::string, std::vector<std::string>> expected{
      {"<root>", {"inp.weight", "inp.bias", "head.weight", "head.bias"}}};
  for (int i = 0; i < kBlocks; ++i) {
    const std::string m = "body.block" + std::to_string(i);
    expected[m] = {m + ".fc.weight", m + ".fc.bias", m + ".norm.weight", m + ".norm.bias"};
  }
  std::map<std::string, int64_t> numel_of;
  for (const auto& item : net->named_parameters()) numel_of[item.key()] = item.value().numel();
  for (const auto& u : units) {
    const std::string name = u["name"].as<std::string>();
    ASSERT_TRUE(expected.count(name)) << name;
    auto params = u["params"].as<std::vector<std::string>>();
    const auto offsets = u["offsets"].as<std::vector<int64_t>>();
    const int64_t numel = u["numel"].as<int64_t>();
    ASSERT_EQ(params.size(), offsets.size()) << name;
    // Each parameter inside the unit's buffer, none overlapping another.
    std::vector<std::pair<int64_t, int64_t>> spans;
    for (size_t i = 0; i < params.size(); ++i) {
      spans.emplace_back(offsets[i], offsets[i] + numel_of.at(params[i]));
      EXPECT_GE(offsets[i], 0);
      EXPECT_LE(spans.back().second, numel) << params[i];
    }
    std::sort(spans.begin(), spans.end());
    for (size_t i = 1; i < spans.size(); ++i) EXPECT_LE(spans[i - 1].second, spans[i].first);
    std::sort(params.begin(), params.end());
    auto want = expected.at(name);
    std::sort(want.begin(), want.end());
    EXPECT_EQ(params, want) << name;
    expected.erase(name);
  }
  EXPECT_TRUE(expected.empty());
}

// stage3_gather_16bit_weights_on_model_save (DeepSpeed's save_16bit_model): the save also holds
// <tag>/model.safetensors, the compute-dtype weights gathered to rank 0, equal to what
// state_dict() returns; without the key (or below stage 3, where only stage 3 reads it) there
// is no such file. The checkpoint still resumes.
TEST(Stage3Checkpoint, Gather16BitWeightsOnSaveWritesTheModelInTheComputeDtype) {
  for (const auto& [stage, on] : {std::pair{3, true}, std::pair{3, false}, std::pair{2, true}}) {
    TempDir dir;
    Config cfg = make_config(stage, 2, false);
    cfg.bf16 = true;
    cfg.zero_optimization.stage3.gather_16bit_weights_on_model_save = on;
    std::vector<std::pair<std::string, at::Tensor>> expected;
    run_ranks(2, [&](std::shared_ptr<comm::Group> group) {
      auto net = make_net(3);
      auto e = initialize(net, cfg, group);
      for (int s = 0; s < 2; ++s) {
        const Batch b = rank_micro_batch(global_batch(s, kRows), e.rank(), 2, 0, 1);
        e.backward(mse(net->forward(b.x.to(at::kBFloat16)).to(at::kFloat), b.y));
        e.step();
      }
      e.save_checkpoint(dir.path, "t");
      StateDict sd = e.state_dict({.master = false});  // the compute-dtype values
      if (group->rank() == 0) expected = std::move(sd);
      auto net2 = make_net(9);
      auto e2 = initialize(net2, cfg, group);
      e2.load_checkpoint(dir.path);
      EXPECT_TRUE(at::equal(e2.flat_parameters(), e.flat_parameters()));
    });
    const std::string file = dir.path + "/t/model.safetensors";
    const std::string what = "stage " + std::to_string(stage) + (on ? " with" : " without");
    if (stage != 3 || !on) {
      EXPECT_FALSE(fs::exists(file)) << what;
      continue;
    }
    ASSERT_TRUE(fs::exists(file)) << what;
    const SafetensorsFile st(file);
    ASSERT_EQ(st.names().size(), expected.size());
    for (const auto& [name, t] : expected) {
      ASSERT_TRUE(st.contains(name)) << name;
      EXPECT_EQ(st.entry(name).dtype, "BF16") << name;
      EXPECT_EQ(t.scalar_type(), at::kBFloat16) << name;
      const at::Tensor got = st.read(name);
      EXPECT_EQ(got.sizes(), t.sizes()) << name;
      EXPECT_TRUE(at::equal(got, t.cpu())) << name;
    }
  }
}

}  // namespace
}  // namespace zero::testing
