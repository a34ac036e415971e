// The CUDA path of the engine on one GPU: flat buffers, bucket buffers, shards and optimizer
// states on the device, and memory read back from the caching allocator. Skips without a GPU.
// (NCCL itself needs two GPUs: two ranks may not share one device.)
#include <ATen/ATen.h>
#include <c10/core/Event.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <gtest/gtest.h>

#include "comm/group.hpp"
#include "support/tiny_net.hpp"
#include "zero/device.hpp"
#include "zero/engine.hpp"

namespace zero::testing {
namespace {

class CudaEngine : public ::testing::TestWithParam<int> {};

TEST_P(CudaEngine, MatchesTheCpuReference) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device";
  const int stage = GetParam();
  constexpr int kSteps = 5;
  constexpr int64_t kRows = 48;
  Config cfg = test_config(stage, kRows, 1, 0.3);
  const ReferenceResult ref = train_reference(cfg, kSteps, kRows, 3);

  const c10::Device dev(c10::kCUDA, 0);
  set_current_device(dev);
  reset_peak_memory(dev);
  auto net = make_tiny_net(3);
  net->to(dev);
  comm::GroupOptions go;
  go.device = c10::kCUDA;
  auto engine = initialize(net, cfg, comm::Group::single(go));
  for (int s = 0; s < kSteps; ++s) {
    Batch b = global_batch(s, kRows);
    engine.backward(mse(net->forward(b.x.to(dev)), b.y.to(dev)));
    EXPECT_TRUE(engine.step());
  }
  const at::Tensor got = engine.flat_parameters().cpu();
  EXPECT_LT((got - ref.params).abs().max().item<double>(), 1e-4) << "stage " << stage;

  const DeviceMemory m = device_memory(dev);
  ASSERT_TRUE(m.available);
  // Every byte the engine accounts lives in the caching allocator.
  EXPECT_GE(m.allocated, engine.memory_report().measured.total());
  EXPECT_GE(m.peak_allocated, m.allocated);
  EXPECT_GE(m.reserved, m.allocated);
  EXPECT_GT(known_peak_flops(device_name(dev)) + 1, 0);  // names resolve without throwing
}

INSTANTIATE_TEST_SUITE_P(Stages, CudaEngine, ::testing::Values(0, 1, 2));

TEST(CudaEngine, Bf16OnTheDeviceKeepsFp32MasterAndTrains) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device";
  const c10::Device dev(c10::kCUDA, 0);
  Config cfg = test_config(2, 48, 1, 1.0);
  cfg.bf16 = true;
  auto net = make_tiny_net(3);
  net->to(dev);
  comm::GroupOptions go;
  go.device = c10::kCUDA;
  auto engine = initialize(net, cfg, comm::Group::single(go));
  double first = 0, last = 0;
  for (int s = 0; s < 60; ++s) {
    Batch b = global_batch(s % 8, 48);
    at::Tensor loss = mse(net->forward(b.x.to(dev).to(at::kBFloat16)).to(at::kFloat), b.y.to(dev));
    (s == 0 ? first : last) = loss.item<double>();
    engine.backward(loss);
    engine.step();
  }
  EXPECT_LT(last, 0.7 * first);
  for (const auto& p : net->parameters()) EXPECT_EQ(p.scalar_type(), at::kBFloat16);
  EXPECT_EQ(engine.memory_report().measured.master, 4 * engine.memory_report().padded_params);
}

