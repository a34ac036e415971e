// Stage 3's gradient path under gradient accumulation (review 2026-12-07c L1), counted by the
// fake device's allocator (tests/support/fake_device.hpp): the two bucket buffers (and their
// 1/N shard buffers) and the gradient shard are allocated by an accumulation window's first
// reduction, kept through the window's later micro-steps and freed once, by the step, so that
// a CUDA caching allocator is asked for them once per window rather than once per micro-step
// (where the next forward's activations could split their freed blocks); between steps the
// device holds the model states only, as FSDP2 does after zero_grad(set_to_none=True).
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <vector>

#include "support/fake_device.hpp"
#include "support/stage3_net.hpp"
#include "support/thread_group.hpp"
#include "support/tiny_net.hpp"
#include "zero/engine.hpp"
#include "zero/memory.hpp"

namespace zero::testing {
namespace {

constexpr int kWorld = 4;
constexpr int kAccumulation = 4;
constexpr int kSteps = 3;
constexpr int64_t kMicro = 2;  // rows per rank and micro-step
constexpr int64_t kWidth = kStage3DeepWidth;
// Half a block's weight: each weight (a bucket of its own) is reduced in two chunks through the
// pool, every other bucket whole. A buffer is then kWorld x (kBucket / kWorld) fp32 elements
// and its shard buffer kBucket / kWorld: sizes nothing else of this model has.
constexpr int64_t kBucket = kWidth * kWidth / 2;
constexpr int64_t kInBytes = 4 * kBucket;
constexpr int64_t kOutBytes = 4 * kBucket / kWorld;

// What one micro-step (forward, backward, step) did on a rank's device.
struct Micro {
  int64_t in_allocs = 0;   // bucket buffers allocated
  int64_t out_allocs = 0;  // their shard buffers
  int64_t peak = 0;        // peak above what was held between steps
  int64_t after = 0;       // held after it, above what was held between steps
  int64_t comm = 0;        // the report's bucket buffers after it
  int64_t grads = 0;       // the report's gradient shard after it
};

TEST(FakeDeviceStage3Buckets, AllocatedOncePerAccumulationWindowAndFreedByTheStep) {
  Config cfg = test_config(3, kMicro, kAccumulation, 0.0, /*bucket=*/kBucket);
  cfg.zero_optimization.stage3.param_persistence_threshold = 0;
  cfg.zero_optimization.stage3.prefetch_bucket_size = 0;
  cfg.zero_optimization.stage3.max_reuse_distance = 0;
  const int64_t rows = kWorld * kMicro * kAccumulation;
  std::vector<std::vector<Micro>> got(kWorld);
  std::vector<int64_t> held(kWorld), states(kWorld), shard(kWorld), buffers(kWorld);
  std::vector<std::vector<int64_t>> retries(kWorld);  // stats().allocator_retries per step
  run_ranks(
      kWorld,
      [&](std::shared_ptr<comm::Group> group) {
        const int r = group->rank();
        const c10::Device d = fake::device(r);
        auto net = make_marked_deep_net(d);
        auto engine = initialize(net, cfg, group);
        states[r] = engine.memory_report().measured.total();
        shard[r] = 4 * engine.memory_report().padded_params / kWorld;
        for (int s = 0; s < kSteps; ++s) {
          const Batch global = global_batch(s, rows);
          // Between steps: what initialize left, and from the first step on the last backward's
          // 8-byte gather-order flag (test_fake_device_stage3.cpp).
          if (s == 0) held[r] = fake::allocated_bytes(r);
          fake::reset_peak(r);
          for (int m = 0; m < kAccumulation; ++m) {
            const Batch b = rank_micro_batch(global, r, kWorld, m, kAccumulation);
            // From step 1 on, the allocator says it retried r + 1 times (the fake never does;
            // a CUDA allocator near capacity would).
            if (s == 1 && m == 0) fake::add_alloc_retries(r, r + 1);
            const at::Tensor x = deep_input(b.x);
            Micro mi;
            const int64_t in0 = fake::allocations(r, kInBytes);
            const int64_t out0 = fake::allocations(r, kOutBytes);
            fake::reset_peak(r);
            engine.backward(mse(net->forward(x.to(d)), b.y.to(d)));
            engine.step();
            mi.in_allocs = fake::allocations(r, kInBytes) - in0;
            mi.out_allocs = fake::allocations(r, kOutBytes) - out0;
            mi.peak = fake::peak_bytes(r) - held[r];
            mi.after = fake::allocated_bytes(r) - held[r];
            const MemoryReport rep = engine.memory_report();
            mi.comm = rep.measured.comm_buffers;
            mi.grads = rep.measured.grads;
            got[r].push_back(mi);
          }
          retries[r].push_back(engine.stats().allocator_retries);
        }
        buffers[r] = engine.stats().bucket_buffers_in_use_peak;
      },
      std::chrono::seconds(120), fake::device().type());

  for (int r = 0; r < kWorld; ++r) {
    SCOPED_TRACE("rank " + std::to_string(r));
    // The pool's two buffers are both used (a chunked weight's two chunks are in flight at once).
    ASSERT_EQ(buffers[r], 2);
    const int64_t pool = buffers[r] * (kInBytes + kOutBytes);
    ASSERT_EQ(got[r].size(), static_cast<size_t>(kSteps * kAccumulation));
    for (int s = 0; s < kSteps; ++s) {
      int64_t in_allocs = 0, out_allocs = 0, peak = 0;
      for (int m = 0; m < kAccumulation; ++m) {
        SCOPED_TRACE("step " + std::to_string(s) + "." + std::to_string(m));
        const Micro& mi = got[r][s * kAccumulation + m];
        in_allocs += mi.in_allocs;
        out_allocs += mi.out_allocs;
        peak = std::max(peak, mi.peak);
        if (r == 0) {
          std::printf(
              "rank 0 step %d.%d: bucket buffers allocated %lld (+%lld shard buffers), peak "
              "+%lld B, held after +%lld B (report: grads %lld B, bucket buffers %lld B)\n",
              s, m, static_cast<long long>(mi.in_allocs), static_cast<long long>(mi.out_allocs),
              static_cast<long long>(mi.peak), static_cast<long long>(mi.after),
              static_cast<long long>(mi.grads), static_cast<long long>(mi.comm));
        }
        // Allocated by the window's first micro-step, kept by the others.
        EXPECT_EQ(mi.in_allocs, m == 0 ? buffers[r] : 0);
        EXPECT_EQ(mi.out_allocs, m == 0 ? buffers[r] : 0);
        const bool boundary = m + 1 == kAccumulation;
        if (boundary) {
          // Between steps the model states only (and the 8-byte gather-order flag): no
          // gradient shard, no bucket buffer, in the allocator's count and in the report.
          EXPECT_EQ(mi.after, 8);
          EXPECT_EQ(mi.grads, 0);
          EXPECT_EQ(mi.comm, 0);
        } else {
          // Inside the window: the shard and the pool, as the report declares them.
          EXPECT_EQ(mi.after, 8 + shard[r] + pool);
          EXPECT_EQ(mi.grads, shard[r]);
          EXPECT_EQ(mi.comm, pool);
        }
      }
      if (r == 0) {
        std::printf(
            "rank 0 step %d (accumulation %d): %lld bucket buffers and %lld shard buffers "
            "allocated, peak +%lld B above the model states (%lld B)\n",
            s, kAccumulation, static_cast<long long>(in_allocs), static_cast<long long>(out_allocs),
            static_cast<long long>(peak), static_cast<long long>(states[r]));
      }
      EXPECT_EQ(in_allocs, buffers[r]);
      EXPECT_EQ(out_allocs, buffers[r]);
      // The engine reports what the device's allocator counted (DeviceStats::num_alloc_retries).
      EXPECT_EQ(retries[r][s], s == 0 ? 0 : r + 1);
    }
  }
}

}  // namespace
}  // namespace zero::testing
