// ActivationOffloader: checkpointed inputs go to host memory and come back unchanged, with exact
// byte and event accounting, a prefetch one block ahead of backward, and clear errors when a
// backward asks for a block that is gone. On CPU the host "copies" are clones, which exercises
// the same bookkeeping; the CUDA tests run only where a GPU is present.
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/dropout.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>

#include <string>
#include <vector>

#include "support/block_mlp.hpp"
#include "zero/activation_checkpointing.hpp"

namespace zero::testing {
namespace {

constexpr int kBlocks = 6;
constexpr int64_t kBatch = 8;
constexpr int64_t kWidth = 32;
constexpr int64_t kBlockInputBytes = kBatch * kWidth * 4;  // each block's input: one fp32 matrix

using Mlp = BlockMlp;

struct Result {
  at::Tensor loss, x_grad, after;
  std::vector<at::Tensor> grads;
};

Result train(ActivationOffloader* offloader, c10::Device device = c10::kCPU) {
  at::set_num_threads(1);
  at::manual_seed(0);
  Mlp net(kBlocks, kWidth, 0.1);
  net.to(device);
  at::Tensor x = at::randn({kBatch, kWidth}).to(device).requires_grad_();
  at::Tensor probe = at::randn({kBatch, kWidth}).to(device);
  CheckpointOptions opts;
  opts.offload = offloader;
  Result r;
  r.loss = (net.forward(x, &opts) * probe).sum();
  r.loss.backward();
  r.x_grad = x.grad();
  r.after = at::rand({8});
  for (const at::Tensor& p : net.parameters()) r.grads.push_back(p.grad());
  return r;
}

std::string message_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const c10::Error& e) {
    return e.what_without_backtrace();
  }
  return "(no error)";
}

TEST(Offload, NumericsIdenticalToPlainCheckpoint) {
  ActivationOffloader offloader;
  const Result plain = train(nullptr);
  const Result off = train(&offloader);
  EXPECT_TRUE(at::equal(plain.loss, off.loss));
  EXPECT_TRUE(at::equal(plain.x_grad, off.x_grad));
  EXPECT_TRUE(at::equal(plain.after, off.after));
  ASSERT_EQ(plain.grads.size(), off.grads.size());
  for (size_t i = 0; i < plain.grads.size(); ++i)
    EXPECT_TRUE(at::equal(plain.grads[i], off.grads[i]));
}

TEST(Offload, StatsAcrossForwardAndBackward) {
  at::manual_seed(0);
  Mlp net(kBlocks, kWidth, 0.1);
  ActivationOffloader offloader;
  CheckpointOptions opts;
  opts.offload = &offloader;
  at::Tensor loss = net.forward(at::randn({kBatch, kWidth}), &opts).sum();

  OffloadStats s = offloader.stats();
  EXPECT_EQ(s.device_bytes_kept, 0);
  EXPECT_EQ(s.host_bytes, kBlocks * kBlockInputBytes);
  EXPECT_EQ(s.peak_host_bytes, kBlocks * kBlockInputBytes);
  EXPECT_EQ(s.offloaded, kBlocks);
  EXPECT_EQ(s.fetched, 0);
  EXPECT_EQ(s.prefetched, 0);
  EXPECT_EQ(s.freed, 0);

  loss.backward();
  s = offloader.stats();
  EXPECT_EQ(s.device_bytes_kept, 0);
  EXPECT_EQ(s.host_bytes, 0);
  EXPECT_EQ(s.peak_host_bytes, kBlocks * kBlockInputBytes);
  EXPECT_EQ(s.offloaded, kBlocks);
  EXPECT_EQ(s.fetched, kBlocks);
  EXPECT_EQ(s.prefetched, kBlocks - 1) << "every block but the last is fetched ahead";
  EXPECT_EQ(s.freed, kBlocks);
}

TEST(Offload, PrefetchesTheBlockBackwardNeedsNext) {
  ActivationOffloader offloader;
  std::vector<at::Tensor> inputs;
  for (int i = 0; i < 3; ++i) inputs.push_back(at::randn({4, 5}));
  std::vector<int64_t> ids;
  for (const at::Tensor& t : inputs) ids.push_back(offloader.offload({t, at::Tensor()}));

  std::vector<at::Tensor> got = offloader.fetch(ids[2]);
  ASSERT_EQ(got.size(), 2u);
  EXPECT_TRUE(at::equal(got[0], inputs[2]));
  EXPECT_NE(got[0].data_ptr(), inputs[2].data_ptr()) << "a copy, not the original";
  EXPECT_FALSE(got[1].defined()) << "undefined inputs come back undefined";
  OffloadStats s = offloader.stats();
  EXPECT_EQ(s.prefetched, 1);
  EXPECT_EQ(s.device_bytes_kept, 4 * 5 * 4) << "block 1 is already back on the device side";
  EXPECT_EQ(s.host_bytes, 2 * 4 * 5 * 4);

  EXPECT_TRUE(at::equal(offloader.fetch(ids[1])[0], inputs[1]));
  EXPECT_TRUE(at::equal(offloader.fetch(ids[0])[0], inputs[0]));
  s = offloader.stats();
  EXPECT_EQ(s.fetched, 3);
  EXPECT_EQ(s.prefetched, 2);
  EXPECT_EQ(s.freed, 3);
  EXPECT_EQ(s.device_bytes_kept, 0);
  EXPECT_EQ(s.host_bytes, 0);
}

