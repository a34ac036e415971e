// The bytes the tensor-parallel example GPT (models::TpGpt) hands its tensor-parallel group in
// one training step, counted at the group (comm::CountingGroup around each rank's gloo group),
// against the planner's accounting (zero::tp_collectives, include/zero/parallel_plan.hpp:
// Megatron-LM's 2 all-reduces of b·s·h per block in forward and 2 in backward, or under sequence
// parallelism 2 all-gathers + 2 reduce-scatters each way, plus the embedding's, the head's, the
// vocabulary-parallel loss's and the norms' gradients). Calls, input bytes and bytes sent, per
// kind of collective, must be equal: a collective too many (a projection entering its region on
// its own) or too few shows as a difference of whole calls.
//   - T = 2 and 4, with and without sequence parallelism, tied and untied head, with and without
//     activation checkpointing (the re-run forward's collectives), fp32 and bf16;
//   - T = 2 x D = 2 through the ZeRO engine (stage 1, two micro-batches per step): the
//     tensor-parallel group carries only the model's collectives, the data-parallel group the
//     engine's.
#include <gtest/gtest.h>

#include <cstdio>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "comm/counting_group.hpp"
#include "support/thread_group.hpp"
#include "support/token_batch.hpp"
#include "tp_trainer.hpp"
#include "zero/engine.hpp"
#include "zero/models/tp_gpt.hpp"
#include "zero/parallel_plan.hpp"
#include "zero/tensor_parallel.hpp"