// On one GPU (world size 1: every collective is a local copy on the stream), nothing in
// backward() or step() may wait for the device: queue ~0.5 s of GPU work first, then backward
// and step; if either synchronised with the device anywhere (an .item(), a blocking wait, a
// pageable copy to the host) that work would have drained before they returned. An event
// recorded after them must still be pending. With NCCL the same holds for the reduce-scatters:
// Work::wait() only orders the stream (comm/backend.hpp).
TEST(CudaEngine, BackwardAndStepReturnBeforeTheDeviceFinishes) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device";
  const c10::Device dev(c10::kCUDA, 0);
  set_current_device(dev);
  // fp16 too: the loss scale, the overflow check and the skip stay on the device
  // (zero/step/loss_scaler.cpp), so a dynamic scale must not read found_inf on the host.
  for (const at::ScalarType dtype : {at::kFloat, at::kBFloat16, at::kHalf}) {
    for (int stage : {0, 2}) {
      Config cfg = test_config(stage, 48, 1, 1.0);
      cfg.bf16 = dtype == at::kBFloat16;
      cfg.fp16.enabled = dtype == at::kHalf;
      auto net = make_tiny_net(3);
      net->to(dev);
      comm::GroupOptions go;
      go.device = c10::kCUDA;
      auto engine = initialize(net, cfg, comm::Group::single(go));
      // Batches go to the device first: a blocking host-to-device copy syncs the stream.
      const auto batch = [&](int s) {
        Batch b = global_batch(s, 48);
        return std::make_pair(b.x.to(dev).to(dtype), b.y.to(dev));
      };
      const auto train = [&](const std::pair<at::Tensor, at::Tensor>& xy) {
        engine.backward(mse(net->forward(xy.first).to(at::kFloat), xy.second));
        engine.step();
      };
      for (int s = 0; s < 3; ++s) train(batch(s));  // warm-up: allocations, first read-backs
      (void)engine.settled_stats();                 // settles the last step's read-back
      const auto last = batch(3);
      at::Tensor a = at::randn({4096, 4096}, at::TensorOptions().device(dev));
      at::Tensor c = a.clone();
      for (int i = 0; i < 200; ++i) c = at::matmul(c, a).div_(64);  // ~0.5 s on an H100
      train(last);
      const c10::impl::VirtualGuardImpl guard(c10::kCUDA);
      c10::Event done(c10::kCUDA);
      done.record(guard.getStream(dev));
      EXPECT_FALSE(done.query()) << "stage " << stage << " " << c10::toString(dtype)
                                 << ": backward/step waited for the device";
      done.synchronize();
      // fp16's first steps may overflow and be skipped (the dynamic scale starts at 2^16):
      // applied or skipped, every step is accounted for.
      const EngineStats& st = engine.settled_stats();
      EXPECT_EQ(st.optimizer_steps + st.skipped_steps, 4) << c10::toString(dtype);
    }
  }
}

// Optimizer offload waits for the device where its host step needs device values (the end of
// backward's copies to the host, the step's scalars: README, "Host syncs left"), always for work
// queued on the compute stream before them. It must never wait for the whole device: a
// cudaDeviceSynchronize, or a cudaFreeHost/cudaHostAlloc of page-locked memory in the step
// (both synchronise the device), would wait for unrelated work on another stream too. So: ~0.5 s
// of work on a side stream, then an offloaded step; the side stream's event must still be
// pending when the step returns.
TEST(CudaEngine, OffloadedStepNeverWaitsForTheWholeDevice) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device";
  const c10::Device dev(c10::kCUDA, 0);
  set_current_device(dev);
  for (const at::ScalarType dtype : {at::kFloat, at::kBFloat16, at::kHalf}) {
    Config cfg = test_config(2, 48, 1, 1.0);
    cfg.bf16 = dtype == at::kBFloat16;
    cfg.fp16.enabled = dtype == at::kHalf;
    cfg.zero_optimization.offload_optimizer.enabled = true;
    cfg.zero_optimization.offload_optimizer.pin_memory = true;
    auto net = make_tiny_net(3);
    net->to(dev);
    comm::GroupOptions go;
    go.device = c10::kCUDA;
    auto engine = initialize(net, cfg, comm::Group::single(go));
    const auto train = [&](int s) {
      Batch b = global_batch(s, 48);
      engine.backward(mse(net->forward(b.x.to(dev).to(dtype)).to(at::kFloat), b.y.to(dev)));
      engine.step();
    };
    for (int s = 0; s < 3; ++s) train(s);  // warm-up: pinned buffers, first read-backs
    (void)engine.settled_stats();
    const c10::impl::VirtualGuardImpl guard(c10::kCUDA);
    const c10::Stream side = guard.getStreamFromGlobalPool(dev);
    c10::Event side_done(c10::kCUDA);
    {
      const c10::impl::VirtualGuardImpl g(c10::kCUDA);
      const c10::Stream previous = g.exchangeStream(side);
      at::Tensor a = at::randn({4096, 4096}, at::TensorOptions().device(dev));
      at::Tensor c = a.clone();
      for (int i = 0; i < 200; ++i) c = at::matmul(c, a).div_(64);  // ~0.5 s on an H100
      side_done.record(side);
      g.exchangeStream(previous);
    }
    train(3);
    EXPECT_FALSE(side_done.query())
        << c10::toString(dtype) << ": the offloaded backward/step waited for the whole device";
    side_done.synchronize();
  }
}

}  // namespace
}  // namespace zero::testing
