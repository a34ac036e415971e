// The end-of-run summary's parameter checksum: the same sum and norm as a flat copy of the model,
// computed without one. Measured with a counting CPU allocator installed for the test: the
// summary used to cat every parameter into one fp32 tensor (Engine::flat_parameters(), ~28 GB at
// 7B), and on a GPU that temporary was what device_peak_allocated_bytes then reported.
#include <ATen/ATen.h>
#include <c10/core/CPUAllocator.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>

#include "phase_peaks.hpp"
#include "pp_summary.hpp"
#include "support/fake_device.hpp"
#include "train_summary.hpp"

namespace zero::examples {
namespace {

// Wraps the CPU allocator and counts the bytes in use and their peak.
class CountingAllocator final : public c10::Allocator {
 public:
  explicit CountingAllocator(c10::Allocator* base) : base_(base) {}

  c10::DataPtr allocate(size_t n) override {
    auto ctx = std::make_unique<Context>(Context{base_->allocate(n), this, n});
    void* data = ctx->inner.get();
    const int64_t now = in_use_ += static_cast<int64_t>(n);
    int64_t seen = peak_.load();
    while (now > seen && !peak_.compare_exchange_weak(seen, now)) {
    }
    return {data, ctx.release(), &release, c10::Device(c10::kCPU)};
  }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    std::memcpy(dest, src, count);
  }

  int64_t in_use() const { return in_use_; }
  int64_t peak() const { return peak_; }
  void reset_peak() { peak_ = in_use_.load(); }

 private:
  struct Context {
    c10::DataPtr inner;
    CountingAllocator* owner;
    size_t bytes;
  };
  static void release(void* p) {
    std::unique_ptr<Context> ctx(static_cast<Context*>(p));
    ctx->owner->in_use_ -= static_cast<int64_t>(ctx->bytes);
  }

  c10::Allocator* base_;
  std::atomic<int64_t> in_use_{0}, peak_{0};
};

// Installs the counting allocator for the scope's lifetime (then the previous one again).
class Counting {
 public:
  Counting() : previous_(c10::GetCPUAllocator()), counter_(previous_) {
    c10::SetCPUAllocator(&counter_, /*priority=*/100);
  }
  ~Counting() { c10::SetCPUAllocator(previous_, /*priority=*/100); }
  Counting(const Counting&) = delete;
  Counting& operator=(const Counting&) = delete;
  CountingAllocator& operator*() { return counter_; }

