// zero_quantized_gradients at ZeRO stage 3 on fake accelerators (tests/support/fake_device.hpp;
// review 2026-12-07a M2): the error-feedback residuals of the whole gradient stay in page-locked
// host memory, and each reduction stages only its own slot on the device.
//  - the device allocator: what initialize adds with feedback on is what it adds with feedback
//    off (stage 2 adds the whole residual, the same figure the report states), the memory report
//    counts the residuals as host memory, and a step's device peak grows by at most a few
//    bucket-sized temporaries, not by the residual;
//  - training: the run on fake devices, with events completing late (the host's waits on the
//    downloads, before a checkpoint reads the residuals, go through them), ends where the same
//    run on the host ends (to the last bits, which stage 3 on the two takes differently), and so
//    do the residuals it saves. The fake's copies complete
//    when issued, so the stream order of upload after download is a GPU's to show;
//  - a host without room for the page-locked residuals (a fake figure through the test seam):
//    every rank's initialize throws, naming the keys, before allocating them; the int8 storage it
//    suggests fits the same host, and stage 2 (residuals on the device) is not checked.
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/serialize.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

#include "support/fake_device.hpp"
#include "support/scoped_env.hpp"
#include "support/stage3_net.hpp"
#include "support/thread_group.hpp"
#include "support/tiny_net.hpp"
#include "zero/compress/host_room.hpp"
#include "zero/engine.hpp"
#include "zero/memory.hpp"
#include "zero/memory_plan.hpp"