namespace zero::testing {
namespace {

constexpr int64_t kBatch = 2, kSeq = 16;

PlanInput plan_for(const models::GptConfig& c, int tp, bool sp, int param_bytes,
                   int64_t micro_batch, int64_t accumulation) {
  PlanInput in;
  in.shape = {c.layers, c.dim, c.heads, c.ffn_dim(), c.vocab, c.tied, c.kv_heads};
  in.num_params = in.shape.num_params();
  in.world_size = tp;
  in.tensor_parallel = tp;
  in.sequence_parallel = sp;
  in.micro_batch = micro_batch;
  in.seq_len = kSeq;
  in.param_bytes = param_bytes;
  in.accumulation = accumulation;
  return in;
}

// Measured (one rank's CountingGroup) against the formula, kind by kind.
void expect_counts_equal(const comm::CountingGroup& group, const TpCommStep& want,
                         const std::string& label, bool print) {
  const auto counts = group.counts();
  auto got = [&](const char* op) {
    auto it = counts.find(op);
    return it == counts.end() ? comm::CountingGroup::Count{} : it->second;
  };
  for (const auto& [op, w] :
       {std::pair{"all_reduce", want.all_reduce}, std::pair{"all_gather", want.all_gather},
        std::pair{"reduce_scatter", want.reduce_scatter}}) {
    const auto g = got(op);
    EXPECT_EQ(g.calls, w.calls) << label << ": " << op << " calls";
    EXPECT_EQ(g.payload, w.payload) << label << ": " << op << " input bytes";
    EXPECT_EQ(g.sent, w.sent) << label << ": " << op << " bytes sent";
    if (print) {
      std::printf("  %-40s %-14s calls %3lld/%-3lld sent %7lld / formula %7lld bytes\n",
                  label.c_str(), op, (long long)g.calls, (long long)w.calls, (long long)g.sent,
                  (long long)w.sent);
    }
  }
  // Nothing else went through the tensor-parallel group.
  EXPECT_EQ(counts.size(),
            static_cast<size_t>((want.all_reduce.calls > 0) + (want.all_gather.calls > 0) +
                                (want.reduce_scatter.calls > 0)))
      << label;
}

struct Case {
  int tp;
  bool sp, tied, checkpoint;
  at::ScalarType dtype;
};

class TpCommPerStep : public ::testing::TestWithParam<Case> {};

TEST_P(TpCommPerStep, MeasuredEqualsTheFormula) {
  const Case c = GetParam();
  models::GptConfig cfg = tiny_gpt(kSeq);
  cfg.tied = c.tied;
  run_ranks(c.tp, [&](std::shared_ptr<comm::Group> g) {
    auto counted = std::make_shared<comm::CountingGroup>(g);
    models::TpGpt model(counted, cfg, c.sp);
    model->to(c.dtype);
    if (c.checkpoint) model->checkpointing.enabled = true;
    const TokenBatch b = token_batch(7, kBatch, kSeq, cfg.vocab);
    // One step of one micro-batch: forward, backward, and under SP the norms' gradients.
    at::Tensor loss = model->loss(b.tokens, b.targets);
    loss.backward();
    tensor_parallel::all_reduce_partial_grads(model->placements(), *counted);
    const PlanInput in =
        plan_for(cfg, c.tp, c.sp, static_cast<int>(c10::elementSize(c.dtype)), kBatch, 1);
    const Recompute r = c.checkpoint ? Recompute::kCheckpoint : Recompute::kNone;
    expect_counts_equal(*counted, tp_comm_per_step(in, r, 0),
                        ::testing::UnitTest::GetInstance()->current_test_info()->name(),
                        g->rank() == 0);
    // Megatron's per-block volume is the bulk of it: 4 all-reduces of b·s·h (8 (T-1)/T b·s·h
    // elements sent) per block, 6 when the forward re-runs.
    const int64_t bsh = kBatch * kSeq * cfg.dim * static_cast<int64_t>(c10::elementSize(c.dtype));
    const int64_t per_block = (c.checkpoint ? 6 : 4) * 2 * bsh * (c.tp - 1) / c.tp;
    EXPECT_GT(counted->sent_bytes(), cfg.layers * per_block);
    EXPECT_LT(counted->sent_bytes(), (cfg.layers + 2) * per_block);
  });
}

INSTANTIATE_TEST_SUITE_P(Layouts, TpCommPerStep,
                         ::testing::Values(Case{2, false, true, false, at::kFloat},
                                           Case{2, true, true, false, at::kFloat},
                                           Case{4, false, true, false, at::kFloat},
                                           Case{4, true, true, false, at::kFloat},
                                           Case{2, false, false, false, at::kFloat},
                                           Case{4, true, false, false, at::kFloat},
                                           Case{2, false, true, true, at::kFloat},
                                           Case{2, true, false, true, at::kFloat},
                                           Case{2, true, true, false, at::kBFloat16}),
                         [](const auto& info) {
                           const Case& c = info.param;
                           return "T" + std::to_string(c.tp) + (c.sp ? "_sequence_parallel" : "") +
                                  (c.tied ? "_tied" : "_untied") +
                                  (c.checkpoint ? "_checkpointed" : "") +
                                  (c.dtype == at::kBFloat16 ? "_bf16" : "");
                         });

// The input checks off (zero-train's setting, set_check_inputs(false): its datasets checked every
// token when they opened): the embedding's and the loss's all-gathers of the id ranges are gone,
// each a collective and a host read per micro-batch, and nothing else changes, loss included.
TEST(TpCommPerStep, UncheckedInputsDropTheTwoCheckGathers) {
  for (const bool sp : {false, true}) {
    const models::GptConfig cfg = tiny_gpt(kSeq);
    run_ranks(2, [&](std::shared_ptr<comm::Group> g) {
      const TokenBatch b = token_batch(7, kBatch, kSeq, cfg.vocab);
      double losses[2];
      for (const bool check : {true, false}) {
        auto counted = std::make_shared<comm::CountingGroup>(g);
        models::TpGpt model(counted, cfg, sp);
        model->set_check_inputs(check);
        at::Tensor loss = model->loss(b.tokens, b.targets);
        loss.backward();
        losses[check] = loss.item<double>();
        const PlanInput in = plan_for(cfg, 2, sp, 4, kBatch, 1);
        const TpCommStep want = tp_comm_per_step(in, Recompute::kNone, 0);
        const auto counts = counted->counts();
        const auto gathers = counts.at("all_gather");
        int64_t check_calls = 0, check_bytes = 0;
        for (const TpCollective& c : tp_collectives(in, Recompute::kNone, 0)) {
          if (std::string(c.what).find("check") == std::string::npos) continue;
          check_calls += c.calls;
          check_bytes += c.calls * c.bytes;
        }
        ASSERT_EQ(check_calls, 2);
        EXPECT_EQ(gathers.calls, want.all_gather.calls - (check ? 0 : check_calls))
            << (check ? "checked" : "unchecked") << (sp ? ", sequence parallel" : "");
        EXPECT_EQ(gathers.payload, want.all_gather.payload - (check ? 0 : check_bytes));
        if (g->rank() == 0) {
          std::printf("  %s%s: all_gather calls per micro-batch %lld (formula with checks %lld)\n",
                      check ? "checked" : "unchecked", sp ? ", SP" : "", (long long)gathers.calls,
                      (long long)want.all_gather.calls);
        }
      }
      EXPECT_EQ(losses[0], losses[1]);
    });
  }
}

// 2D through the engine: the tensor-parallel group carries the model's collectives of both
// micro-batches and nothing of the engine's (its gradients reduce over the data-parallel group).
TEST(TpCommEngine, T2xD2StepSendsTheFormulaOnTheTensorParallelGroup) {
  const models::GptConfig cfg = tiny_gpt(kSeq);
  Config zc;
  zc.zero_optimization.stage = 1;
  zc.train_micro_batch_size_per_gpu = 1;
  zc.gradient_accumulation_steps = 2;
  zc.gradient_clipping = 0;
  zc.optimizer.type = "SGD";
  zc.optimizer.lr = 0.1;
  run_ranks(4, [&](std::shared_ptr<comm::Group> g) {
    auto world = std::make_shared<comm::CountingGroup>(g);
    const auto groups = tensor_parallel::make_groups(world, 2);
    auto tp = std::dynamic_pointer_cast<comm::CountingGroup>(comm::of(groups.tp));
    ASSERT_TRUE(tp) << "the tensor-parallel group is a split of the counted world";
    models::TpGpt model(groups.tp, cfg);
    // No norm groups: clipping is off here, and only the traffic is counted.
    Engine engine = initialize(model.ptr(), zc, Groups{groups.dp});
    tp->reset();  // what initialize did (nothing over tp, but only the step counts)
    const TokenBatch b = token_batch(11, 4, kSeq, cfg.vocab);
    const int64_t first = groups.dp_rank() * 2;
    for (int micro = 0; micro < 2; ++micro) {
      at::Tensor loss =
          model->loss(b.tokens.narrow(0, first + micro, 1), b.targets.narrow(0, first + micro, 1));
      engine.backward(loss);
      engine.step();
    }
    expect_counts_equal(*tp,
                        tp_comm_per_step(plan_for(cfg, 2, false, 4, 1, 2), Recompute::kNone, 0),
                        "T 2 x D 2, engine, 2 micro-batches", world->rank() == 0);
  });
}

// Sequence parallelism through the engine (T 2 x D 2, two micro-batches per step): the norms'
// partial gradients cross the tensor-parallel group in one all-reduce per step, after the
// data-parallel reduction, as Megatron's finalize_model_grads does, not one per parameter and
// micro-batch (10 per step here: 5 norms x 2 micro-batches). The tensor-parallel group's calls
// per step are the formula's, which has one for them; their bytes are the norms' once: each
// rank's under ZeRO 0 (every rank holds the whole gradient), summed over the data-parallel ranks
// under ZeRO 1/2 (each sends the pieces in its own gradient shard).
class TpCommEngineSequenceParallel : public ::testing::TestWithParam<int> {};

TEST_P(TpCommEngineSequenceParallel, PartialGradientsOneAllReducePerStep) {
  const int stage = GetParam();
  const models::GptConfig cfg = tiny_gpt(kSeq);
  Config zc;
  zc.zero_optimization.stage = stage;
  zc.train_micro_batch_size_per_gpu = 1;
  zc.gradient_accumulation_steps = 2;
  zc.gradient_clipping = 0;
  zc.optimizer.type = "SGD";
  zc.optimizer.lr = 0.1;
  const PlanInput in = plan_for(cfg, 2, /*sp=*/true, 4, 1, 2);
  TpCommStep want = tp_comm_per_step(in, Recompute::kNone, 0);
  // The engine's own on tp: the global gradient norm's square summed over the norm group (one
  // fp32 number, sent 2 x 4 x (T - 1) / T bytes), every step.
  want.all_reduce.calls += 1;
  want.all_reduce.payload += 4;
  want.all_reduce.sent += 4;
  int64_t step_sent = 0, step_calls = 0;  // the formula's per-step collective
  for (const TpCollective& c : tp_collectives(in, Recompute::kNone, 0)) {
    if (c.phase != TpCollective::Phase::kStep) continue;
    step_sent += sent_bytes(c, 2) * c.calls;
    step_calls += c.calls;
  }
  ASSERT_EQ(step_calls, 1);
  constexpr int kSteps = 2;
  std::vector<std::vector<int64_t>> partial_sent(kSteps, std::vector<int64_t>(4));
  run_ranks(4, [&](std::shared_ptr<comm::Group> g) {
    auto world = std::make_shared<comm::CountingGroup>(g);
    const auto groups = tensor_parallel::make_groups(world, 2);
    auto tp = std::dynamic_pointer_cast<comm::CountingGroup>(comm::of(groups.tp));
    ASSERT_TRUE(tp);
    models::TpGpt model(groups.tp, cfg, /*sequence_parallel=*/true);
    Engine engine =
        initialize(model.ptr(), zc, examples::engine_groups(groups, model->placements()));
    const TokenBatch b = token_batch(11, 4, kSeq, cfg.vocab);
    const int64_t first = groups.dp_rank() * 2;
    for (int step = 0; step < kSteps; ++step) {
      tp->reset();
      for (int micro = 0; micro < 2; ++micro) {
        at::Tensor loss = model->loss(b.tokens.narrow(0, first + micro, 1),
                                      b.targets.narrow(0, first + micro, 1));
        engine.backward(loss);
        engine.step();
      }
      const std::string label =
          "SP T 2 x D 2, stage " + std::to_string(stage) + ", step " + std::to_string(step);
      const auto counts = tp->counts();
      partial_sent[step][world->rank()] = tp->sent_bytes("partial (sequence-parallel) gradients");
      // Under ZeRO 1/2 a dp rank whose gradient shard holds none of the norms' pieces has none to
      // send (its tp peers, at the same dp rank, neither): one call fewer.
      TpCommStep want_here = want;
      if (stage > 0 && partial_sent[step][world->rank()] == 0) want_here.all_reduce.calls -= 1;
      for (const auto& [op, w] : {std::pair{"all_reduce", want_here.all_reduce},
                                  std::pair{"all_gather", want.all_gather},
                                  std::pair{"reduce_scatter", want.reduce_scatter}}) {
        const auto it = counts.find(op);
        EXPECT_EQ(it == counts.end() ? 0 : it->second.calls, w.calls) << label << ": " << op;
        if (world->rank() == 0) {
          std::printf("  %-32s %-14s calls %3lld, formula %3lld\n", label.c_str(), op,
                      (long long)(it == counts.end() ? 0 : it->second.calls), (long long)w.calls);
        }
      }
      // Whole gradients at stage 0: the bytes too are the formula's, kind by kind.
      if (stage == 0) expect_counts_equal(*tp, want, label, world->rank() == 0);
    }
  });
  for (int step = 0; step < kSteps; ++step) {
    const auto& sent = partial_sent[step];
    // World rank = tp rank + 2 x dp rank: tp rank t's data-parallel ranks are t and t + 2.
    for (int t = 0; t < 2; ++t) {
      if (stage == 0) {
        EXPECT_EQ(sent[t], step_sent) << "step " << step << ", tp rank " << t;
        EXPECT_EQ(sent[t + 2], step_sent) << "step " << step << ", tp rank " << t;
      } else {
        EXPECT_EQ(sent[t] + sent[t + 2], step_sent) << "step " << step << ", tp rank " << t;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Stages, TpCommEngineSequenceParallel, ::testing::Values(0, 1, 2),
                         [](const auto& info) { return "stage" + std::to_string(info.param); });

}  // namespace
}  // namespace zero::testing
