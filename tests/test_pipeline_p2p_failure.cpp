// What a failed point-to-point batch leaves behind (review 2026-12-07b L1, L2; zero/pipeline/
// runtime/p2p_queue.hpp, runtime.hpp):
//  - the queue: a batch that throws loses nothing silently. Its operations and those of the
//    groups queued after it (not posted) get Works that throw when waited on, naming the
//    operation (a default Work would read as done), the flush's error names the group, the
//    batch and how much was not posted, and the queue refuses every later issue and flush;
//  - the runtime: a real 4-stage run over gloo through groups that claim to coalesce, where one
//    batch of stage 1 posts its first operation and throws (NCCL's partial batch). That step
//    fails on every stage (stage 1 at the throw, the others when their waits run out), and the
//    next train_batch refuses on every stage at once, naming why, instead of pairing its
//    messages with what the failed step left posted;
//  - unbatched on a device (the fake accelerator; review 2026-12-07a L5): a step that fails with
//    receives posted early makes every stage refuse the next one the same way.
#include <gtest/gtest.h>
#include <torch/optim/sgd.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "support/coalescing_group.hpp"
#include "support/fake_device.hpp"
#include "support/fake_group.hpp"
#include "support/pipeline_gpt.hpp"
#include "support/thread_group.hpp"
#include "zero/models/gpt.hpp"
#include "zero/models/gpt_layers.hpp"
#include "zero/pipeline/runtime/p2p_batches.hpp"
#include "zero/pipeline/runtime/p2p_queue.hpp"
#include "zero/pipeline/runtime/runtime.hpp"

