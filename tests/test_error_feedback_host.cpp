// Error-feedback residuals kept in page-locked host memory (ZeRO stage 3 on an accelerator,
// compress/error_feedback.hpp; review 2026-12-07b M1 and L3), on the fake accelerator
// (tests/support/fake_device.hpp), whose copy stream and events run the GPU path's logic:
//  - staged through two device buffers, with each upload queued ahead on a copy stream, the
//    reductions send the same codes and keep the same residuals, bit for bit, as residuals kept
//    on the device (the reference): over steps in a fixed order, a changed order, a slot run
//    twice, a reset and a load, with events completing late, and with no host read of the
//    device during a reduction (the downloads are queued copies);
//  - the staging buffers are what the allocator counts and staging_bytes predicts, and a
//    reduction's transient peak is no more than the device path's (no fp32 copy of the slot);
//  - a node without room for its ranks' residuals: every rank refuses before allocating
//    anything, with the same text naming the keys and the fix, also where only one rank lacks
//    room (no rank waits for another), and LOCAL_WORLD_SIZE ranks (or, unset, the group's ranks
//    on the host) share a node's room;
//  - an allocation after the agreed check that fails on one rank (page-locking, or a device
//    staging buffer) fails every rank at once with the same error;
//  - the planner counts the residual (host) and the staging buffers (device) from the config.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

#include "comm/group.hpp"
#include "support/fake_device.hpp"
#include "support/scoped_env.hpp"
#include "support/thread_group.hpp"
#include "zero/compress/error_feedback.hpp"
#include "zero/compress/host_room.hpp"
#include "zero/compress/quantized_reduce.hpp"
#include "zero/memory.hpp"
#include "zero/memory_plan.hpp"