namespace zero::testing {
namespace {

namespace fs = std::filesystem;

constexpr int kWorld = 2;
constexpr int64_t kRows = 48;
constexpr int kSteps = 4;

struct EventDelay {
  explicit EventDelay(std::chrono::microseconds d) { fake::set_event_delay(d); }
  ~EventDelay() { fake::set_event_delay(std::chrono::microseconds(0)); }
};

Config quantized_config(int stage, bool feedback, const std::string& dtype = "auto") {
  // Buckets of 200 elements: the blocks' parameters are reduced in several chunks, each its own
  // residual slot.
  Config cfg = test_config(stage, kRows / kWorld, 1, 0.0, /*bucket=*/200);
  cfg.optimizer.type = "SGD";
  cfg.optimizer.lr = 0.05;
  cfg.optimizer.momentum = 0.9;
  cfg.zero_optimization.stage3.param_persistence_threshold = 0;
  auto& q = cfg.zero_optimization.quantized_gradients;
  q.enabled = true;
  q.bits = 4;  // a large residual: one lost or stale shows in the parameters
  q.block = 32;
  q.error_feedback = feedback;
  q.error_feedback_dtype = dtype;
  return cfg;
}

struct Rank {
  int64_t added = 0;      // device bytes initialize added
  int64_t step_peak = 0;  // device peak of the steps above what initialize left
  MemoryReport report;
  at::Tensor params;
};

// Trains kSteps on the fake devices (device = true) or on the host; saves a checkpoint under
// `save` when set.
std::vector<Rank> train(const Config& cfg, bool device, const std::string& save = "") {
  std::vector<Rank> out(kWorld);
  std::mutex mu;
  run_ranks(
      kWorld,
      [&](std::shared_ptr<comm::Group> group) {
        const int r = group->rank();
        const c10::Device d = device ? fake::device(r) : c10::Device(c10::kCPU);
        auto net = make_stage3_net(3, /*mark=*/true);
        net->to(d);
        const int64_t before = device ? fake::allocated_bytes(r) : 0;
        auto engine = initialize(net, cfg, group);
        Rank mine;
        if (device) {
          mine.added = fake::allocated_bytes(r) - before;
          fake::reset_peak(r);
        }
        const int64_t held = device ? fake::allocated_bytes(r) : 0;
        for (int s = 0; s < kSteps; ++s) {
          const Batch b = rank_micro_batch(global_batch(s, kRows), r, kWorld, 0, 1);
          engine.backward(mse(net->forward(b.x.to(d)), b.y.to(d)));
          engine.step();
        }
        if (device) mine.step_peak = fake::peak_bytes(r) - held;
        mine.report = engine.memory_report();
        if (!save.empty()) engine.save_checkpoint(save, "t");
        mine.params = engine.flat_parameters().cpu();
        std::lock_guard<std::mutex> lock(mu);
        out[r] = mine;
      },
      std::chrono::seconds(60), device ? fake::device().type() : c10::kCPU);
  return out;
}

TEST(FakeDeviceStage3Quantized, ResidualsStayOffTheDevice) {
  for (const std::string dtype : {"fp32", "int8"}) {
    const std::vector<Rank> off2 = train(quantized_config(2, false, dtype), true);
    const std::vector<Rank> on2 = train(quantized_config(2, true, dtype), true);
    const std::vector<Rank> off3 = train(quantized_config(3, false, dtype), true);
    const std::vector<Rank> on3 = train(quantized_config(3, true, dtype), true);
    for (int r = 0; r < kWorld; ++r) {
      const int64_t ef2 = on2[r].report.error_feedback, ef3 = on3[r].report.error_feedback;
      const int64_t dev2 = on2[r].added - off2[r].added, dev3 = on3[r].added - off3[r].added;
      const int64_t peak3 = on3[r].step_peak - off3[r].step_peak;
      const int64_t host3 = on3[r].report.host_measured - off3[r].report.host_measured;
      std::printf(
          "residual %s rank %d: stage 2 device +%lld B (report %lld B); stage 3 device +%lld B, "
          "host +%lld B (report %lld B), step peak %+lld B\n",
          dtype.c_str(), r, static_cast<long long>(dev2), static_cast<long long>(ef2),
          static_cast<long long>(dev3), static_cast<long long>(host3), static_cast<long long>(ef3),
          static_cast<long long>(peak3));
      // Stage 2 keeps it on the device, exactly as reported (test_fake_device_memory.cpp).
      EXPECT_EQ(dev2, ef2) << dtype;
      // Stage 3: the same whole-gradient residual (the layouts pad alike to within the
      // units' padding), none of it on the device: there only the two staging buffers of the
      // largest slot, as reported, and the host's part as predicted from the sizes.
      const int64_t staging = on3[r].report.error_feedback_staging;
      EXPECT_GT(ef3, 0) << dtype;
      EXPECT_GT(staging, 0) << dtype;
      EXPECT_LT(staging, ef3) << dtype;
      EXPECT_EQ(dev3, staging) << dtype;
      EXPECT_EQ(host3, ef3) << dtype;
      EXPECT_EQ(on3[r].report.host_predicted - off3[r].report.host_predicted, ef3) << dtype;
      EXPECT_EQ(on2[r].report.error_feedback_staging, 0) << dtype;
      EXPECT_NE(format_memory_report(on3[r].report).find("in host memory"), std::string::npos);
      // While a reduction runs: a few bucket-sized temporaries (the corrected gradient, what
      // was sent), not the residual.
      const int64_t bucket_fp32 = 4 * 200 + 4 * kWorld;
      EXPECT_LT(peak3, 8 * bucket_fp32) << dtype;
      if (dtype == "fp32") EXPECT_LT(peak3, ef3) << dtype;
    }
  }
  // The planner counts stage 3's residuals as host memory, stage 2's on the device.
  PlanInput in;
  in.num_params = 1'000'000;
  in.world_size = 8;
  in.quantized_bits = 8;
  in.error_feedback_store_bytes = 4;
  EXPECT_EQ(plan_host_states(in, 3), error_feedback_bytes(in, 3));
  EXPECT_EQ(plan_host_states(in, 2), 0);
  EXPECT_GT(error_feedback_bytes(in, 3), 0);
}

// Each rank's error from initialize on fake devices whose host offers `room` bytes ("" when
// it succeeded).
std::vector<std::string> initialize_errors(const Config& cfg, int64_t room) {
  std::vector<std::string> errors(kWorld);
  std::mutex mu;
  run_ranks(
      kWorld,
      [&](std::shared_ptr<comm::Group> group) {
        const int r = group->rank();
        auto net = make_stage3_net(3, /*mark=*/true);
        net->to(fake::device(r));
        compress::set_host_available_for_testing(room);
        std::string error;
        try {
          auto engine = initialize(net, cfg, group);
        } catch (const std::runtime_error& e) {
          error = e.what();
        }
        compress::set_host_available_for_testing(0);
        const std::lock_guard<std::mutex> lock(mu);
        errors[r] = error;
      },
      std::chrono::seconds(60), fake::device().type());
  return errors;
}

TEST(FakeDeviceStage3Quantized, EveryRankRefusesWhenTheHostCannotHoldTheResiduals) {
  // What the residuals take per rank, as the memory report states it.
  const int64_t fp32 = train(quantized_config(3, true, "fp32"), true)[0].report.error_feedback;
  const int64_t int8 = train(quantized_config(3, true, "int8"), true)[0].report.error_feedback;
  ASSERT_LT(int8, fp32);
  const int64_t room = (fp32 + int8) / 2;  // int8 residuals fit, fp32 ones do not
  const std::vector<std::string> refused =
      initialize_errors(quantized_config(3, true, "fp32"), room);
  for (int r = 0; r < kWorld; ++r) {
    std::printf("rank %d (fp32 residuals of %lld B, room %lld B): %s\n", r,
                static_cast<long long>(fp32), static_cast<long long>(room), refused[r].c_str());
    for (const char* key : {"zero_quantized_gradients_error_feedback_dtype: int8",
                            "zero_quantized_gradients_error_feedback: false", "stage: 2",
                            "page-locked host memory"}) {
      EXPECT_NE(refused[r].find(key), std::string::npos) << key << " in: " << refused[r];
    }
  }
  for (const std::string& e : initialize_errors(quantized_config(3, true, "int8"), room)) {
    EXPECT_EQ(e, "") << "the suggested storage fits";
  }
  for (const std::string& e : initialize_errors(quantized_config(2, true, "fp32"), room)) {
    EXPECT_EQ(e, "") << "stage 2 keeps its residuals on the device";
  }
}

// Under optimizer offload the check counts what offload allocates after the residuals (review
// 2026-12-07c L3): the host's room holds both ranks' residuals and optimizer states but not their
// host gradient shards too, so initialize refuses, stating the states' bytes as the memory report
// measures them; without offload the same room is enough.
TEST(FakeDeviceStage3Quantized, RoomCountsTheOffloadedOptimizerAllocatedAfterTheResiduals) {
  const ScopedEnv two("LOCAL_WORLD_SIZE", "2");
  Config cfg = quantized_config(3, true, "fp32");
  cfg.zero_optimization.offload_optimizer.enabled = true;
  cfg.zero_optimization.offload_optimizer.threads = 1;
  const MemoryReport r = train(cfg, true)[0].report;
  const int64_t ef = r.error_feedback, states = r.measured.optimizer;
  ASSERT_GT(states, 0) << "SGD with momentum keeps one state";
  const int64_t room = 2 * (ef + states);
  const std::vector<std::string> refused = initialize_errors(cfg, room);
  for (int rank = 0; rank < kWorld; ++rank) {
    std::printf("rank %d (room %lld B): %s\n", rank, static_cast<long long>(room),
                refused[rank].c_str());
    EXPECT_NE(
        refused[rank].find("offload_optimizer: " + format_bytes(states) + " of optimizer states"),
        std::string::npos)
        << refused[rank];
    EXPECT_NE(refused[rank].find("x 2 ranks on this node (LOCAL_WORLD_SIZE)"), std::string::npos);
  }
  cfg.zero_optimization.offload_optimizer.enabled = false;
  for (const std::string& e : initialize_errors(cfg, room)) EXPECT_EQ(e, "");
}

TEST(FakeDeviceStage3Quantized, TrainsAndSavesAsOnTheHost) {
  const fs::path dir = fs::temp_directory_path() / "zero_test_fake_stage3_quantized";
  for (const std::string dtype : {"fp32", "int8"}) {
    fs::remove_all(dir);
    const Config cfg = quantized_config(3, true, dtype);
    const std::vector<Rank> host = train(cfg, false, (dir / "host").string());
    std::vector<Rank> dev;
    {
      const EventDelay delay(std::chrono::microseconds(300));
      dev = train(cfg, true, (dir / "device").string());
    }
    EXPECT_TRUE(dev[0].report.error_feedback > 0 && host[0].report.error_feedback > 0);
    // Without feedback the run ends elsewhere: how far the residuals move the parameters.
    const std::vector<Rank> plain = train(quantized_config(3, false, dtype), false);
    for (int r = 0; r < kWorld; ++r) {
      // Stage 3 on the fake device and on the host differ in the last bits (their gathers and
      // reductions take other paths), so the device run is held to the host run well inside
      // what feedback itself changes.
      const double d_dev = (host[r].params - dev[r].params).abs().max().item<double>();
      const double d_plain = (host[r].params - plain[r].params).abs().max().item<double>();
      const std::string file = "error_feedback.rank" + std::to_string(r) + "_of_2.pt";
      std::vector<at::Tensor> a, b;
      torch::load(a, (dir / "host" / "t" / file).string());
      torch::load(b, (dir / "device" / "t" / file).string());
      ASSERT_EQ(a.size(), b.size());
      ASSERT_GT(a.size(), 2u);
      double na = 0, nb = 0, nd = 0;
      for (size_t i = 1; i < a.size(); ++i) {
        na += a[i].to(at::kDouble).pow(2).sum().item<double>();
        nb += b[i].to(at::kDouble).pow(2).sum().item<double>();
        nd += (a[i].to(at::kDouble) - b[i].to(at::kDouble)).pow(2).sum().item<double>();
      }
      std::printf(
          "%s rank %d: max |params device - host| %.3g (without feedback %.3g); saved residuals "
          "|host| %.4g |device| %.4g |difference| %.3g\n",
          dtype.c_str(), r, d_dev, d_plain, std::sqrt(na), std::sqrt(nb), std::sqrt(nd));
      EXPECT_LT(d_dev, 1e-5) << dtype << " rank " << r;
      EXPECT_LT(100 * d_dev, d_plain) << dtype << " rank " << r;
      EXPECT_GT(na, 0) << "the residuals carried something";
      // The saved residuals are the device run's, not zeros or stale ones.
      EXPECT_LT(std::sqrt(nd), 0.1 * std::sqrt(na)) << dtype << " rank " << r;
    }
  }
  fs::remove_all(dir);
}

}  // namespace
}  // namespace zero::testing
