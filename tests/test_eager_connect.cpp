// Eager connection (issue 32): every process group is connected as it is made, and every pair of
// pipeline stages that will exchange messages is connected when the runtime is built, in one
// global order on every rank, before step 1. Under NCCL a communicator (a group's, a pair's)
// made lazily in the middle of step 1, with kernels in flight and in each rank's own order, can
// deadlock; here, on real gloo groups, a recording group shows the order and the timing, which
// the NCCL path shares (comm/group.hpp, connect()).
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/optim/sgd.h>

#include <algorithm>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "comm/group.hpp"
#include "comm/mesh.hpp"
#include "support/forwarding_group.hpp"
#include "support/thread_group.hpp"
#include "zero/models/gpt.hpp"
#include "zero/models/gpt_layers.hpp"
#include "zero/pipeline/partition.hpp"
#include "zero/pipeline/runtime/runtime.hpp"

namespace zero::pipeline {
namespace {

using models::Gpt;
using models::GptConfig;

// Every group made over a store or by split, on real gloo, is connected before it is returned:
// the world, and each of a Megatron mesh's tp, dp and pp groups, and a split of a split.
TEST(EagerConnect, EveryGroupIsConnectedWhenMade) {
  testing::run_ranks(8, [](std::shared_ptr<comm::Group> world) {
    EXPECT_TRUE(world->connected());
    comm::Mesh mesh = comm::Mesh::megatron(world, /*tp=*/2, /*pp=*/2);
    for (const char* dim : {"tp", "dp", "pp"}) {
      EXPECT_EQ(mesh[dim]->size(), 2) << dim;
      EXPECT_TRUE(mesh[dim]->connected()) << dim << " on world rank " << world->rank();
    }
    auto half = world->split(world->rank() % 2, world->rank(), "half");
    auto quarter = half->split(half->rank() % 2, half->rank(), "quarter");
    EXPECT_TRUE(half->connected());
    EXPECT_TRUE(quarter->connected());
    // A group of one has nothing to connect.
    EXPECT_TRUE(comm::Group::single()->connected());
  });
}

// One rank's record of what its groups did, in order: the point-to-point traffic and the pair
// connections of the pipeline group and the group split from it, and a mark where step 1 began.
struct Event {
  std::string channel;  // "pp", or "pp/split" for the group the runtime splits from it
  std::string kind;     // "connect-send", "connect-recv", "send", "recv", "collective", "step 1"
  int peer = -1;
};

struct Log {
  std::mutex mu;
  std::map<int, std::vector<Event>> by_rank;  // by pipeline rank (stage)
  void add(int rank, Event e) {
    std::lock_guard<std::mutex> lock(mu);
    by_rank[rank].push_back(std::move(e));
  }
};

class RecordingGroup final : public testing::ForwardingGroup {
 public:
  RecordingGroup(std::shared_ptr<comm::Group> g, std::string channel, int stage,
                 std::shared_ptr<Log> log)
      : ForwardingGroup(std::move(g)), channel_(std::move(channel)), stage_(stage),
        log_(std::move(log)) {}
  void connect_peer(int peer, bool sender, const std::string& w) override {
    log_->add(stage_, {channel_, sender ? "connect-send" : "connect-recv", peer});
    ForwardingGroup::connect_peer(peer, sender, w);
  }
  comm::Work send(at::Tensor& t, int dst, const std::string& w, int tag) override {
    log_->add(stage_, {channel_, "send", dst});
    return ForwardingGroup::send(t, dst, w, tag);
  }
  comm::Work recv(at::Tensor& t, int src, const std::string& w, int tag) override {
    log_->add(stage_, {channel_, "recv", src});
    return ForwardingGroup::recv(t, src, w, tag);
  }
  comm::Work all_reduce_sum(at::Tensor& t, const std::string& w) override {
    log_->add(stage_, {channel_, "collective", -1});
    return ForwardingGroup::all_reduce_sum(t, w);
  }
  comm::Work broadcast(at::Tensor& t, int root, const std::string& w) override {
    log_->add(stage_, {channel_, "collective", -1});
    return ForwardingGroup::broadcast(t, root, w);
  }
  std::shared_ptr<comm::Group> split(int color, int key, const std::string& n) override {
    auto sub = ForwardingGroup::split(color, key, n);
    // Made connected (the split itself connects), before any traffic.
    EXPECT_TRUE(!sub || sub->connected()) << n;
    return sub ? std::make_shared<RecordingGroup>(sub, channel_ + "/split", stage_, log_) : nullptr;
  }