namespace zero::compress {
namespace {

namespace fake = testing::fake;

struct EventDelay {
  explicit EventDelay(std::chrono::microseconds d) { fake::set_event_delay(d); }
  ~EventDelay() { fake::set_event_delay(std::chrono::microseconds(0)); }
};

at::Tensor randn(int64_t n, uint64_t seed) {
  at::Generator gen = at::detail::createCPUGenerator(seed);
  return at::randn({n}, gen);
}

const std::vector<int64_t> kNumels{4000, 37, 2048};
constexpr int64_t kBlock = 64;

// Slot 0 and 2 go through compress_rows (the reduce-scatter's layout), slot 1 through compress.
Quantized run(ErrorFeedback& ef, size_t i, const at::Tensor& g) {
  if (i == 1) return ef.compress(i, g);
  return ef.compress_rows(i, g, i == 0 ? 2 : 4);
}

TEST(ErrorFeedbackHost, SendsAndKeepsWhatDeviceResidualsDo) {
  const c10::Device dev = fake::device(0);
  const at::TensorOptions opts = at::TensorOptions().device(dev);
  const EventDelay delay(std::chrono::microseconds(200));
  // The order the reductions run in, step by step: settled, then another order (the slot queued
  // ahead is not the one that comes), a slot run twice in a row, and settled again.
  const std::vector<std::vector<size_t>> steps{{0, 1, 2},    {0, 1, 2}, {0, 1, 2}, {2, 0, 1},
                                               {1, 1, 0, 2}, {0, 1, 2}, {0, 1, 2}};
  for (at::ScalarType store : {at::kFloat, at::kBFloat16, at::kHalf, at::kChar}) {
    ErrorFeedback host(kNumels, 4, kBlock, opts, store, Residence::kHost);
    ErrorFeedback ref(kNumels, 4, kBlock, opts, store, Residence::kDevice);
    ASSERT_TRUE(host.on_host());
    ASSERT_FALSE(ref.on_host());
    ErrorFeedback other(kNumels, 4, kBlock, at::TensorOptions(), store);
    for (size_t i = 0; i < kNumels.size(); ++i) run(other, i, randn(kNumels[i], 900 + i));
    uint64_t seed = 0;
    int compared = 0;
    int64_t host_reads = 0, downloads = 0;
    for (size_t s = 0; s < steps.size(); ++s) {
      if (s == 4) {
        host.reset();
        ref.reset();
      }
      if (s == 5) {
        host.load_state(other.state());
        ref.load_state(other.state());
      }
      for (size_t i : steps[s]) {
        // fp32 and bf16 gradients: both ways of upcasting the residual into the sum.
        at::Tensor g = randn(kNumels[i], ++seed).to(dev);
        if (seed % 2 == 0) g = g.to(at::kBFloat16);
        const int64_t reads = fake::host_reads(0), queued = fake::async_host_copies(0);
        const Quantized a = run(host, i, g);
        host_reads += fake::host_reads(0) - reads;
        downloads += fake::async_host_copies(0) - queued;
        const Quantized b = run(ref, i, g);
        ASSERT_TRUE(at::equal(a.codes.cpu(), b.codes.cpu()))
            << c10::toString(store) << " step " << s << " slot " << i;
        ASSERT_TRUE(at::equal(a.scales.cpu(), b.scales.cpu()))
            << c10::toString(store) << " step " << s << " slot " << i;
        ++compared;
      }
    }
    for (size_t i = 0; i < kNumels.size(); ++i) {
      const at::Tensor r = host.residual(i);
      EXPECT_TRUE(r.device().is_cpu()) << "kept in host memory";
      EXPECT_TRUE(at::equal(r, ref.residual(i).cpu())) << c10::toString(store) << " slot " << i;
      EXPECT_GT(r.abs().max().item<float>(), 0.0f);
    }
    EXPECT_EQ(compared, 22);
    // The host never waited for the device during a reduction: the downloads were queued.
    EXPECT_EQ(host_reads, 0) << c10::toString(store);
    EXPECT_GE(downloads, compared) << c10::toString(store);
  }
}

TEST(ErrorFeedbackHost, StagingIsWhatTheAllocatorCountsAndNoFp32CopyOfTheSlot) {
  const c10::Device dev = fake::device(0);
  const at::TensorOptions opts = at::TensorOptions().device(dev);
  const int64_t n = kNumels[0];
  for (at::ScalarType store : {at::kFloat, at::kBFloat16, at::kChar}) {
    const at::Tensor g = randn(n, 7).to(dev);
    int64_t held = 0, host_peak = 0, device_peak = 0;
    {
      const int64_t before = fake::allocated_bytes(0);
      ErrorFeedback ef(kNumels, 8, kBlock, opts, store, Residence::kHost);
      held = fake::allocated_bytes(0) - before;
      EXPECT_EQ(held, ef.device_bytes()) << c10::toString(store);
      EXPECT_EQ(held, staging_bytes(kNumels, store, kBlock)) << c10::toString(store);
      EXPECT_EQ(held, 2 * residual_bytes(n, store, kBlock)) << "two of the largest slot";
      EXPECT_EQ(ef.bytes(), ef.planned_bytes());
      EXPECT_EQ(ef.planned_device_bytes(), held);
      ef.compress_rows(0, g, 2);  // the first upload, not queued ahead
      fake::reset_peak(0);
      const int64_t at_rest = fake::allocated_bytes(0);
      ef.compress_rows(0, g, 2);
      host_peak = fake::peak_bytes(0) - at_rest;
      EXPECT_EQ(fake::allocated_bytes(0), at_rest) << "no temporary outlives the reduction";
    }
    {
      ErrorFeedback ef(kNumels, 8, kBlock, opts, store, Residence::kDevice);
      ef.compress_rows(0, g, 2);
      fake::reset_peak(0);
      const int64_t at_rest = fake::allocated_bytes(0);
      ef.compress_rows(0, g, 2);
      device_peak = fake::peak_bytes(0) - at_rest;
    }
    std::printf(
        "residual as %s: staging %lld B on the device; a reduction's transient peak %lld B "
        "staged from the host, %lld B with the residual on the device\n",
        c10::toString(store), static_cast<long long>(held), static_cast<long long>(host_peak),
        static_cast<long long>(device_peak));
    // The staged residual is upcast inside the corrected gradient's sum: the transients are
    // those of residuals on the device, which hold no copy of the slot either (fp32), or
    // fewer (bf16: the device path's fp32 copy of the residual, 4 bytes per element). int8
    // codes are dequantized into an fp32 temporary on both paths, but the staged path lets go
    // of the corrected gradient before it quantizes the new residual.
    if (store == at::kFloat) {
      EXPECT_EQ(host_peak, device_peak);
    } else if (store == at::kBFloat16) {
      EXPECT_EQ(host_peak + 4 * n, device_peak);
    } else {
      EXPECT_LT(host_peak, device_peak) << c10::toString(store);
    }
  }
}

struct Outcome {
  std::string error;
  int64_t device_added = 0;
  double seconds = 0;
};

// What a rank is given to build with: its host's room, and where its allocations fail (0: never).
struct Rank {
  int64_t available = 0;
  int64_t device_fails_from = 0;  // fake::fail_allocations_from on its device
  int64_t pinned_fails_from = 0;  // fake::fail_pinned_from on its thread
  int64_t device_fails_after = -1;  // fake::fail_allocations_after on its device
};

// Builds the compressed reduction with host-resident residuals on `group` as world rank `r`
// (its fake device) with that rank's room and failures; returns what it saw.
Outcome build_rank(comm::Group& group, int r, const Rank& rank, const Settings& s) {
  set_host_available_for_testing(rank.available);
  Outcome o;
  const int64_t before = fake::allocated_bytes(r);
  const auto t0 = std::chrono::steady_clock::now();
  try {
    fake::fail_allocations_from(r, rank.device_fails_from);
    fake::fail_pinned_from(rank.pinned_fails_from);
    fake::fail_allocations_after(r, rank.device_fails_after);
    const int64_t n = group.size();
    QuantizedReduceScatter q(group, s, {n * 1000, n * 500}, fake::device(r));
    o.device_added = fake::allocated_bytes(r) - before;
  } catch (const std::runtime_error& e) {
    o.error = e.what();
    o.device_added = fake::allocated_bytes(r) - before;
  }
  o.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  fake::fail_allocations_from(r, 0);
  fake::fail_pinned_from(0);
  fake::fail_allocations_after(r, -1);
  set_host_available_for_testing(0);
  return o;
}

Settings host_settings(at::ScalarType store) {
  Settings s;
  s.enabled = true;
  s.block = kBlock;
  s.feedback_store = store;
  s.feedback_residence = Residence::kHost;
  return s;
}

// Every rank of one group builds; what each rank saw. The group's comm timeout is 60 s: a rank
// left waiting for a peer would take that.
std::vector<Outcome> build(const std::vector<Rank>& ranks, at::ScalarType store) {
  const int world = static_cast<int>(ranks.size());
  std::vector<Outcome> out(world);
  std::mutex mu;
  testing::run_ranks(
      world,
      [&](std::shared_ptr<comm::Group> group) {
        const int r = group->rank();
        const Outcome o = build_rank(*group, r, ranks[r], host_settings(store));
        const std::lock_guard<std::mutex> lock(mu);
        out[r] = o;
      },
      std::chrono::seconds(60), fake::device().type());
  return out;
}

std::vector<Outcome> build(const std::vector<int64_t>& available, at::ScalarType store) {
  std::vector<Rank> ranks;
  for (int64_t a : available) ranks.push_back({a});
  return build(ranks, store);
}

void expect_names_the_fix(const std::string& e) {
  for (const char* key : {"zero_quantized_gradients_error_feedback_dtype: int8",
                          "zero_quantized_gradients_error_feedback: false"}) {
    EXPECT_NE(e.find(key), std::string::npos) << "missing '" << key << "' in: " << e;
  }
}

// Every rank threw the same error, naming rank 1 only, well inside the comm timeout, and holds
// nothing on its device afterwards.
void expect_every_rank_fails_alike_naming_rank_1(const std::vector<Outcome>& o) {
  for (size_t r = 0; r < o.size(); ++r) {
    SCOPED_TRACE("rank " + std::to_string(r));
    std::printf("rank %zu failed after %.3f s: %s\n", r, o[r].seconds, o[r].error.c_str());
    EXPECT_EQ(o[r].error, o[0].error);
    EXPECT_NE(o[r].error.find("rank 1: "), std::string::npos) << o[r].error;
    EXPECT_EQ(o[r].error.find("rank 0: "), std::string::npos) << o[r].error;
    EXPECT_LT(o[r].seconds, 10.0) << "not the 60 s comm timeout";
    EXPECT_EQ(o[r].device_added, 0) << "nothing left on the device";
    expect_names_the_fix(o[r].error);
  }
}

TEST(ErrorFeedbackHost, EveryRankRefusesWhenANodeCannotHoldTheResiduals) {
  constexpr int kWorld = 2;
  // Per rank: residuals of 2 x 1500 elements, fp32.
  const int64_t need = kWorld * 1500 * 4;
  const int64_t pinned = fake::pinned_allocations();
  // One rank per node, as the launcher says: the figures per rank are the node's.
  const testing::ScopedEnv one("LOCAL_WORLD_SIZE", "1");
  {
    const std::vector<Outcome> o = build({need - 1, need - 1}, at::kFloat);
    for (int r = 0; r < kWorld; ++r) {
      std::printf("rank %d: %s\n", r, o[r].error.c_str());
      expect_names_the_fix(o[r].error);
      EXPECT_EQ(o[r].error, o[0].error) << "the same text on every rank";
      EXPECT_NE(o[r].error.find("stage: 2"), std::string::npos) << o[r].error;
      EXPECT_NE(o[r].error.find("rank 0: "), std::string::npos) << o[r].error;
      EXPECT_NE(o[r].error.find("fp32"), std::string::npos) << o[r].error;
      EXPECT_NE(
          o[r].error.find(format_bytes(need) + " per rank (" + std::to_string(need) + " bytes)"),
          std::string::npos)
          << o[r].error;
      EXPECT_EQ(o[r].device_added, 0) << "refused before allocating";
    }
  }
  EXPECT_EQ(fake::pinned_allocations(), pinned) << "nothing page-locked on the way";
  {
    // Only rank 1's node is short: rank 0 could allocate, but must not go on without it.
    expect_every_rank_fails_alike_naming_rank_1(build({need, need - 1}, at::kFloat));
  }
  {
    // The fix it names: int8 residuals (1 + 4/64 bytes per element) fit where fp32 did not.
    const std::vector<Outcome> o = build({need - 1, need - 1}, at::kChar);
    for (int r = 0; r < kWorld; ++r) {
      EXPECT_EQ(o[r].error, "");
      EXPECT_EQ(o[r].device_added, staging_bytes({kWorld * 1000, kWorld * 500}, at::kChar, kBlock));
    }
  }
  {
    // Room for one rank's, not for two: the ranks of a node share its room.
    const std::vector<Outcome> alone = build({need, need}, at::kFloat);
    EXPECT_EQ(alone[0].error, "");
    EXPECT_EQ(alone[0].device_added, 2 * kWorld * 1000 * 4) << "the two staging buffers";
    {
      const testing::ScopedEnv two("LOCAL_WORLD_SIZE", "2");
      const std::vector<Outcome> shared = build({need, need}, at::kFloat);
      EXPECT_NE(shared[0].error.find("x 2 ranks on this node (LOCAL_WORLD_SIZE)"),
                std::string::npos)
          << shared[0].error;
      expect_names_the_fix(shared[1].error);
    }
    // No launcher variable: not a silent 1, but this group's ranks on this host (both threads).
    const testing::ScopedEnv unset("LOCAL_WORLD_SIZE", nullptr);
    const testing::ScopedEnv no_ompi("OMPI_COMM_WORLD_LOCAL_SIZE", nullptr);
    const testing::ScopedEnv no_slurm("SLURM_NTASKS_PER_NODE", nullptr);
    const testing::ScopedEnv no_node("SLURM_NODEID", nullptr);
    const std::vector<Outcome> guessed = build({need, need}, at::kFloat);
    EXPECT_NE(guessed[0].error.find("x 2 ranks on this node (ranks of "), std::string::npos)
        << guessed[0].error;
    EXPECT_NE(guessed[0].error.find("other groups here are not counted"), std::string::npos);
  }
}

// The allocation after the agreed check fails on one rank alone (review 2026-12-07c L2): its
// page-locked residuals (the host's page cache grew, a pinning limit), or a device staging
// buffer (its allocator's cache). Every rank throws the same error naming that rank, the bytes
// and the keys, within seconds, and gives back what it had allocated.
TEST(ErrorFeedbackHost, AllocationFailingOnOneRankFailsOnEveryRankAtOnce) {
  constexpr int kWorld = 2;
  const testing::ScopedEnv one("LOCAL_WORLD_SIZE", "1");
  const int64_t room = int64_t{1} << 30;
  const int64_t residual = kWorld * 1000 * 4, staging = 2 * residual;
  const int64_t pinned = fake::pinned_in_use_bytes();
  {
    // Page-locking the first residual (2000 elements, fp32) fails on rank 1.
    const std::vector<Outcome> o = build({{room}, {room, 0, residual}}, at::kFloat);
    expect_every_rank_fails_alike_naming_rank_1(o);
    EXPECT_NE(o[0].error.find("cannot page-lock"), std::string::npos) << o[0].error;
    EXPECT_NE(
        o[0].error.find("allocating " + format_bytes(kWorld * 1500 * 4) +
                        " of page-locked host memory and " + format_bytes(staging) + " on fake:1"),
        std::string::npos)
        << o[0].error;
  }
  EXPECT_EQ(fake::pinned_in_use_bytes(), pinned) << "every rank let go of its residuals";
  {
    // A staging buffer (2000 fp32 elements) does not fit rank 1's device.
    const std::vector<Outcome> o = build({{room}, {room, residual, 0}}, at::kFloat);
    expect_every_rank_fails_alike_naming_rank_1(o);
    EXPECT_NE(o[0].error.find("out of memory"), std::string::npos) << o[0].error;
    EXPECT_NE(o[0].error.find("reduce_bucket_size"), std::string::npos) << o[0].error;
  }
  EXPECT_EQ(fake::pinned_in_use_bytes(), pinned);
}

// Review 2026-12-07d L1: rank 1's device is full right after the agreement took its buffers
// (3: this rank's length, every rank's, the text chunk), so any device allocation between the
// agreement and its first errors() throws there alone. The host-room check allocated its host-id
// gather on the device: rank 1 left make_feedback and rank 0 waited in that gather for the 60 s
// comm timeout. Now the ids go through the agreement's buffers, rank 1's device fails in the
// allocation the ranks agree on, and both ranks throw the same text within seconds.
TEST(ErrorFeedbackHost, DeviceFullAfterTheAgreementFailsEveryRankAtOnce) {
  const testing::ScopedEnv one("LOCAL_WORLD_SIZE", "1");
  const int64_t room = int64_t{1} << 30;
  Rank full{room};
  full.device_fails_after = 3;
  const std::vector<Outcome> o = build({{room}, full}, at::kFloat);
  expect_every_rank_fails_alike_naming_rank_1(o);
  EXPECT_NE(o[0].error.find("could not be allocated on every rank"), std::string::npos)
      << o[0].error;
  EXPECT_NE(o[0].error.find("out of memory"), std::string::npos) << o[0].error;
}

// Review 2026-12-07d M1: a tp2 x dp2 mesh in Megatron's order (tp groups {0, 1} and {2, 3}, dp
// groups {0, 2} and {1, 3}). World rank 1 alone refuses or fails; its dp group agrees, and the
// verdict is passed over tp (Settings::agree_also, as the engine passes Groups::norm), so the
// other dp group's ranks throw the same text too instead of going on to wait for their peers.
std::vector<Outcome> build_mesh(const std::vector<Rank>& ranks) {
  constexpr int kWorld = 4;
  std::vector<Outcome> out(kWorld);
  std::mutex mu;
  testing::run_ranks(
      kWorld,
      [&](std::shared_ptr<comm::Group> world) {
        const int r = world->rank();
        auto tp = world->split(r / 2, r % 2, "tp");
        auto dp = world->split(r % 2, r / 2, "dp");
        Settings s = host_settings(at::kFloat);
        s.agree_also = {tp};
        const Outcome o = build_rank(*dp, r, ranks[r], s);
        const std::lock_guard<std::mutex> lock(mu);
        out[r] = o;
      },
      std::chrono::seconds(60), fake::device().type());
  return out;
}

TEST(ErrorFeedbackHost, ARefusalOrFailureInOneDataParallelGroupFailsTheWholeMesh) {
  const testing::ScopedEnv one("LOCAL_WORLD_SIZE", "1");
  const int64_t room = int64_t{1} << 30, need = 2 * 1500 * 4, staging = 2 * 1000 * 4;
  const auto expect_mesh_fails_alike = [](const std::vector<Outcome>& o, const char* cause) {
    for (size_t r = 0; r < o.size(); ++r) {
      SCOPED_TRACE("world rank " + std::to_string(r));
      std::printf("rank %zu failed after %.3f s: %s\n", r, o[r].seconds, o[r].error.c_str());
      EXPECT_EQ(o[r].error, o[0].error) << "the same text on every rank of the mesh";
      EXPECT_NE(o[r].error.find(cause), std::string::npos) << o[r].error;
      EXPECT_NE(o[r].error.find("by rank of tp"), std::string::npos) << o[r].error;
      EXPECT_LT(o[r].seconds, 10.0) << "not the 60 s comm timeout";
      EXPECT_EQ(o[r].device_added, 0) << "nothing left on the device";
      expect_names_the_fix(o[r].error);
    }
  };
  // World rank 1's node is short of host memory: refused before any rank allocates.
  expect_mesh_fails_alike(build_mesh({{room}, {need - 1}, {room}, {room}}),
                          "do not fit in the page-locked host memory");
  // World rank 1's staging buffer does not fit its device.
  expect_mesh_fails_alike(build_mesh({{room}, {room, staging}, {room}, {room}}), "out of memory");
  // Nothing fails: every rank goes on (the relay adds no verdict of its own).
  for (const Outcome& o : build_mesh({{room}, {room}, {room}, {room}})) {
    EXPECT_EQ(o.error, "");
    EXPECT_EQ(o.device_added, 2 * staging) << "the two staging buffers";
  }
}

TEST(ErrorFeedbackHost, PlannerCountsResidualOnTheHostAndStagingOnTheDevice) {
  PlanInput in;
  in.num_params = 1'000'000;
  in.world_size = 8;
  in.quantized_bits = 8;
  in.bucket_elements = 200'000;
  for (int store : {4, 2, 1}) {
    in.error_feedback_store_bytes = store;
    const int64_t bucket = bucket_buffer_elements(in, 3);
    const auto bytes = [&](int64_t n) {
      return store == 1
                 ? (n + in.quantized_block - 1) / in.quantized_block * (in.quantized_block + 4)
                 : store * n;
    };
    EXPECT_EQ(error_feedback_bytes(in, 3), bytes(in.num_params)) << store;
    EXPECT_EQ(error_feedback_staging_bytes(in, 3), 2 * bytes(bucket)) << store;
    EXPECT_EQ(error_feedback_staging_bytes(in, 2), 0) << "stage 2 keeps it on the device";
    // Stage 3: the residual in host memory, the staging on the device.
    PlanInput off = in;
    off.error_feedback = false;
    const MemoryBreakdown on3 = plan_model_states(in, 3), off3 = plan_model_states(off, 3);
    EXPECT_EQ(on3.comm_buffers - off3.comm_buffers, bytes(in.num_params) + 2 * bytes(bucket));
    EXPECT_EQ(plan_host_states(in, 3) - plan_host_states(off, 3), bytes(in.num_params));
    EXPECT_EQ(on3.total() - plan_host_states(in, 3) - (off3.total() - plan_host_states(off, 3)),
              2 * bytes(bucket))
        << "the device holds only the staging";
    // Stage 2: all of it on the device.
    EXPECT_EQ(plan_model_states(in, 2).comm_buffers - plan_model_states(off, 2).comm_buffers,
              bytes(in.num_params));
    EXPECT_EQ(plan_host_states(in, 2), 0);
  }
}

}  // namespace
}  // namespace zero::compress
