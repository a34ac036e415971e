// Checkpoints on the fake accelerator (tests/support/fake_device.hpp): saved from the devices,
// loaded into fresh engines on them, the device pieces staged through page-locked memory.
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <string>
#include <vector>

#include "support/fake_device.hpp"
#include "support/fake_training.hpp"
#include "support/thread_group.hpp"
#include "zero/engine.hpp"

namespace zero::testing {
namespace {

std::string temp_dir(const std::string& name) {
  return (std::filesystem::temp_directory_path() / (name + "_" + std::to_string(::getpid())))
      .string();
}

// Saved from the fake devices, loaded into fresh engines on them: training resumes where it
// would have gone on (with and without optimizer offload on either side).
class FakeDeviceCheckpoint : public ::testing::TestWithParam<bool> {};

TEST_P(FakeDeviceCheckpoint, SaveLoadRoundTripResumesTraining) {
  const bool offload = GetParam();
  const std::string dir = temp_dir(std::string("zero_fake_ckpt") + (offload ? "_off" : ""));
  std::filesystem::remove_all(dir);
  const Config cfg = training_config(2, "AdamW", offload);
  const auto masters = [](Engine& e) {
    std::vector<at::Tensor> parts;
    for (auto& [name, t] : e.state_dict()) parts.push_back(t.reshape(-1));
    return at::cat(parts);
  };
  std::vector<at::Tensor> saved(kWorld), straight(kWorld), loaded(kWorld), resumed(kWorld);
  const auto dev = fake::device().type();
  run_ranks(
      kWorld,
      [&](std::shared_ptr<comm::Group> group) {
        const int r = group->rank();
        auto net = net_on(6, rank_device(*group));
        auto engine = initialize(net, cfg, group);
        train_steps(engine, *net, r, 0, 2);
        const int64_t pinned_before = fake::pinned_allocations();
        engine.save_checkpoint(dir, "two");
        // The pieces on the device travel through a page-locked staging buffer (a pageable one
        // makes the driver stage every copy itself); under offload they are host memory already.
        if (!offload) EXPECT_GT(fake::pinned_allocations(), pinned_before) << "rank " << r;
        // A later save reuses that buffer: page-locking memory per save is slow, and freeing
        // it (cudaFreeHost) synchronises the device. Both ranks made theirs in the first save
        // (its collectives come after write_shard), so no other thread allocates meanwhile.
        const int64_t pinned_after_first = fake::pinned_allocations();
        engine.save_checkpoint(dir, "again");
        EXPECT_EQ(fake::pinned_allocations(), pinned_after_first) << "rank " << r;
        saved[r] = masters(engine);
        train_steps(engine, *net, r, 2, 4);
        straight[r] = masters(engine);
      },
      std::chrono::seconds(60), dev);
  run_ranks(
      kWorld,
      [&](std::shared_ptr<comm::Group> group) {
        const int r = group->rank();
        auto net = net_on(99, rank_device(*group));  // other weights: the load must replace them
        auto engine = initialize(net, cfg, group);
        const int64_t pinned_before = fake::pinned_allocations();
        EXPECT_EQ(engine.load_checkpoint(dir, "two"), "two");
        if (!offload) EXPECT_GT(fake::pinned_allocations(), pinned_before) << "rank " << r;
        loaded[r] = masters(engine);
        train_steps(engine, *net, r, 2, 4);
        resumed[r] = masters(engine);
      },
      std::chrono::seconds(60), dev);
  for (int r = 0; r < kWorld; ++r) {
    EXPECT_TRUE(at::equal(loaded[r].cpu(), saved[r].cpu())) << "rank " << r;
    EXPECT_TRUE(at::equal(resumed[r].cpu(), straight[r].cpu())) << "rank " << r;
    EXPECT_FALSE(at::equal(resumed[r].cpu(), saved[r].cpu())) << "training went on";
  }
  std::filesystem::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(WithAndWithoutOffload, FakeDeviceCheckpoint, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return std::string(info.param ? "offload" : "on_device");
                         });

}  // namespace
}  // namespace zero::testing
