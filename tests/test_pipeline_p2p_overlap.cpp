// The pipeline runtime posts each receive before the compute of the schedule step before the one
// that needs it (zero/pipeline/runtime/early_recvs.hpp), as Megatron-LM's overlap_p2p_comm
// does, so the message travels while the stage computes:
//  - where early_receives() places the receives of 1F1B's lists, written out by hand from the
//    rule (one compute of look-ahead, never over a message on the receive's own channel, never
//    over ReduceGrads / OptimizerStep or a fenced instruction);
//  - in a real run over gloo (2 stages, the example GPT, 1F1B), the order in which stage 0 posts
//    its gradient receives and runs its forwards, recorded by a group wrapper and the layers:
//    from the second step on (the shapes known), micro-batch j's gradient receive is posted
//    before micro-batch j + 1's forward, where the runtime without early receives posted it
//    after; and the losses and parameters of both runs are the same bits;
//  - the same through PipelineEngine from a parsed config: pipeline.overlap_p2p_comm false
//    (zero-train's switch for the A/B) posts them late, as the runtime without early receives
//    does, true (the default) early, and both train to the same bits.
// The equivalence with one process and the per-group order of the messages stay with
// test_pipeline_runtime (it runs with early receives, the default).
#include <gtest/gtest.h>
#include <torch/optim/sgd.h>

#include <ATen/CPUGeneratorImpl.h>

#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "comm/group.hpp"
#include "comm/mesh.hpp"
#include "support/forwarding_group.hpp"
#include "support/thread_group.hpp"
#include "zero/comm_overlap.hpp"
#include "zero/models/gpt.hpp"
#include "zero/models/gpt_layers.hpp"
#include "zero/pipeline/runtime/early_recvs.hpp"
#include "zero/pipeline/runtime/runtime.hpp"
#include "zero/pipeline_engine.hpp"

namespace zero::pipeline {
namespace {

using models::Gpt;
using models::GptConfig;

// Channel ids as the runtime's groups for a stage between two others: activations travel up on
// one group, gradients down on the other.
int channel_of(const Instruction& ins) {
  return ins.op == Op::SendActivation || ins.op == Op::RecvActivation ? 0 : 1;
}

// Where each receive of `list` is posted: (receive index, index it is posted before).
std::vector<std::pair<int, int>> placed(const std::vector<Instruction>& list,
                                        const std::vector<bool>& fenced = {}) {
  const auto at = early_receives(list, channel_of, fenced);
  std::vector<std::pair<int, int>> out;
  for (size_t e = 0; e < at.size(); ++e)
    for (int r : at[e]) out.emplace_back(r, static_cast<int>(e));
  std::sort(out.begin(), out.end());
  return out;
}

TEST(PipelineEarlyReceives, OneFOneBReceivesMoveBeforeTheComputeOfTheStepBefore) {
  // Stage 0 of 2, 3 micro-batches:
  //  0 F0  1 SA0  2 F1  3 SA1  4 RG0  5 B0  6 F2  7 SA2  8 RG1  9 B1  10 RG2  11 B2  12 R  13 O
  const auto s0 = one_f_one_b_schedule(2, 3, 0);
  ASSERT_EQ(s0.size(), 14u);
  ASSERT_EQ(s0[4], (Instruction{Op::RecvGrad, 0, 0}));
  ASSERT_EQ(s0[8], (Instruction{Op::RecvGrad, 1, 0}));
  ASSERT_EQ(s0[10], (Instruction{Op::RecvGrad, 2, 0}));
  // RG0 over SA1 and F1 (SA0 is another channel; F0 would be a second compute); RG1 over SA2,
  // F2 (B0 a second compute); RG2 over B1 only (the gradient channel's RG1 before it).
  EXPECT_EQ(placed(s0), (std::vector<std::pair<int, int>>{{4, 1}, {8, 6}, {10, 9}}));

  // Stage 1 of 2 (the last):
  //  0 RA0  1 F0  2 B0  3 SG0  4 RA1  5 F1  6 B1  7 SG1  8 RA2  9 F2  10 B2  11 SG2  12 R  13 O
  const auto s1 = one_f_one_b_schedule(2, 3, 1);
  ASSERT_EQ(s1.size(), 14u);
  ASSERT_EQ(s1[4], (Instruction{Op::RecvActivation, 1, 0}));
  // RA1 over SG0 and B0 (F0 a second compute), RA2 likewise over SG1 and B1.
  EXPECT_EQ(placed(s1), (std::vector<std::pair<int, int>>{{0, 0}, {4, 2}, {8, 6}}));

  // A fenced instruction is not moved over: B0 fenced keeps RA1 after it.
  std::vector<bool> fenced(s1.size(), false);
  fenced[2] = true;
  EXPECT_EQ(placed(s1, fenced), (std::vector<std::pair<int, int>>{{0, 0}, {4, 3}, {8, 6}}));
}

TEST(PipelineEarlyReceives, NeverOverAMessageOnItsOwnChannelNorTheStep) {
  // Both directions on one channel: the receive stays behind the send before it.
  const std::vector<Instruction> list{{Op::Forward, 0},        {Op::SendActivation, 0},
                                      {Op::Forward, 1},        {Op::RecvActivation, 1},
                                      {Op::ReduceGrads, -1},   {Op::OptimizerStep, -1},
                                      {Op::RecvActivation, 2}, {Op::Forward, 2}};
  EXPECT_EQ(placed(list), (std::vector<std::pair<int, int>>{{3, 2}, {6, 6}}));
}

// ---- a real run: when the receives are posted ----------------------------------------------

struct Events {
  std::mutex mu;
  std::map<int, std::vector<std::string>> by_rank;  // in the order the rank did them
  void add(int rank, std::string e) {
    std::lock_guard<std::mutex> lock(mu);
    by_rank[rank].push_back(std::move(e));
  }
};

// Records every receive as it is posted (the split group too: gradients travel on it).
class PostingLog final : public testing::ForwardingGroup {
 public:
  PostingLog(std::shared_ptr<comm::Group> g, std::shared_ptr<Events> ev)
      : ForwardingGroup(std::move(g)), ev_(std::move(ev)) {}
  comm::Work recv(at::Tensor& t, int src, const std::string& w, int tag) override {
    ev_->add(rank(), "post " + w);
    return ForwardingGroup::recv(t, src, w, tag);
  }
  std::shared_ptr<comm::Group> split(int color, int key, const std::string& n) override {
    auto sub = ForwardingGroup::split(color, key, n);
    return sub ? std::make_shared<PostingLog>(sub, ev_) : nullptr;
  }

