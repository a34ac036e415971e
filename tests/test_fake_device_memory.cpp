// The engine's memory report against the fake accelerator's allocators, which count exactly
// (tests/support/fake_device.hpp): the device bytes initialize adds, and the page-locked host
// memory that optimizer offload's buffers hold.
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/nn/modules/linear.h>

#include <cstdio>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "device/pinned_host.hpp"
#include "support/fake_device.hpp"
#include "support/fake_training.hpp"
#include "support/thread_group.hpp"
#include "zero/auto_strategy.hpp"
#include "zero/engine.hpp"
#include "zero/memory.hpp"
#include "zero/memory_plan.hpp"

namespace zero::testing {
namespace {

// The fake allocator counts each device's bytes exactly, so what initialize leaves on the device
// must be exactly what the engine reports: the device part of its memory report, less the
// parameters it replaced. The engine's own allocator reading (zero::allocated_bytes through
// c10's DeviceAllocator interface) must see the same figure.
class FakeDeviceMemory : public ::testing::TestWithParam<std::tuple<int, bool, bool>> {};

TEST_P(FakeDeviceMemory, InitializeAllocatesExactlyTheReportedDeviceBytes) {
  const auto [stage, bf16, offload] = GetParam();
  Config cfg = training_config(stage, "AdamW", offload);
  cfg.bf16 = bf16;
  std::vector<int64_t> added(kWorld), peak_step(kWorld), after_step(kWorld), after_init(kWorld);
  std::vector<MemoryReport> reports(kWorld);
  run_ranks(
      kWorld,
      [&](std::shared_ptr<comm::Group> group) {
        const int r = group->rank();
        auto net = net_on(5, rank_device(*group));
        const int64_t before = fake::allocated_bytes(r);
        auto engine = initialize(net, cfg, group);
        after_init[r] = fake::allocated_bytes(r);
        added[r] = after_init[r] - before;
        reports[r] = engine.memory_report();
        fake::reset_peak(r);
        train_steps(engine, *net, r, 0, 3);
        peak_step[r] = fake::peak_bytes(r) - after_init[r];
        after_step[r] = fake::allocated_bytes(r) - after_init[r];
      },
      std::chrono::seconds(60), fake::device().type());
  for (int r = 0; r < kWorld; ++r) {
    const MemoryReport& rep = reports[r];
    const int64_t device_part = rep.measured.total() - rep.host_measured;
    std::printf(
        "stage %d %s%s rank %d: fake allocator +%lld B over initialize, report device part "
        "%lld B - replaced %lld B; steps: peak +%lld B, kept %+lld B\n",
        stage, bf16 ? "bf16" : "fp32", offload ? " offload" : "", r,
        static_cast<long long>(added[r]), static_cast<long long>(device_part),
        static_cast<long long>(rep.replaced_param_bytes), static_cast<long long>(peak_step[r]),
        static_cast<long long>(after_step[r]));
    // Plus one fp32 scalar the report does not count: the step count the fused AdamW kernel
    // reads from the device (optim/adamw.cpp, step_); the host optimizer under offload has none.
    const int64_t step_count = offload ? 0 : 4;
    EXPECT_EQ(added[r], device_part - rep.replaced_param_bytes + step_count) << "rank " << r;
    EXPECT_EQ(rep.allocator_delta, added[r]) << "rank " << r << ": the engine's own reading";
    // Offload's device part can be smaller than the parameters it replaced: initialize then
    // freed memory, and the report says so in units, not as a raw negative count.
    const std::string text = format_memory_report(rep);
    const std::string said = added[r] < 0 ? "initialize freed " + format_bytes(-added[r]) + " net"
                                          : "initialize added " + format_bytes(added[r]);
    EXPECT_NE(text.find(said), std::string::npos) << text;
  }
}

INSTANTIATE_TEST_SUITE_P(
    StagesDtypesOffload, FakeDeviceMemory,
    ::testing::Values(std::make_tuple(0, false, false), std::make_tuple(1, false, false),
                      std::make_tuple(2, false, false), std::make_tuple(2, true, false),
                      std::make_tuple(1, false, true), std::make_tuple(2, true, true)));

// zero_quantized_gradients' error feedback on a bf16 model: the residual of the whole gradient
// each rank keeps, as the allocator counts it (the device bytes initialize adds beyond the same
// run without feedback), as the memory report states it (MemoryReport::error_feedback, inside
// comm_buffers) and as the planner predicts it. By default it is stored in the gradients' own
// dtype: 2 bytes per element here, where it was fp32's 4 (issue 32).
TEST(FakeDeviceErrorFeedback, ResidualBytesAreCountedByTheAllocatorTheReportAndThePlanner) {
  struct Rank {
    int64_t added = 0;
    MemoryReport rep;
  };
  auto run = [](const Config& cfg) {
    std::vector<Rank> out(kWorld);
    run_ranks(
        kWorld,
        [&](std::shared_ptr<comm::Group> group) {
          const int r = group->rank();
          auto net = net_on(5, rank_device(*group));
          const int64_t before = fake::allocated_bytes(r);
          auto engine = initialize(net, cfg, group);
          out[r].added = fake::allocated_bytes(r) - before;
          out[r].rep = engine.memory_report();
          // It trains with the residual where it was allocated.
          train_steps(engine, *net, r, 0, 2);
          EXPECT_EQ(engine.memory_report().error_feedback, out[r].rep.error_feedback);
        },
        std::chrono::seconds(60), fake::device().type());
    return out;
  };
  for (int stage : {1, 2}) {
    Config cfg = training_config(stage, "AdamW");
    cfg.bf16 = true;
    auto& q = cfg.zero_optimization.quantized_gradients;
    q = {true, 8, 32, false};
    const std::vector<Rank> off = run(cfg);
    q.error_feedback = true;
    for (auto [dtype, per_element] : {std::pair{"auto", 2.0}, std::pair{"bf16", 2.0},
                                      std::pair{"fp32", 4.0}, std::pair{"int8", 1.0 + 4.0 / 32}}) {
      q.error_feedback_dtype = dtype;
      const std::vector<Rank> on = run(cfg);
      for (int r = 0; r < kWorld; ++r) {
        const MemoryReport& rep = on[r].rep;
        const int64_t ef = rep.error_feedback;
        const double per = static_cast<double>(ef) / static_cast<double>(rep.padded_params);
        const PlanInput in = plan_input_for(cfg, rep.num_params, kWorld);
        const int64_t planned = error_feedback_bytes(in, stage);
        std::printf("stage %d bf16 model, residual %s: allocator +%lld B, report %lld B "
                    "(%.3f B per padded element), planner %lld B\n",
                    stage, dtype, static_cast<long long>(on[r].added - off[r].added),
                    static_cast<long long>(ef), per, static_cast<long long>(planned));
        EXPECT_EQ(on[r].added - off[r].added, ef) << dtype << " rank " << r;
        EXPECT_EQ(rep.measured.comm_buffers - off[r].rep.measured.comm_buffers, ef) << dtype;
        EXPECT_EQ(off[r].rep.error_feedback, 0);
        // int8: each bucket's residual rounds up to whole blocks.
        EXPECT_NEAR(per, per_element, std::string(dtype) == "int8" ? 0.1 : 0.0) << dtype;
        // The planner counts Ψ (not the padded buffer) in one piece (not per bucket).
        EXPECT_NEAR(static_cast<double>(planned), static_cast<double>(ef),
                    per_element * static_cast<double>(rep.padded_params - rep.num_params) +
                        (std::string(dtype) == "int8" ? 0.1 * rep.padded_params : 0.0))
            << dtype;
        EXPECT_NE(format_memory_report(rep).find("of which error-feedback residuals"),
                  std::string::npos);
      }
    }
  }
}

// Optimizer offload's host buffers (master, moments, gradient shard, compute-dtype copy, the
// gradient ring) are long-lived and large. The page-locked memory the process holds for them
// (cached free blocks included) must be what they declare, give or take a page a buffer, not the
// caching host allocator's power-of-two blocks: on an H200, 23.15 GiB of host tensors held
// 36.4 GiB pinned. A 1000 x 1499 layer makes each shard 3 MB, which a power of two rounds to 4 MiB.
class FakeDeviceHostMemory : public ::testing::TestWithParam<bool> {};

TEST_P(FakeDeviceHostMemory, PinnedHostMemoryIsTheDeclaredOffloadBuffers) {
  const bool bf16 = GetParam();
  // One bucket for the whole model: the ring's slots are shards of the model's size too.
  Config cfg = test_config(2, 4, 1, 0, /*bucket=*/int64_t{1} << 22);
  cfg.bf16 = bf16;
  cfg.zero_optimization.offload_optimizer.enabled = true;
  cfg.zero_optimization.offload_optimizer.threads = 1;
  std::vector<MemoryReport> reports(kWorld);
  std::vector<int64_t> held(kWorld), in_use(kWorld);
  const int64_t held_before = fake::pinned_bytes();
  const int64_t in_use_before = fake::pinned_in_use_bytes();
  run_ranks(
      kWorld,
      [&](std::shared_ptr<comm::Group> group) {
        const int r = group->rank();
        const c10::Device d = rank_device(*group);
        auto gen = at::detail::createCPUGenerator(11);
        auto net = std::make_shared<torch::nn::LinearImpl>(1000, 1499);
        net->to(d, bf16 ? at::kBFloat16 : at::kFloat);
        auto engine = initialize(net, cfg, group);
        for (int s = 0; s < 2; ++s) {
          const at::Tensor x = at::randn({4, 1000}, gen).to(d, net->weight.scalar_type());
          engine.backward(net->forward(x).to(at::kFloat).pow(2).mean());
          engine.step();
        }
        engine.settled_stats();
        reports[r] = engine.memory_report();
        group->barrier("both ranks hold their buffers");
        held[r] = fake::pinned_bytes() - held_before;
        in_use[r] = fake::pinned_in_use_bytes() - in_use_before;
        group->barrier("both ranks read the allocator");
      },
      std::chrono::seconds(120), fake::device().type());
  int64_t declared = 0;
  int64_t buffers = 0;
  for (const MemoryReport& rep : reports) {
    declared += rep.host_measured;
    // Each rank's buffers, each up to a page over: master, 2 moments, gradient shard, the
    // compute-dtype copy and 3 ring slots.
    buffers += 8;
    EXPECT_LE(rep.host_pinned, rep.host_measured + 8 * device::kHostPageBytes)
        << "the memory report's pinned figure";
  }
  ASSERT_GT(declared, 2 * 5 * 3'000'000) << "the buffers are large enough to be rounded";
  const int64_t bound = declared + buffers * device::kHostPageBytes;
  std::printf("%s: declared host buffers %lld B; pinned held %lld B, in use %lld B\n",
              bf16 ? "bf16" : "fp32", static_cast<long long>(declared),
              static_cast<long long>(held[0]), static_cast<long long>(in_use[0]));
  EXPECT_LE(held[0], bound) << "pinned memory held beyond the declared host buffers";
  EXPECT_LE(in_use[0], bound);
  EXPECT_GE(in_use[0], declared) << "every declared buffer is page-locked";
}

INSTANTIATE_TEST_SUITE_P(Fp32AndBf16, FakeDeviceHostMemory, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return std::string(info.param ? "bf16" : "fp32");
                         });


// gather_memory_reports carries each rank's whole report as that rank made it (measured,
// predicted, the host figures, its allocator's reading), not the gathering rank's with only the
// measured figures replaced. Rank 1 keeps its model's original parameters alive, so its
// allocator reading over initialize differs from rank 0's.
TEST(FakeDeviceMemoryReports, GatheredReportsAreEachRanksOwn) {
  const Config cfg = training_config(2, "AdamW", /*offload=*/true);
  std::vector<MemoryReport> own(kWorld);
  std::vector<std::vector<MemoryReport>> gathered(kWorld);
  run_ranks(
      kWorld,
      [&](std::shared_ptr<comm::Group> group) {
        const int r = group->rank();
        auto net = net_on(5, rank_device(*group));
        std::vector<at::Tensor> kept;  // the storage initialize would have freed
        if (r == 1) {
          for (const auto& p : net->parameters()) kept.push_back(p.data());
        }
        auto engine = initialize(net, cfg, group);
        own[r] = engine.memory_report();
        gathered[r] = engine.gather_memory_reports();
      },
      std::chrono::seconds(60), fake::device().type());
  ASSERT_NE(own[0].allocator_delta, own[1].allocator_delta) << "the ranks' reports must differ";
  for (int viewer = 0; viewer < kWorld; ++viewer) {
    ASSERT_EQ(static_cast<int>(gathered[viewer].size()), kWorld);
    for (int r = 0; r < kWorld; ++r) {
      const MemoryReport& g = gathered[viewer][r];
      const MemoryReport& o = own[r];
      const std::string at = "rank " + std::to_string(viewer) + "'s view of rank " +
                             std::to_string(r);
      EXPECT_EQ(g.rank, r) << at;
      EXPECT_EQ(to_json(g.measured), to_json(o.measured)) << at;
      EXPECT_EQ(to_json(g.predicted), to_json(o.predicted)) << at;
      EXPECT_EQ(to_json(g.stage0), to_json(o.stage0)) << at;
      EXPECT_EQ(g.allocator_delta, o.allocator_delta) << at;
      EXPECT_EQ(g.replaced_param_bytes, o.replaced_param_bytes) << at;
      EXPECT_EQ(g.host_measured, o.host_measured) << at;
      EXPECT_EQ(g.host_predicted, o.host_predicted) << at;
      EXPECT_EQ(g.host_pinned, o.host_pinned) << at;
      EXPECT_EQ(g.error_feedback, o.error_feedback) << at;
    }
  }
}

}  // namespace
}  // namespace zero::testing
