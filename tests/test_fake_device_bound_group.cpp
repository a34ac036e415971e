// A model on the fake accelerator with a process group bound to another device (as an NCCL
// group is bound to LOCAL_RANK's GPU): initialize stops every rank at once with a clear error.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "comm/group.hpp"
#include "support/fake_device.hpp"
#include "support/fake_training.hpp"
#include "support/forwarding_group.hpp"
#include "support/thread_group.hpp"
#include "zero/engine.hpp"

namespace zero::testing {
namespace {

// A real gloo group that says it is bound to `bound`, as an NCCL group is bound to LOCAL_RANK's
// GPU (comm/nccl.cpp): its collectives would run there whatever device the model is on.
class BoundGroup final : public ForwardingGroup {
 public:
  BoundGroup(std::shared_ptr<comm::Group> g, c10::Device bound)
      : ForwardingGroup(std::move(g)), bound_(bound) {}
  std::optional<c10::Device> bound_device() const override { return bound_; }

 private:
  c10::Device bound_;
};

// A model on another device than the one the group is bound to (set_current_device picked the
// model's GPU, LOCAL_RANK another) stops initialize at once with both devices and the fix,
// before any collective could hang; a model on the bound device trains.
TEST(FakeDeviceBoundGroup, ModelOnAnotherDeviceThanTheGroupIsAClearError) {
  const Config cfg = training_config(2, "AdamW");
  run_ranks(
      kWorld,
      [&](std::shared_ptr<comm::Group> group) {
        const int r = group->rank();
        const c10::Device other = fake::device(1 - r);
        try {
          initialize(net_on(1, rank_device(*group)), cfg,
                     std::make_shared<BoundGroup>(group, other));
          ADD_FAILURE() << "rank " << r << ": expected an error";
        } catch (const c10::Error& e) {
          const std::string m = e.what();
          EXPECT_NE(m.find("the model is on " + rank_device(*group).str()), std::string::npos) << m;
          EXPECT_NE(m.find("is bound to " + other.str()), std::string::npos) << m;
          EXPECT_NE(m.find("LOCAL_RANK"), std::string::npos) << m;
        }
        auto net = net_on(1, rank_device(*group));
        auto engine =
            initialize(net, cfg, std::make_shared<BoundGroup>(group, rank_device(*group)));
        train_steps(engine, *net, r, 0, 1);
      },
      std::chrono::seconds(60), fake::device().type());
}

// One rank alone on the wrong device (rank 1's model on fake:1, its group bound to fake:0):
// rank 0 must not go on into the parameter broadcast and wait there for rank 1 until
// comm_timeout_s (20 s here). Both stop at once with the same error, naming rank 1's devices.
TEST(FakeDeviceBoundGroup, OneRankOnAnotherDeviceStopsEveryRankAtOnce) {
  const Config cfg = training_config(2, "AdamW");
  std::vector<std::string> messages(kWorld);
  std::vector<double> seconds(kWorld);
  run_ranks(
      kWorld,
      [&](std::shared_ptr<comm::Group> group) {
        const int r = group->rank();
        const c10::Device bound = r == 1 ? fake::device(0) : rank_device(*group);
        const auto t0 = std::chrono::steady_clock::now();
        try {
          initialize(net_on(1, rank_device(*group)), cfg,
                     std::make_shared<BoundGroup>(group, bound));
          ADD_FAILURE() << "rank " << r << ": expected an error";
        } catch (const c10::Error& e) {
          messages[r] = e.what_without_backtrace();
        }
        seconds[r] = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      },
      std::chrono::seconds(20), fake::device().type());
  EXPECT_EQ(messages[0], messages[1]);
  EXPECT_NE(messages[0].find("every rank stops, rank 1: the model is on " + fake::device(1).str() +
                             " but the process group"),
            std::string::npos)
      << messages[0];
  EXPECT_NE(messages[0].find("is bound to " + fake::device(0).str()), std::string::npos);
  EXPECT_EQ(messages[0].find("rank 0:"), std::string::npos) << messages[0];
  for (int r = 0; r < kWorld; ++r) EXPECT_LT(seconds[r], 10.0) << "rank " << r << " waited";
}

}  // namespace
}  // namespace zero::testing