 private:
  std::shared_ptr<Events> ev_;
};

struct Trial {
  std::shared_ptr<Events> events = std::make_shared<Events>();
  std::vector<float> losses;                 // stage 0's
  std::map<std::string, at::Tensor> params;  // every stage's, by the model's names
};

constexpr int kMicroBatches = 4, kSteps = 2;

// Trains the tiny GPT in 2 stages, 1F1B, kMicroBatches per step, SGD with momentum: through
// PipelineRuntime with `early` receives, or (cfg given) through PipelineEngine from that config.
Trial train(bool early, const Config* cfg = nullptr) {
  GptConfig c = models::gpt_preset("tiny");
  c.layers = 2;
  at::manual_seed(5);
  Gpt init(c);
  auto gen = at::detail::createCPUGenerator(17);
  std::vector<at::Tensor> tokens;
  for (int s = 0; s < kSteps; ++s) tokens.push_back(at::randint(c.vocab, {8, 17}, gen, at::kLong));
  Trial run;
  std::mutex mu;
  testing::run_ranks(2, [&](std::shared_ptr<comm::Group> g) {
    std::shared_ptr<comm::Group> dp;
    if (cfg) {
      comm::Mesh mesh = comm::Mesh::megatron(g, /*tp=*/1, /*pp=*/2);
      g = mesh["pp"];
      dp = mesh["dp"];
    }
    auto pp = std::make_shared<PostingLog>(g, run.events);
    const int stage = pp->rank();
    Gpt model(c);
    {
      at::NoGradGuard no_grad;
      auto src = init->named_parameters();
      for (auto& p : model->named_parameters()) p.value().copy_(src[p.key()]);
    }
    auto all = models::gpt_pipeline_layers(model);
    for (auto& l : all) {
      // Each forward recorded as it starts, by layer: stage 0's forwards are the embedding's.
      l.forward = [f = l.forward, name = l.name, ev = run.events, stage](const at::Tensor& x) {
        ev->add(stage, "forward " + name);
        return f(x);
      };
    }
    std::unique_ptr<PipelineRuntime> rt;
    std::unique_ptr<PipelineEngine> pipe;
    if (cfg) {
      pipe = std::make_unique<PipelineEngine>(all, models::gpt_loss, *cfg, pp, dp);
    } else {
      StageLayers layers(all, PartitionMethod::Uniform, 2, stage);
      auto opt = std::make_unique<TorchStageOptimizer>(std::make_unique<torch::optim::SGD>(
          layers.parameters(), torch::optim::SGDOptions(0.1).momentum(0.9)));
      RuntimeOptions opts{ScheduleKind::OneFOneB, kMicroBatches};
      opts.early_receives = early;
      rt = std::make_unique<PipelineRuntime>(std::move(layers), models::gpt_loss, pp,
                                             std::move(opt), opts);
    }
    for (const auto& t : tokens) {
      auto in = t.narrow(1, 0, 16).contiguous().chunk(kMicroBatches, 0);
      auto tg = t.narrow(1, 1, 16).contiguous().chunk(kMicroBatches, 0);
      const float loss = (rt ? rt->train_batch(in, tg) : pipe->train_batch(in, tg)).item<float>();
      if (stage == 0) run.losses.push_back(loss);
      pp->barrier("step done");  // the event logs' steps do not overlap
      run.events->add(stage, "step end");
    }
    std::lock_guard<std::mutex> lock(mu);
    if (rt) {
      for (const auto& p : rt->layers().module()->named_parameters())
        run.params[std::to_string(stage) + "/" + p.key()] = p.value().detach().clone();
    } else {  // the engine trains the model's own parameters: this stage's layers'
      for (int i = pipe->bounds()[stage]; i < pipe->bounds()[stage + 1]; ++i)
        for (const auto& p : all[i].module->named_parameters())
          run.params[all[i].name + "/" + p.key()] = p.value().detach().clone();
    }
  });
  return run;
}

// In stage 0's events of the second step: where micro-batch j's gradient receive was posted,
// counted in forwards begun before it.
std::vector<int> forwards_before_gradient_posts(const std::vector<std::string>& events) {
  size_t from = 0;
  for (size_t i = 0; i < events.size(); ++i)
    if (events[i] == "step end") {
      from = i + 1;
      break;
    }
  std::vector<int> out(kMicroBatches, -1);
  int forwards = 0;
  for (size_t i = from; i < events.size() && events[i] != "step end"; ++i) {
    if (events[i] == "forward embed") ++forwards;
    for (int j = 0; j < kMicroBatches; ++j)
      if (events[i].find("post pipeline stage 0 of 2: recv of micro-batch " + std::to_string(j) +
                         "'s gradient") == 0)
        out[j] = forwards;
  }
  return out;
}

TEST(PipelineEarlyReceives, GradientReceivesArePostedBeforeThePreviousForward) {
  const Trial early = train(true), late = train(false);
  // Stage 0 of 2, 1F1B, m = 4: F0 SA0 F1 SA1 RG0 B0 F2 SA2 RG1 B1 F3 SA3 RG2 B2 RG3 B3.
  // Without early receives micro-batch j's gradient receive is posted after forward j + 1 began
  // (j + 2 forwards, at most 4); with them before it (j + 1 forwards), RG3 over B2 only.
  EXPECT_EQ(forwards_before_gradient_posts(late.events->by_rank[0]),
            (std::vector<int>{2, 3, 4, 4}));
  EXPECT_EQ(forwards_before_gradient_posts(early.events->by_rank[0]),
            (std::vector<int>{1, 2, 3, 4}));
  // The same computation: the same bits.
  EXPECT_EQ(early.losses, late.losses);
  ASSERT_EQ(early.params.size(), late.params.size());
  for (const auto& [name, t] : early.params)
    EXPECT_TRUE(at::equal(t, late.params.at(name))) << name;
}

// zero-train's switch: the config key reaches the runtime. The engine clips and steps by its
// own optimizer, so its runs are compared with each other, not with the runtime's above.
TEST(PipelineEarlyReceives, ConfigKeySwitchesThemThroughTheEngine) {
  const auto config = [](const std::string& overlap) {
    return Config::from_string(
        "train_micro_batch_size_per_gpu: 2\ngradient_accumulation_steps: 4\n"
        "optimizer: {type: SGD, params: {lr: 0.1, momentum: 0.9}}\n"
        "pipeline: {stages: 2, schedule: 1f1b" +
            overlap + "}\n",
        "test.yaml");
  };
  const Config on = config(""), off = config(", overlap_p2p_comm: false");
  ASSERT_TRUE(overlap_p2p_comm(on));
  ASSERT_FALSE(overlap_p2p_comm(off));
  const Trial early = train(true, &on), late = train(false, &off);
  EXPECT_EQ(forwards_before_gradient_posts(late.events->by_rank[0]),
            (std::vector<int>{2, 3, 4, 4}));
  EXPECT_EQ(forwards_before_gradient_posts(early.events->by_rank[0]),
            (std::vector<int>{1, 2, 3, 4}));
  ASSERT_EQ(early.losses.size(), static_cast<size_t>(kSteps));
  EXPECT_EQ(early.losses, late.losses);
  ASSERT_FALSE(early.params.empty());
  ASSERT_EQ(early.params.size(), late.params.size());
  for (const auto& [name, t] : early.params)
    EXPECT_TRUE(at::equal(t, late.params.at(name))) << name;
}

}  // namespace
}  // namespace zero::pipeline