 private:
  std::string channel_;
  int stage_;
  std::shared_ptr<Log> log_;
};

std::vector<at::Tensor> chunks(const at::Tensor& t, int m) {
  std::vector<at::Tensor> out;
  for (const auto& c : t.chunk(m, 0)) out.push_back(c.contiguous());
  return out;
}

// 2, 3 and 4 stages, tied embedding and head (their weight and gradient travel between the
// first and last stage) or not: every stage connects the pairs it is in, in the global sorted
// order of pairs (adjacent stages, and the tie's owner with its other holder), each pair on
// both groups (the later-bound one from the lower stage, the earlier-bound one from the upper),
// before any send or receive and before step 1; and the two sides of each pair agree.
TEST(EagerConnect, PipelinePairsConnectInOneOrderBeforeStepOne) {
  GptConfig c = models::gpt_preset("tiny");
  c.layers = 4;
  for (bool tied : {false, true})
    for (int stages : {2, 3, 4}) {
      c.tied = tied;
      SCOPED_TRACE("P=" + std::to_string(stages) + (tied ? " tied" : " untied"));
      at::manual_seed(5);
      Gpt init_model(c);
      const int m = 2;
      const at::Tensor tokens = at::randint(c.vocab, {2 * m, 9}, at::kLong);
      const at::Tensor inputs = tokens.narrow(1, 0, 8), targets = tokens.narrow(1, 1, 8);
      auto log = std::make_shared<Log>();
      testing::run_ranks(stages, [&](std::shared_ptr<comm::Group> g) {
        auto pp = std::make_shared<RecordingGroup>(g, "pp", g->rank(), log);
        Gpt model(c);
        {
          at::NoGradGuard no_grad;
          auto from = init_model->parameters();
          auto to = model->parameters();
          for (size_t i = 0; i < to.size(); ++i) to[i].copy_(from[i]);
        }
        StageLayers layers(models::gpt_pipeline_layers(model), PartitionMethod::Uniform, stages,
                           pp->rank());
        auto opt = std::make_unique<TorchStageOptimizer>(std::make_unique<torch::optim::SGD>(
            layers.parameters(), torch::optim::SGDOptions(0.1)));
        PipelineRuntime rt(std::move(layers), models::gpt_loss, pp, std::move(opt),
                           {ScheduleKind::OneFOneB, m});
        log->add(pp->rank(), {"", "step 1", -1});
        rt.train_batch(chunks(inputs, m), chunks(targets, m));
      });

      // The pairs that carry messages: adjacent stages, and the tie's ends.
      std::set<std::pair<int, int>> pairs;
      for (int s = 0; s + 1 < stages; ++s) pairs.insert({s, s + 1});
      if (tied) pairs.insert({0, stages - 1});
      const std::string down = "pp/split";
      for (int s = 0; s < stages; ++s) {
        SCOPED_TRACE("stage " + std::to_string(s));
        const std::vector<Event>& ev = log->by_rank[s];
        std::vector<Event> want;
        for (const auto& [a, b] : pairs) {
          if (s != a && s != b) continue;
          want.push_back({"pp", s == a ? "connect-send" : "connect-recv", s == a ? b : a});
          want.push_back({down, s == b ? "connect-send" : "connect-recv", s == a ? b : a});
        }
        // The connections come first, exactly in that order, then step 1 and the traffic.
        ASSERT_GE(ev.size(), want.size());
        for (size_t i = 0; i < want.size(); ++i) {
          EXPECT_EQ(ev[i].channel, want[i].channel) << "event " << i;
          EXPECT_EQ(ev[i].kind, want[i].kind) << "event " << i;
          EXPECT_EQ(ev[i].peer, want[i].peer) << "event " << i;
        }
        const auto step1 = std::find_if(ev.begin(), ev.end(),
                                         [](const Event& e) { return e.kind == "step 1"; });
        ASSERT_NE(step1, ev.end());
        for (auto it = ev.begin() + static_cast<std::ptrdiff_t>(want.size()); it != ev.end(); ++it)
          EXPECT_EQ(it->kind.rfind("connect", 0), std::string::npos)
              << "a connection after the construction's: " << it->channel << " " << it->peer;
        // Every peer this stage exchanged a message with in step 1 was connected on that
        // channel before step 1.
        std::set<std::pair<std::string, int>> connected, used;
        for (auto it = ev.begin(); it != step1; ++it)
          if (it->kind.rfind("connect", 0) == 0) connected.insert({it->channel, it->peer});
        for (auto it = step1; it != ev.end(); ++it)
          if (it->kind == "send" || it->kind == "recv") used.insert({it->channel, it->peer});
        EXPECT_FALSE(used.empty());
        for (const auto& u : used)
          EXPECT_TRUE(connected.count(u)) << u.first << " with stage " << u.second
                                          << " was first used in step 1";
      }
    }
}

}  // namespace
}  // namespace zero::pipeline