TEST(Offload, SecondBackwardFailsClearly) {
  at::manual_seed(0);
  Mlp net(kBlocks, kWidth, 0.1);
  ActivationOffloader offloader;
  CheckpointOptions opts;
  opts.offload = &offloader;
  // Summed straight off the last checkpoint, so that the checkpoint is the first node of the
  // second backward to need its saved state.
  at::Tensor loss = net.forward(at::randn({kBatch, kWidth}), &opts).sum();
  loss.backward();
  const std::string msg = message_of([&] { loss.backward(); });
  EXPECT_NE(msg.find("already fetched and freed"), std::string::npos) << msg;
  EXPECT_NE(msg.find("retain_graph"), std::string::npos) << msg;
}

TEST(Offload, UnknownBlockFailsClearly) {
  ActivationOffloader a;
  ActivationOffloader b;
  const int64_t id = a.offload({at::ones({2})});
  const std::string msg = message_of([&] { b.fetch(id); });
  EXPECT_NE(msg.find("never offloaded by this offloader"), std::string::npos) << msg;
}

TEST(Offload, ResetBetweenSteps) {
  at::manual_seed(0);
  Mlp net(kBlocks, kWidth, 0.1);
  ActivationOffloader offloader;
  CheckpointOptions opts;
  opts.offload = &offloader;
  for (int step = 0; step < 3; ++step) {
    net.forward(at::randn({kBatch, kWidth}), &opts).sum().backward();
    const OffloadStats s = offloader.stats();
    EXPECT_EQ(s.offloaded, kBlocks) << "step " << step;
    EXPECT_EQ(s.fetched, kBlocks) << "step " << step;
    EXPECT_EQ(s.prefetched, kBlocks - 1) << "step " << step;
    EXPECT_EQ(s.freed, kBlocks) << "step " << step;
    EXPECT_EQ(s.host_bytes, 0) << "step " << step;
    offloader.reset();
    const OffloadStats z = offloader.stats();
    EXPECT_EQ(z.offloaded + z.fetched + z.prefetched + z.freed + z.peak_host_bytes, 0);
  }

  // A forward whose backward never came: reset() drops its blocks, and a late backward says so.
  at::Tensor stale = net.forward(at::randn({kBatch, kWidth}), &opts).sum();
  EXPECT_EQ(offloader.stats().host_bytes, kBlocks * kBlockInputBytes);
  offloader.reset();
  EXPECT_EQ(offloader.stats().host_bytes, 0);
  const std::string msg = message_of([&] { stale.backward(); });
  EXPECT_NE(msg.find("dropped by reset()"), std::string::npos) << msg;
}

TEST(Offload, DestroyedGraphFreesItsBlocks) {
  at::manual_seed(0);
  Mlp net(kBlocks, kWidth, 0.1);
  ActivationOffloader offloader;
  CheckpointOptions opts;
  opts.offload = &offloader;
  {
    at::Tensor unused = net.forward(at::randn({kBatch, kWidth}), &opts);
    EXPECT_EQ(offloader.stats().host_bytes, kBlocks * kBlockInputBytes);
  }
  const OffloadStats s = offloader.stats();
  EXPECT_EQ(s.host_bytes, 0);
  EXPECT_EQ(s.freed, kBlocks);
  EXPECT_EQ(s.fetched, 0);
}

TEST(Offload, CudaMatchesPlainCheckpointAndAccountsPinnedCopies) {
  if (!at::hasCUDA()) GTEST_SKIP() << "needs a CUDA device";
  const c10::Device cuda(c10::kCUDA, 0);
  ActivationOffloader offloader;
  const Result plain = train(nullptr, cuda);
  const Result off = train(&offloader, cuda);
  // Same kernels on the same inputs; dropout masks are replayed from the CUDA generator state.
  EXPECT_TRUE(at::equal(plain.loss, off.loss));
  EXPECT_TRUE(at::allclose(plain.x_grad, off.x_grad, 1e-6, 1e-7));
  for (size_t i = 0; i < plain.grads.size(); ++i) {
    EXPECT_TRUE(at::allclose(plain.grads[i], off.grads[i], 1e-6, 1e-7)) << i;
  }
  const OffloadStats s = offloader.stats();
  EXPECT_EQ(s.fetched, kBlocks);
  EXPECT_EQ(s.prefetched, kBlocks - 1);
  EXPECT_EQ(s.host_bytes, 0);
}

TEST(Offload, CudaCopiesRunAsynchronouslyAndReleaseDeviceMemory) {
  if (!at::hasCUDA()) GTEST_SKIP() << "needs a CUDA device";
  const c10::Device cuda(c10::kCUDA, 0);
  ActivationOffloader offloader;
  // Large enough that the copy is still running when offload() returns.
  at::Tensor big = at::randn({64, 1024, 1024}, at::TensorOptions().device(cuda));
  const int64_t bytes = static_cast<int64_t>(big.nbytes());
  const int64_t id = offloader.offload({big});
  OffloadStats s = offloader.stats();
  EXPECT_EQ(s.host_bytes, bytes);
  EXPECT_TRUE(s.device_bytes_kept == 0 || s.device_bytes_kept == bytes);
  offloader.synchronize();
  EXPECT_EQ(offloader.stats().device_bytes_kept, 0) << "finished copies release their source";
  std::vector<at::Tensor> back = offloader.fetch(id);
  ASSERT_EQ(back.size(), 1u);
  EXPECT_TRUE(back[0].is_cuda());
  EXPECT_TRUE(at::equal(back[0], big));
  EXPECT_EQ(offloader.stats().host_bytes, 0);
}

}  // namespace
}  // namespace zero::testing