namespace zero::pipeline {
namespace {

using testing::CoalescingGroup;

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

bool has(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

TEST(PipelineP2PFailure, AFailedBatchLosesNothingSilently) {
  auto log = std::make_shared<testing::BatchLog>();
  // Group A's first batch posts one operation, then throws; group B never fails.
  CoalescingGroup a(std::make_shared<testing::FakeGroup>(0, 2, "A"), 0, log,
                    [](int, int, int, size_t) { return 1; });
  CoalescingGroup b(std::make_shared<testing::FakeGroup>(0, 2, "B"), 5, log);
  P2PQueue q(/*batched=*/true);
  at::Tensor t = at::ones({4});
  comm::Work w[3];
  q.issue(a, true, t, 1, "send 0 on A", &w[0]);
  q.issue(b, false, t, 1, "recv 1 on B", &w[1]);
  q.issue(a, false, t, 1, "recv 2 on A", &w[2]);
  EXPECT_EQ(q.queued_receives(), 2u);
  const std::string e = error_of([&] { q.flush(); });
  EXPECT_TRUE(has(e, "a batch of 2 point-to-point operation(s) on group A")) << e;
  EXPECT_TRUE(has(e, "(the first: send 0 on A)")) << e;
  EXPECT_TRUE(has(e, "injected: the batch failed after 1 of its 2 operations")) << e;
  EXPECT_TRUE(has(e, "3 queued operation(s) on 2 group(s) were not posted or not all")) << e;
  EXPECT_TRUE(log->batches.empty()) << "B's batch was posted after A's threw";
  for (int i = 0; i < 3; ++i) {
    const std::string name = i == 0 ? "send 0 on A" : i == 1 ? "recv 1 on B" : "recv 2 on A";
    const std::string waited = error_of([&] { w[i].wait(); });
    EXPECT_TRUE(has(waited, name + ": its batch failed or was not posted")) << waited;
  }
  EXPECT_EQ(q.failure(), e);
  comm::Work later;
  EXPECT_TRUE(has(error_of([&] { q.issue(b, true, t, 1, "send 3 on B", &later); }),
                  "send 3 on B: not posted, an earlier batch failed: a batch of 2"));
  EXPECT_TRUE(has(error_of([&] { q.flush(); }), "an earlier batch failed"));
  q.clear();
  EXPECT_FALSE(q.failure().empty()) << "clear() forgot the failure";
}

struct Outcome {
  std::vector<std::string> failed, refused;  // per stage: step 2's error, step 3's
  std::vector<double> refused_s;             // per stage: how long step 3 took to refuse
  std::vector<float> first_loss;
  std::vector<int> batched;  // per stage: rt.batches_p2p()
};

// P stages of the example GPT, 1F1B over m micro-batches, SGD; 3 steps, the second of which
// `arm` makes fail (called on each stage after step 1): step 1 trains, steps 2 and 3 are caught.
// `pp` wraps each rank's gloo group (a coalescing claim); `device`: each rank on its own fake
// device. Waits run out after `timeout`.
Outcome fail_step_two(
    int P, int m,
    const std::function<std::shared_ptr<comm::Group>(std::shared_ptr<comm::Group>)>& pp_of,
    bool device, const std::function<void(int stage)>& arm,
    const std::function<void(int stage)>& before_loss, std::chrono::milliseconds timeout) {
  const models::GptConfig c = testing::gpt_for_stages(P);
  at::manual_seed(21);
  const testing::GptParams init = testing::snapshot(models::Gpt(c));
  const auto steps = testing::step_batches(c.vocab, 3, 2 * m, 16, 7);
  Outcome out{std::vector<std::string>(P), std::vector<std::string>(P), std::vector<double>(P, -1),
              std::vector<float>(P, NAN), std::vector<int>(P, 0)};
  testing::run_ranks(
      P,
      [&](std::shared_ptr<comm::Group> g) {
        auto pp = pp_of(g);
        const int stage = pp->rank();
        const c10::Device dev = device ? testing::fake::device(stage) : c10::kCPU;
        models::Gpt model(c);
        testing::load(model, init);
        model->to(dev);
        StageLayers layers(models::gpt_pipeline_layers(model), PartitionMethod::Uniform, P, stage);
        auto opt = std::make_unique<TorchStageOptimizer>(std::make_unique<torch::optim::SGD>(
            layers.parameters(), torch::optim::SGDOptions(0.1)));
        LossFn loss = [&](const at::Tensor& y, const at::Tensor& t) {
          before_loss(stage);
          return models::gpt_loss(y, t);
        };
        PipelineRuntime rt(std::move(layers), loss, pp, std::move(opt),
                           {ScheduleKind::OneFOneB, m});
        out.batched[stage] = rt.batches_p2p();
        auto step = [&](int i) {
          std::vector<at::Tensor> in, tg;
          for (const auto& t : steps[i].inputs.chunk(m, 0)) in.push_back(t.to(dev));
          for (const auto& t : steps[i].targets.chunk(m, 0)) tg.push_back(t.to(dev));
          return rt.train_batch(in, tg);
        };
        out.first_loss[stage] = step(0).item<float>();
        arm(stage);
        out.failed[stage] = error_of([&] { step(1); });
        const auto start = std::chrono::steady_clock::now();
        out.refused[stage] = error_of([&] { step(2); });
        out.refused_s[stage] =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      },
      timeout, device ? testing::fake::device().type() : c10::DeviceType::CPU);
  return out;
}

// Every stage failed step 2 and refused step 3 at once, saying `why` and that it cannot go on.
void expect_refused(const Outcome& o, const std::string& why) {
  for (size_t s = 0; s < o.failed.size(); ++s) {
    SCOPED_TRACE("stage " + std::to_string(s));
    EXPECT_TRUE(std::isfinite(o.first_loss[s])) << "step 1 trained";
    EXPECT_FALSE(o.failed[s].empty()) << "step 2 went through";
    EXPECT_TRUE(has(o.refused[s], "pipeline stage " + std::to_string(s) + " of " +
                                      std::to_string(o.failed.size()) +
                                      ": train_batch (step 2) failed " + why))
        << o.refused[s];
    EXPECT_TRUE(has(o.refused[s], "This pipeline cannot train any more: restart the job"))
        << o.refused[s];
    // At once: without the refusal the step would post its messages and wait (each wait runs
    // out only after the timeout, 3 s), or pair them with what step 2 left posted.
    EXPECT_LT(o.refused_s[s], 1.0);
    std::printf("  stage %zu: step 2 failed (%.70s...), step 3 refused in %.1e s\n", s,
                o.failed[s].c_str(), o.refused_s[s]);
  }
}

// Stage 1's first batch of two or more operations in step 2 posts one and throws.
TEST(PipelineP2PFailure, AfterAFailedBatchEveryStageRefusesTheNextStep) {
  constexpr int P = 4, kThrower = 1;
  std::atomic<bool> armed{false}, fired{false};
  auto fault = [&](int, int rank, int, size_t ops) {
    if (rank != kThrower || !armed || ops < 2 || fired.exchange(true)) return -1;
    return 1;
  };
  const Outcome o = fail_step_two(
      P, 4,
      [&](std::shared_ptr<comm::Group> g) {
        return std::make_shared<CoalescingGroup>(g, kUpGroup, nullptr, fault);
      },
      /*device=*/false,
      [&](int stage) {
        if (stage == kThrower) armed = true;
      },
      [](int) {}, std::chrono::seconds(3));
  EXPECT_TRUE(fired) << "no batch of two operations on stage 1 in step 2";
  for (int s = 0; s < P; ++s) EXPECT_TRUE(o.batched[s]) << "stage " << s;
  EXPECT_TRUE(has(o.failed[kThrower], "injected: the batch failed after 1 of its"))
      << o.failed[kThrower];
  EXPECT_TRUE(has(o.refused[kThrower], "injected")) << "the refusal names the batch";
  expect_refused(o, "in a run whose point-to-point messages travel in coalesced batches");
}

// Unbatched, 2 stages on the fake device: the last stage's loss throws at its `call`-th loss
// of step 2 (micro-batch call - 1); every stage must refuse step 3.
constexpr int kLossStages = 2;
Outcome loss_fails_on_the_last_stage(int call) {
  std::atomic<bool> armed{false};
  std::atomic<int> calls{0};
  const Outcome o = fail_step_two(
      kLossStages, 4, [](std::shared_ptr<comm::Group> g) { return g; }, /*device=*/true,
      [&](int stage) {
        if (stage == kLossStages - 1) armed = true;
      },
      [&](int stage) {
        if (stage == kLossStages - 1 && armed && ++calls == call)
          throw std::runtime_error("injected: the loss failed");
      },
      std::chrono::seconds(3));
  for (int s = 0; s < kLossStages; ++s) EXPECT_FALSE(o.batched[s]) << "stage " << s;
  EXPECT_TRUE(has(o.failed[kLossStages - 1], "injected: the loss failed"))
      << o.failed[kLossStages - 1];
  expect_refused(o, "after this step posted ");
  return o;
}

// Review 2026-12-07a L5: at micro-batch 1 its gradient of micro-batch 0 is not known delivered
// (and its neighbour's wait runs out with its own operations posted); on NCCL what is left
// posted would pair with step 3's messages.
TEST(PipelineP2PFailure, AStepThatFailsWithReceivesPostedOnADeviceStopsEveryStage) {
  const Outcome o = loss_fails_on_the_last_stage(2);
  for (int s = 0; s < kLossStages; ++s)
    EXPECT_TRUE(has(o.refused[s], "send(s) not known complete)")) << o.refused[s];
}

// Review 2026-12-07c M1: at micro-batch 0 the last stage has received that micro-batch and
// holds nothing posted, but it did post in this step, and on NCCL its neighbour would go on
// posting step 2's messages, which a retried step there would pair with its own first ones.
TEST(PipelineP2PFailure, AStepThatPostedAnythingOnADeviceStopsEveryStageWhenItFails) {
  loss_fails_on_the_last_stage(1);
}

}  // namespace
}  // namespace zero::pipeline
