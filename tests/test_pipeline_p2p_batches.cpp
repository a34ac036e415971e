// Point-to-point batching per schedule step (zero/pipeline/runtime/p2p_batches.hpp; Megatron's
// batch_isend_irecv, on NCCL one coalesced group):
//  - which operations of a step go together: a middle stage of 1F1B, written out by hand from
//    the rule (queue every send and receive, post the queue, one batch per group, when something
//    waits or computes);
//  - the device model finds a cycle written to have one, finds none in the runtime's unbatched
//    plans (the per-pair streams it ran on before), and says which schedules batch;
//  - a real run over gloo through a group that claims to coalesce (it records each batch and
//    posts its operations one by one): the runtime batches exactly as planned, in the first step
//    and a later one, and trains as one process does (losses, every parameter); over plain gloo
//    it batches nothing (gloo has no point-to-point coalescing: the path of before).
// The NCCL coalescing itself (comm/c10d_group.cpp, C10dGroup::batch_p2p) is compiled only: no
// GPU here.
#include <gtest/gtest.h>
#include <torch/optim/sgd.h>

#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "comm/p2p_batch.hpp"
#include "support/coalescing_group.hpp"
#include "support/pipeline_gpt.hpp"
#include "support/thread_group.hpp"
#include "support/tp_compare.hpp"
#include "zero/models/gpt.hpp"
#include "zero/models/gpt_layers.hpp"
#include "zero/pipeline/runtime/p2p_batches.hpp"
#include "zero/pipeline/runtime/runtime.hpp"