 private:
  c10::Allocator* previous_;
  CountingAllocator counter_;
};

std::vector<at::Tensor> model_like(at::ScalarType dtype) {
  at::manual_seed(3);
  std::vector<at::Tensor> params;
  for (int64_t n : {1 << 20, 3 << 18, 1 << 19, 1 << 20, 4097}) {
    at::Tensor p = at::randn({n}).to(dtype);
    p.set_requires_grad(true);
    params.push_back(p);
  }
  params.push_back(params[1]);                             // a tied weight: counted once
  params.push_back(at::full({1 << 18}, 100.0).to(dtype));  // frozen: not trained, not counted
  return params;
}

void expect_streamed_stats(at::ScalarType dtype) {
  const std::vector<at::Tensor> params = model_like(dtype);
  int64_t total = 0;
  for (size_t i = 0; i < 5; ++i) total += params[i].numel() * 4;
  constexpr int64_t kChunk = 1 << 16;
  ParamStats got;
  int64_t transient = 0;
  {
    Counting counting;
    (*counting).reset_peak();
    const int64_t before = (*counting).in_use();
    got = parameter_stats(params, kChunk);
    transient = (*counting).peak() - before;
  }
  // The reference: the flat fp64 copy the summary must not make.
  std::vector<at::Tensor> trained(params.begin(), params.begin() + 5);
  const at::Tensor flat = at::cat(trained).to(at::kDouble);
  const double sum = flat.sum().item<double>(), norm = flat.norm().item<double>();
  EXPECT_NEAR(got.checksum, sum, 1e-9 * std::max(1.0, std::abs(sum)));
  EXPECT_NEAR(got.norm, norm, 1e-12 * norm);
  // At most a chunk's fp64 copy (two, the sum's and the norm's, if the allocator keeps one a
  // while) and the per-chunk scalars, where the flat copy held every parameter (16 MB here).
  EXPECT_LE(transient, 2 * kChunk * 8 + (64 << 10)) << "total trained fp32 bytes " << total;
  EXPECT_LT(transient, total / 8);
}

TEST(SummaryParameterStats, MatchAFlatCopyWithoutMakingOneFp32) {
  expect_streamed_stats(at::kFloat);
}

TEST(SummaryParameterStats, MatchAFlatCopyWithoutMakingOneBf16) {
  expect_streamed_stats(at::kBFloat16);
}

// The counter sees what the old summary did: a cat of every parameter, as fp32.
TEST(SummaryParameterStats, TheCounterSeesAFlatCopy) {
  const std::vector<at::Tensor> params = model_like(at::kFloat);
  std::vector<at::Tensor> trained(params.begin(), params.begin() + 5);
  int64_t total = 0;
  for (const auto& p : trained) total += p.numel() * 4;
  Counting counting;
  (*counting).reset_peak();
  const int64_t before = (*counting).in_use();
  const double s = at::cat(trained).to(at::kFloat).sum().item<double>();
  EXPECT_TRUE(std::isfinite(s));
  EXPECT_GE((*counting).peak() - before, total);
}

// Each phase of a run gets the allocator's peak of its own window (the fake device's allocator
// counts exactly), the run's peak is the largest, and the summary puts each beside the
// planner's prediction (null where nothing was measured, as on CPU).
TEST(SummaryPhasePeaks, EachPhaseGetsItsOwnAllocatorPeak) {
  const c10::Device d = testing::fake::device(6);
  const at::Tensor held = at::empty({1000}, at::TensorOptions().device(d));  // 4000 B
  const int64_t base = testing::fake::allocated_bytes(6);
  PhasePeaks phases(d);
  ASSERT_TRUE(phases.available());
  EXPECT_GE(phases.measured(Phase::kInitialize), base);
  phases.begin();
  { const at::Tensor activations = at::empty({500}, held.options()); }  // 2000 B, freed
  phases.end(Phase::kForward);
  phases.begin();
  phases.end(Phase::kBackward);
  phases.begin();
  { const at::Tensor temporary = at::empty({100}, held.options()); }
  phases.end(Phase::kStep);
  EXPECT_EQ(phases.measured(Phase::kForward), base + 2000);
  EXPECT_EQ(phases.measured(Phase::kBackward), base);
  EXPECT_EQ(phases.measured(Phase::kStep), base + 400);
  EXPECT_EQ(phases.measured(Phase::kSave), -1);
  EXPECT_EQ(phases.overall(), std::max(base + 2000, phases.measured(Phase::kInitialize)));
  EXPECT_FALSE(PhasePeaks(c10::Device(c10::kCPU)).available());

  TrainSummary sum;
  for (int i = 0; i < kPhases; ++i) {
    sum.phase_measured[i] = phases.measured(static_cast<Phase>(i));
    sum.phase_predicted[i] = 100 + i;
  }
  const std::string j = sum.phase_json();
  EXPECT_NE(j.find("\"forward\": {\"measured\": " + std::to_string(base + 2000) +
                   ", \"predicted\": 101}"),
            std::string::npos)
      << j;
  EXPECT_NE(j.find("\"save\": {\"measured\": null, \"predicted\": 104}"), std::string::npos) << j;
}

// The pipeline's summary (pp_summary.hpp): each stage's mean times leave out the first step
// (allocations, connection set-up) unless it is the only one, and the file holds the stages.
TEST(PipelineSummary, StageMeansLeaveOutTheFirstStepAndTheFileListsTheStages) {
  PipelineSummary s;
  s.add_stage_times({{9, 9, 9, 9}, {8, 8, 8, 8}});
  EXPECT_EQ(s.mean_stage_times(), (std::vector<std::vector<double>>{{9, 9, 9, 9}, {8, 8, 8, 8}}));
  s.add_stage_times({{1, 2, 3, 4}, {2, 2, 2, 2}});
  s.add_stage_times({{3, 4, 5, 6}, {4, 4, 4, 4}});
  EXPECT_EQ(s.mean_stage_times(), (std::vector<std::vector<double>>{{2, 3, 4, 5}, {3, 3, 3, 3}}));
  s.grid = "pp 2 x dp 1 x tp 2";
  s.stages.resize(2);
  s.stages[1].first_layer = 2;
  s.stages[1].last_layer = 3;
  StepRecord r;
  r.loss = 5.5;
  s.records = {r, r};
  const std::string path =
      (std::filesystem::temp_directory_path() / "zero_pp_summary_test.json").string();
  s.write_json(path);
  std::stringstream text;
  text << std::ifstream(path).rdbuf();
  std::filesystem::remove(path);
  const std::string j = text.str();
  EXPECT_NE(j.find("\"grid\": \"pp 2 x dp 1 x tp 2\""), std::string::npos) << j;
  EXPECT_NE(j.find("\"pipeline_stages\": 2"), std::string::npos) << j;
  EXPECT_NE(j.find("{\"stage\": 1, \"layers\": [2, 3], \"forward_s_mean\": 3, "
                   "\"backward_s_mean\": 3"),
            std::string::npos)
      << j;
  EXPECT_NE(j.find("\"final_loss\": 5.5"), std::string::npos) << j;
}

}  // namespace
}  // namespace zero::examples
