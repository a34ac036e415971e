// Hugging Face weights read in slices (docs/start-up.md): SafetensorsFile::read_range against the
// whole-tensor read, and a deferred GPT initialised from hf_llama_values on real gloo
// thread-ranks against the eager model load_hf_llama fills (the reference: no engine), bf16 and
// fp32 files, sharded into several files; at stage 3 a rank reads its shard and the root unit.
// (Against transformers itself: the e2e runs hf_llama_roundtrip.sh and hf_llama_stage3.sh, which
// start zero-train this way.)
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "support/thread_group.hpp"
#include "support/tiny_net.hpp"
#include "zero/deferred_init.hpp"
#include "zero/engine.hpp"
#include "zero/errors.hpp"
#include "zero/models/gpt.hpp"
#include "zero/models/hf_llama.hpp"
#include "zero/safetensors.hpp"

namespace zero::testing {
namespace {

namespace fs = std::filesystem;

struct TempDir {
  fs::path path = fs::temp_directory_path() /
                  ("zero_hf_sliced_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
  TempDir() { fs::create_directories(path); }
  ~TempDir() { fs::remove_all(path); }
  std::string str() const { return path.string(); }
  static inline int counter = 0;
};

models::GptConfig shape() {
  models::GptConfig c;
  c.vocab = 40, c.dim = 32, c.layers = 3, c.heads = 4, c.kv_heads = 2, c.ffn = 48, c.max_seq = 16;
  c.tied = false, c.qkv_bias = true;
  return c;
}

std::vector<std::pair<std::string, at::Tensor>> named(models::GptImpl& m) {
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (const auto& item : m.named_parameters()) out.emplace_back(item.key(), item.value());
  return out;
}

// An HF directory of the seed's GPT in `dtype`, several shard files.
void export_model(const std::string& dir, at::ScalarType dtype) {
  at::manual_seed(11);
  models::Gpt src(shape());
  models::HfExportOptions opts;
  opts.dtype = dtype;
  opts.max_shard_bytes = 20'000;
  models::save_hf_llama(shape(), named(*src), dir, opts);
}

TEST(HfLlamaSliced, ReadRangeIsTheWholeReadSliced) {
  for (at::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
    TempDir dir;
    models::HfExportOptions opts;
    opts.dtype = dtype;
    at::manual_seed(3);
    models::Gpt src(shape());
    models::save_hf_llama(shape(), named(*src), dir.str(), opts);  // one file
    SafetensorsFile f(dir.str() + "/model.safetensors");
    for (const std::string& name : f.names()) {
      const at::Tensor whole = f.read(name).reshape({-1});
      const int64_t n = whole.numel();
      for (const auto& [b, k] : std::vector<std::pair<int64_t, int64_t>>{
               {0, n}, {0, 1}, {n - 1, 1}, {n / 3, n / 2}, {n / 2, 0}}) {
        EXPECT_TRUE(at::equal(f.read_range(name, b, k), whole.narrow(0, b, k)))
            << name << " [" << b << ", +" << k << ")";
      }
    }
    const uint64_t before = f.range_bytes_read();
    f.read_range("model.norm.weight", 4, 8);
    EXPECT_EQ(f.range_bytes_read() - before, 8 * c10::elementSize(dtype));
    try {
      f.read_range("model.norm.weight", 30, 3);
      ADD_FAILURE() << "a range past the tensor's end was read";
    } catch (const CheckpointError& e) {
      EXPECT_NE(std::string(e.what()).find("model.norm.weight"), std::string::npos) << e.what();
    }
  }
}

std::mutex build_mutex;  // the ranks share the global generator

void expect_sliced_matches_load(at::ScalarType file_dtype, int stage, bool bf16, int world) {
  SCOPED_TRACE(std::string(file_dtype == at::kFloat ? "fp32" : "bf16") + " files, stage " +
               std::to_string(stage) + (bf16 ? " bf16" : " fp32") + ", world " +
               std::to_string(world));
  TempDir dir;
  export_model(dir.str(), file_dtype);
  // The reference: an eager model filled by load_hf_llama.
  at::manual_seed(4);
  models::Gpt ref(shape());
  models::load_hf_llama(*ref, dir.str());
  Config cfg = test_config(stage, 1, 1, 0.0, /*bucket=*/2000);
  cfg.zero_optimization.stage3.param_persistence_threshold = 0;
  cfg.bf16 = bf16;
  std::vector<StateDict> masters(world);
  std::vector<int64_t> read(world);
  std::vector<int64_t> kept(world);
  run_ranks(world, [&](std::shared_ptr<comm::Group> group) {
    const int r = group->rank();
    std::shared_ptr<models::GptImpl> gpt;
    {
      std::lock_guard<std::mutex> lock(build_mutex);
      gpt = std::make_shared<models::GptImpl>(shape(), Deferred{});
    }
    auto bytes = std::make_shared<std::atomic<int64_t>>(0);
    auto engine = initialize(gpt, cfg, group, models::hf_llama_values(*gpt, dir.str(), bytes));
    read[r] = *bytes;
    // What this rank holds: its shard of the blocks (the fp32 master: no compute-dtype copy
    // under bf16 either), the root unit whole in the compute dtype.
    const MemoryBreakdown m = engine.memory_report().measured;
    kept[r] = m.params / (bf16 ? 2 : 4) + m.master / 4;
    masters[r] = engine.state_dict({/*master=*/true});
  });
  const auto want = ref->named_parameters();
  int64_t total = 0;
  for (const auto& item : want) total += item.value().numel();
  const int64_t elem = static_cast<int64_t>(c10::elementSize(file_dtype));
  for (int r = 0; r < world; ++r) {
    SCOPED_TRACE("rank " + std::to_string(r));
    ASSERT_EQ(masters[r].size(), want.size());
    for (const auto& [name, t] : masters[r]) {
      EXPECT_TRUE(at::equal(t, want[name])) << name;
    }
    if (stage == 3) {
      // A rank read what it keeps (its shard and the root unit), not the model.
      EXPECT_LE(read[r], kept[r] * elem);
      EXPECT_LT(read[r], total * elem * 3 / 4);
    } else {
      EXPECT_EQ(read[r], total * elem);  // stages 0-2 hold every parameter: read once
    }
  }
}

TEST(HfLlamaSliced, DeferredGptHoldsWhatLoadHfLlamaLoads) {
  expect_sliced_matches_load(at::kBFloat16, 3, false, 2);
  expect_sliced_matches_load(at::kFloat, 3, false, 4);
  expect_sliced_matches_load(at::kBFloat16, 3, true, 4);
  expect_sliced_matches_load(at::kFloat, 2, true, 2);
  expect_sliced_matches_load(at::kBFloat16, 1, false, 2);
}

TEST(HfLlamaSliced, ADeferredModelIsNotLoadedWhole) {
  TempDir dir;
  export_model(dir.str(), at::kFloat);
  models::Gpt gpt(shape(), Deferred{});
  try {
    models::load_hf_llama(*gpt, dir.str());
    ADD_FAILURE() << "load_hf_llama filled a deferred model";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("hf_llama_values"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace zero::testing