namespace zero::pipeline {
namespace {

// "SA0" for SendActivation(micro-batch 0), and so on.
std::string brief(const Instruction& ins) {
  const char* n = ins.op == Op::SendActivation   ? "SA"
                  : ins.op == Op::RecvActivation ? "RA"
                  : ins.op == Op::SendGrad       ? "SG"
                                                 : "RG";
  return n + std::to_string(ins.micro_batch);
}

std::vector<std::string> shown(const StagePlan& plan, const std::vector<Instruction>& list,
                               int step) {
  std::vector<std::string> out;
  for (const auto& b : plan.batches) {
    if (b.step != step) continue;
    std::string s = b.group == kUpGroup ? "up:" : "down:";
    if (b.collective) s += " loss";
    for (const auto& op : b.ops) s += " " + (op.meta ? "shape" : brief(list[op.index]));
    out.push_back(s);
  }
  return out;
}

TEST(PipelineP2PBatches, AMiddleStageOf1F1BSendsAndReceivesEachStepInOneBatch) {
  // Stage 1 of 3, 3 micro-batches:
  //  0 RA0  1 F0  2 SA0  3 RA1  4 F1  5 SA1  6 RG0  7 B0  8 SG0  9 RA2  10 F2  11 SA2
  //  12 RG1  13 B1  14 SG1  15 RG2  16 B2  17 SG2  18 R  19 O
  // Early receives (early_recvs.hpp): RG0 before 2, RA2 before 6, RG1 before 9.
  const Schedule s = make_schedule(ScheduleKind::OneFOneB, 3, 3);
  const auto& list = s.per_stage[1];
  ASSERT_EQ(list[6], (Instruction{Op::RecvGrad, 0, 0}));
  PlanOptions o;
  o.steps = 1;  // a later step: every shape known
  const auto plans = p2p_plan(s, o);
  // RA0 waited at once; at 3 the queue holds RG0 (posted early at 2), SA0 and RA1: the gradient
  // group's batch, then the activation group's; at 6 SA1 with RA2 (posted early at 6); at 9
  // SG0 with RG1; at 12 SA2 alone (RG2 is not early: SG1 is on its group before it); at 15 SG1
  // with RG2; at 18 (ReduceGrads) SG2; then the loss.
  EXPECT_EQ(shown(plans[1], list, 1),
            (std::vector<std::string>{"up: RA0", "down: RG0", "up: SA0 RA1", "up: SA1 RA2",
                                      "down: SG0 RG1", "up: SA2", "down: SG1 RG2", "down: SG2",
                                      "up: loss"}));
  // Unbatched: every operation alone, the same operations in the same order.
  o.batched = false;
  const auto alone = p2p_plan(s, o);
  size_t ops = 0;
  for (const auto& b : alone[1].batches) {
    EXPECT_LE(b.ops.size(), 1u);
    ops += b.ops.size();
  }
  EXPECT_EQ(ops, 12u);  // 3 of each of RA, SA, RG, SG
}

// Two stages that each wait for the other's message before computing what they send: stage 0
// posts its receive, waits, computes, sends; stage 1 the same the other way.
std::vector<StagePlan> crossed(bool wait_first) {
  std::vector<StagePlan> plans(2);
  for (int s = 0; s < 2; ++s) {
    StagePlan& p = plans[s];
    const int peer = 1 - s;
    p.batches.push_back({group_of(peer, s), {{false, peer, 0}}});
    p.batches.push_back({group_of(s, peer), {{true, peer, 1}}});
    p.items.push_back({PlanItem::Post, 0});
    if (wait_first) p.items.push_back({PlanItem::Wait, 0});
    p.items.push_back({PlanItem::Compute, -1});
    p.items.push_back({PlanItem::Post, 1});
    if (!wait_first) p.items.push_back({PlanItem::Wait, 0});
  }
  return plans;
}

TEST(PipelineP2PBatches, TheDeviceModelFindsACycle) {
  // Waiting before computing the send: neither send ever starts (the NCCL stream of a send
  // waits for the compute stream, which waits for the receive).
  const std::string stuck = device_deadlock(crossed(true), true);
  EXPECT_NE(stuck.find("stage 0 item 0 (post batch 0 of step 1: recv from 1"), std::string::npos)
      << stuck;
  EXPECT_NE(stuck.find("stage 1 item 0 (post batch 0 of step 1: recv from 0"), std::string::npos)
      << stuck;
  // Sending first: both finish.
  EXPECT_EQ(device_deadlock(crossed(false), true), "");
}

// What one stream per group adds: stage 1 posts a receive from stage 2 and, after a compute, a
// send to stage 0, both on the gradient group. On the pair streams the send starts at once; on
// the group's one stream it waits for the receive, whose message stage 2 sends only after stage
// 0's, which stage 0 sends only after stage 1's send arrived.
TEST(PipelineP2PBatches, TheDeviceModelSeesTheGroupsOneStream) {
  std::vector<StagePlan> plans(3);
  plans[0].batches = {{kDownGroup, {{false, 1, 0}}}, {kUpGroup, {{true, 2, 1}}}};
  plans[0].items = {
      {PlanItem::Post, 0}, {PlanItem::Wait, 0}, {PlanItem::Compute, -1}, {PlanItem::Post, 1}};
  plans[1].batches = {{kDownGroup, {{false, 2, 0}}}, {kDownGroup, {{true, 0, 1}}}};
  plans[1].items = {
      {PlanItem::Post, 0}, {PlanItem::Compute, -1}, {PlanItem::Post, 1}, {PlanItem::Wait, 0}};
  plans[2].batches = {{kUpGroup, {{false, 0, 0}}}, {kDownGroup, {{true, 1, 1}}}};
  plans[2].items = {
      {PlanItem::Post, 0}, {PlanItem::Wait, 0}, {PlanItem::Compute, -1}, {PlanItem::Post, 1}};
  EXPECT_EQ(device_deadlock(plans, /*batched=*/false), "");
  const std::string stuck = device_deadlock(plans, /*batched=*/true);
  EXPECT_NE(stuck.find("stage 1 item 0 (post batch 0"), std::string::npos) << stuck;
}

struct Verdict {
  ScheduleKind kind;
  int P, m, v;
  bool tied, early;
};

std::string name(const Verdict& c) {
  return std::string(schedule_name(c.kind)) + " P=" + std::to_string(c.P) +
         " m=" + std::to_string(c.m) + " v=" + std::to_string(c.v) + (c.tied ? " tied" : "") +
         (c.early ? " early" : "");
}

// Every schedule the engine builds, P 2..4, m up to 8, a tie between the first and the last
// stage or none, early receives or not: the unbatched plan (the runtime of before, one stream per
// pair) is free of cycles on the model, as it is in practice; so is the batched one, since the
// early receives never move over a message on their own group (early_recvs.hpp) and the tied
// gradient goes where the owner takes it (tied_grads.hpp): every built-in schedule batches.
TEST(PipelineP2PBatches, EveryBuiltInScheduleBatchesWithoutACycle) {
  std::vector<Verdict> cases;
  for (int P = 2; P <= 4; ++P)
    for (bool tied : {false, true})
      for (bool early : {false, true}) {
        for (int m = 1; m <= 8; ++m)
          for (auto kind : {ScheduleKind::GPipe, ScheduleKind::OneFOneB})
            cases.push_back({kind, P, m, 1, tied, early});
        for (int v = 2; v <= 3; ++v)
          for (int m : {P, 2 * P})
            cases.push_back({ScheduleKind::Interleaved, P, m, v, tied, early});
      }
  for (const auto& c : cases) {
    SCOPED_TRACE(name(c));
    const Schedule s = make_schedule(c.kind, c.P, c.m, c.v);
    PlanOptions o;
    o.early_receives = c.early;
    if (c.tied) o.ties = {{0, c.P - 1}};
    o.batched = false;
    EXPECT_EQ(device_deadlock(p2p_plan(s, o), false), "");
    o.batched = true;
    EXPECT_EQ(device_deadlock(p2p_plan(s, o), true), "");
    EXPECT_TRUE(batching_is_safe(s, o));
    // pipe_partitioned / grad_partitioned: the queue is posted before the first activation's
    // and gradient's check. With one micro-batch that splits the last stage's tied gradient
    // (queued after its only Backward) from its SendGrad into two batches on the gradient
    // group's one stream, the tied one first; the owner takes it only after its own gradient
    // came down the chain that SendGrad starts: a cycle, so such a run posts one by one.
    o.check_activations = o.check_grads = true;
    const bool safe = device_deadlock(p2p_plan(s, o), true).empty();
    EXPECT_EQ(batching_is_safe(s, o), safe);
    EXPECT_EQ(safe, !(c.tied && c.m == 1 && c.P > 2));
    o.batched = false;
    EXPECT_EQ(device_deadlock(p2p_plan(s, o), false), "");
  }
}

// ---- a real run over a group that claims to coalesce ------------------------------------------

struct Run {
  std::vector<float> losses;                 // stage 0's
  std::map<std::string, at::Tensor> params;  // by the model's names
  std::vector<bool> batched;                 // per stage: RuntimeOptions::batch_p2p took
};

// P stages of the example GPT (untied), SGD with momentum, 2 steps of m micro-batches.
Run train(ScheduleKind kind, int P, int m, bool coalescing,
          const std::shared_ptr<testing::BatchLog>& log, const testing::GptParams& init,
          const models::GptConfig& c, const std::vector<testing::StepBatch>& steps) {
  Run run;
  run.batched.assign(P, false);
  std::mutex mu;
  testing::run_ranks(P, [&](std::shared_ptr<comm::Group> g) {
    std::shared_ptr<comm::Group> pp = g;
    if (coalescing) pp = std::make_shared<testing::CoalescingGroup>(g, kUpGroup, log);
    const int stage = pp->rank();
    models::Gpt model(c);
    testing::load(model, init);
    StageLayers layers(models::gpt_pipeline_layers(model), PartitionMethod::Uniform, P, stage);
    std::set<const void*> mine;
    for (const auto& p : layers.parameters()) mine.insert(p.unsafeGetTensorImpl());
    auto opt = std::make_unique<TorchStageOptimizer>(std::make_unique<torch::optim::SGD>(
        layers.parameters(), torch::optim::SGDOptions(0.1).momentum(0.9)));
    PipelineRuntime rt(std::move(layers), models::gpt_loss, pp, std::move(opt), {kind, m});
    for (const auto& b : steps) {
      const float loss = rt.train_batch(b.inputs.chunk(m, 0), b.targets.chunk(m, 0)).item<float>();
      if (stage == 0) run.losses.push_back(loss);
    }
    std::lock_guard<std::mutex> lock(mu);
    run.batched[stage] = rt.batches_p2p();
    for (const auto& p : model->named_parameters())
      if (mine.count(p.value().unsafeGetTensorImpl()))
        run.params[p.key()] = p.value().detach().clone();
  });
  return run;
}

// The whole model in one process, the micro-batches accumulated (each loss / m), one SGD.
Run reference(const models::GptConfig& c, const testing::GptParams& init, int m,
              const std::vector<testing::StepBatch>& steps) {
  models::Gpt model(c);
  testing::load(model, init);
  torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  Run out;
  for (const auto& b : steps) {
    auto in = b.inputs.chunk(m, 0), tg = b.targets.chunk(m, 0);
    double loss = 0;
    for (int i = 0; i < m; ++i) {
      at::Tensor l = model->loss(in[i], tg[i]) / m;
      l.backward();
      loss += l.item<double>();
    }
    opt.step();
    opt.zero_grad();
    out.losses.push_back(static_cast<float>(loss));
  }
  out.params = testing::snapshot(model);
  return out;
}

void batched_run(ScheduleKind kind, int P, int m) {
  SCOPED_TRACE(std::string(schedule_name(kind)) + " P=" + std::to_string(P) +
               " m=" + std::to_string(m));
  const models::GptConfig c = testing::gpt_for_stages(P);
  at::manual_seed(21);
  const testing::GptParams init = testing::snapshot(models::Gpt(c));
  const auto steps = testing::step_batches(c.vocab, 2, 2 * m, 16, 7);
  const Run ref = reference(c, init, m, steps);
  auto log = std::make_shared<testing::BatchLog>();
  const Run batched = train(kind, P, m, true, log, init, c, steps);
  const Run plain = train(kind, P, m, false, nullptr, init, c, steps);
  const Schedule s = make_schedule(kind, P, m);
  const auto plans = p2p_plan(s, PlanOptions{});
  for (int stage = 0; stage < P; ++stage) {
    EXPECT_TRUE(batched.batched[stage]) << "stage " << stage;
    EXPECT_FALSE(plain.batched[stage]) << "stage " << stage << ": gloo batched";
    // Both steps' batches (the first step's shapes included), the loss's broadcast aside.
    std::vector<std::pair<int, std::vector<std::pair<bool, int>>>> planned;
    for (const auto& b : plans[stage].batches) {
      if (b.collective) continue;
      std::vector<std::pair<bool, int>> ops;
      for (const auto& op : b.ops) ops.emplace_back(op.send, op.peer);
      planned.emplace_back(b.group, ops);
    }
    EXPECT_EQ(log->batches[stage], planned) << "stage " << stage;
  }
  for (const Run* r : {&batched, &plain}) {
    ASSERT_EQ(r->losses.size(), ref.losses.size());
    for (size_t i = 0; i < ref.losses.size(); ++i)
      EXPECT_NEAR(r->losses[i], ref.losses[i], 1e-5 * std::abs(ref.losses[i])) << "step " << i;
    ASSERT_EQ(r->params.size(), ref.params.size());
    for (const auto& [key, t] : r->params)
      testing::expect_rel_close(t, ref.params.at(key), 1e-6, key);
  }
}

TEST(PipelineP2PBatches, TheRuntimeBatchesAsPlannedAndTrainsAsOneProcess) {
  batched_run(ScheduleKind::OneFOneB, 3, 4);  // early receives: a middle stage's SA + RA batches
  batched_run(ScheduleKind::GPipe, 3, 3);
  batched_run(ScheduleKind::OneFOneB, 2, 2);
}

}  // namespace
}  // namespace zero::pipeline
