// ZeRO stage 3 with the root sharded too (issue 33): the example GPT marks its embedding, each
// block, the final norm and an untied head (models/gpt.cpp), so that with
// stage3_param_persistence_threshold 0 nothing stays whole on a rank; a tied head runs the
// embedding's unit a second time, at the end of forward, and its weight's two gradients meet in
// one accumulator before the unit is reduced and released.
//   - Training on 2 and 4 real gloo ranks (threads) against the same GPT trained in one process
//     on the concatenated batch with torch's SGD / AdamW and clip_grad_norm_, and against stage 2
//     (the root whole) on the same config: tied and untied heads, accumulation, clipping, the
//     norms sharded (threshold 0) or whole (threshold dim).
//   - Memory on 4 fake accelerators (tests/support/fake_device.hpp, exact per rank): what a rank
//     holds after initialize and between steps is the engine's declared model states (16Ψ/N for
//     fp32 AdamW, padding and bucket buffers) plus the model's declared buffers, with no
//     parameter held whole; a quarter of the parameters per rank.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "support/fake_device.hpp"
#include "support/thread_group.hpp"
#include "support/tiny_net.hpp"
#include "support/token_batch.hpp"
#include "zero/engine.hpp"
#include "zero/memory.hpp"
#include "zero/models/gpt.hpp"

namespace zero::testing {
namespace {

constexpr int64_t kSeq = 8;
constexpr int64_t kGlobalRows = 8;
constexpr int kSteps = 3;

models::GptConfig shape(bool tied) {
  models::GptConfig c = tiny_gpt(kSeq);
  c.vocab = 96;
  c.tied = tied;
  return c;
}

TokenBatch global_tokens(int step, int64_t vocab) {
  return token_batch(900 + step, kGlobalRows, kSeq, vocab);
}

struct Case {
  int world;
  bool sgd;
  int accumulation;
  double clip;
  bool tied;
  int64_t persistence = 0;  // dim: the norms stay whole in the root
};

std::string name_of(const ::testing::TestParamInfo<Case>& info) {
  const Case& c = info.param;
  return "world" + std::to_string(c.world) + (c.sgd ? "_sgd" : "_adamw") + "_ga" +
         std::to_string(c.accumulation) + (c.clip > 0 ? "_clip" : "") +
         (c.tied ? "_tied" : "_untied") + (c.persistence > 0 ? "_normswhole" : "");
}

Config case_config(const Case& c, int stage = 3) {
  Config cfg =
      test_config(stage, kGlobalRows / (c.world * c.accumulation), c.accumulation, c.clip, 512);
  if (c.sgd) {
    cfg.optimizer.type = "SGD";
    cfg.optimizer.lr = 0.1;
    cfg.optimizer.momentum = 0.9;
    cfg.optimizer.weight_decay = 0.01;
  } else {
    cfg.optimizer.lr = 3e-3;
  }
  cfg.zero_optimization.stage3.param_persistence_threshold = c.persistence;
  return cfg;
}

using Weights = std::map<std::string, at::Tensor>;

// The starting weights, drawn once in the main thread (the Gpt constructor draws from the global
// generator, which rank threads would race for); norms off 1 so that their gradients matter.
Weights initial_weights(bool tied) {
  at::manual_seed(33);
  models::Gpt gpt(shape(tied));
  Weights w;
  at::Generator gen = at::detail::createCPUGenerator(33);
  at::NoGradGuard g;
  for (const auto& p : gpt->named_parameters()) {
    at::Tensor v = p.value().detach().clone();
    if (p.key().find("norm") != std::string::npos) v.copy_(1 + 0.1 * at::randn(v.sizes(), gen));
    w[p.key()] = v;
  }
  return w;
}

std::shared_ptr<models::GptImpl> build(bool tied, const Weights& w) {
  static std::mutex mu;
  std::shared_ptr<models::GptImpl> gpt;
  {
    std::lock_guard<std::mutex> lock(mu);
    gpt = std::make_shared<models::GptImpl>(shape(tied));
  }
  at::NoGradGuard g;
  for (auto& p : gpt->named_parameters()) p.value().copy_(w.at(p.key()));
  return gpt;
}

// Flattened in named_parameters() order from name -> tensor.
at::Tensor flat_of(const models::GptImpl& order, const Weights& w) {
  std::vector<at::Tensor> parts;
  for (const auto& p : order.named_parameters()) parts.push_back(w.at(p.key()).reshape({-1}));
  return at::cat(parts).to(at::kFloat);
}

double max_rel(const at::Tensor& a, const at::Tensor& ref) {
  return ((a - ref).abs().max() / ref.abs().max()).item<double>();
}

// Trains on c.world ranks at `stage`; every rank's parameters after kSteps (state_dict: the
// fp32 masters), flattened in named_parameters() order. At stage 3 also checks what each
// module holds between micro-steps.
std::vector<at::Tensor> train(const Case& c, int stage, const Weights& init) {
  const Config cfg = case_config(c, stage);
  const models::GptConfig s = shape(c.tied);
  std::mutex mu;
  std::vector<at::Tensor> got(c.world);
  run_ranks(c.world, [&](std::shared_ptr<comm::Group> group) {
    auto gpt = build(c.tied, init);
    auto engine = initialize(gpt, cfg, group);
    const int r = group->rank();
    const int64_t rows = kGlobalRows / (c.world * c.accumulation);
    for (int step = 0; step < kSteps; ++step) {
      const TokenBatch g = global_tokens(step, s.vocab);
      for (int m = 0; m < c.accumulation; ++m) {
        const int64_t first = (static_cast<int64_t>(m) * c.world + r) * rows;
        engine.backward(
            gpt->loss(g.tokens.narrow(0, first, rows), g.targets.narrow(0, first, rows)));
        EXPECT_EQ(engine.step(), m == c.accumulation - 1);
        if (stage != 3) continue;
        // Between micro-steps nothing but the persistent norms is held whole.
        EXPECT_EQ(gpt->embed->weight.numel(), 0) << "step " << step;
        if (gpt->head) EXPECT_EQ(gpt->head->weight.numel(), 0) << "step " << step;
        EXPECT_EQ(gpt->norm->weight.numel(), c.persistence >= s.dim ? s.dim : 0);
        const auto& block = *(*gpt->blocks)[0]->as<models::BlockImpl>();
        EXPECT_EQ(block.wq->weight.numel(), 0);
        EXPECT_EQ(block.attn_norm->weight.numel(), c.persistence >= s.dim ? s.dim : 0);
      }
    }
    Weights w;
    for (const auto& [name, t] : engine.state_dict()) w[name] = t;
    // One entry per tensor: the tied head has no name of its own.
    EXPECT_EQ(w.size(), gpt->named_parameters().size());
    const at::Tensor flat = flat_of(*gpt, w);
    std::lock_guard<std::mutex> lock(mu);
    got[r] = flat;
  });
  return got;
}

class Stage3Root : public ::testing::TestWithParam<Case> {};

TEST_P(Stage3Root, MatchesSingleProcessTraining) {
  const Case c = GetParam();
  const Config cfg = case_config(c);
  const Weights init = initial_weights(c.tied);
  const models::GptConfig s = shape(c.tied);

  auto ref_net = build(c.tied, init);
  const ReferenceResult ref = train_reference(cfg, kSteps, *ref_net, [&](int step) {
    const TokenBatch b = global_tokens(step, s.vocab);
    return ref_net->loss(b.tokens, b.targets);
  });
  const std::vector<at::Tensor> s3 = train(c, 3, init);
  ASSERT_FALSE(HasFailure());
  const std::vector<at::Tensor> s2 = train(c, 2, init);
  ASSERT_FALSE(HasFailure());
  for (int r = 0; r < c.world; ++r) {
    ASSERT_EQ(s3[r].numel(), ref.params.numel());
    const double d3 = max_rel(s3[r], ref.params), d2 = max_rel(s2[r], ref.params);
    const double d32 = max_rel(s3[r], s2[r]);
    std::fprintf(stderr,
                 "%s rank %d: max rel diff vs single-process training %.3g (stage 2: %.3g), "
                 "vs stage 2 %.3g\n",
                 name_of({c, 0}).c_str(), r, d3, d2, d32);
    // Stage 3 computes what stage 2 computes, the root sharded or not.
    EXPECT_LT(d32, 1e-6) << "rank " << r;
    if (c.sgd) {
      EXPECT_LT(d3, 1e-6) << "rank " << r << " (stage 2: " << d2 << ")";
    } else {
      // AdamW divides each gradient element by its own RMS, so an element that is a near-zero
      // sum (where the N ranks' partial sums round differently from one process's) moves by a
      // visible part of a step: measured 1.5e-6 .. 2.2e-5 here against the single process, as
      // much as stage 2 (test_tensor_parallel_gpt_training's kAdamL2Tol note). Held to stage 2.
      EXPECT_LE(d3, 1.5 * d2 + 1e-6) << "rank " << r << " (stage 2: " << d2 << ")";
    }
  }
  // Training moved the parameters (the embedding too), so agreement is not trivial.
  const at::Tensor start = flat_of(*ref_net, init);
  EXPECT_GT((ref.params - start).abs().max().item<double>(), 1e-3);
  const int64_t embed = s.vocab * s.dim;
  EXPECT_GT((ref.params.narrow(0, 0, embed) - start.narrow(0, 0, embed)).abs().max().item<double>(),
            1e-4);
  if (c.clip > 0) EXPECT_GT(ref.grad_norms.front(), c.clip);
}

INSTANTIATE_TEST_SUITE_P(
    Gpt, Stage3Root,
    ::testing::Values(Case{2, false, 1, 0, true}, Case{4, false, 2, 0.5, true},
                      Case{2, true, 2, 0.5, true}, Case{4, true, 1, 0, true},
                      Case{2, false, 2, 0.5, false}, Case{4, false, 1, 0, false},
                      Case{2, true, 1, 0.5, false}, Case{4, true, 2, 0.5, false},
                      Case{2, false, 2, 0.5, true, 64}, Case{4, true, 1, 0.5, false, 64}),
    name_of);

// Memory on 4 fake devices, fp32 AdamW, threshold 0: after initialize and between steps a rank
// holds the declared model states and the model's buffers (the RoPE tables) and nothing else;
// no parameter is whole, so parameters + master come to a quarter of the model (padding aside).
TEST(Stage3RootMemory, FourRanksHoldAQuarterOfEveryParameter) {
  constexpr int kWorld = 4;
  for (const bool tied : {true, false}) {
    const models::GptConfig s = shape(tied);
    const Weights init = initial_weights(tied);
    Config cfg = test_config(3, kGlobalRows / kWorld, 1, 0.5, 4096);
    cfg.zero_optimization.stage3.param_persistence_threshold = 0;
    struct Seen {
      int64_t model = 0, buffers = 0, held = 0, between = 0, backward = 0;
      MemoryReport report;
    };
    std::vector<Seen> seen(kWorld);
    run_ranks(
        kWorld,
        [&](std::shared_ptr<comm::Group> group) {
          const int r = group->rank();
          const c10::Device d = fake::device(r);
          Seen& m = seen[r];
          const int64_t base = fake::allocated_bytes(r);
          auto gpt = build(tied, init);
          gpt->to(d);
          for (const auto& b : gpt->buffers()) m.buffers += b.nbytes();
          m.model = fake::allocated_bytes(r) - base - m.buffers;
          auto engine = initialize(gpt, cfg, group);
          m.held = fake::allocated_bytes(r) - base;
          m.report = engine.memory_report();
          for (int step = 0; step < 3; ++step) {
            const TokenBatch g = global_tokens(step, s.vocab);
            const int64_t rows = kGlobalRows / kWorld;
            const at::Tensor loss = gpt->loss(g.tokens.narrow(0, r * rows, rows).to(d),
                                              g.targets.narrow(0, r * rows, rows).to(d));
            const int64_t at0 = fake::allocated_bytes(r);
            fake::reset_peak(r);
            engine.backward(loss);
            m.backward = fake::peak_bytes(r) - at0;
            engine.step();
          }
          engine.settled_stats();
          m.between = fake::allocated_bytes(r) - base;
        },
        std::chrono::seconds(120), fake::device().type());
    const int64_t psi = s.num_params();
    for (int r = 0; r < kWorld; ++r) {
      const Seen& m = seen[r];
      const MemoryBreakdown& b = m.report.measured;
      const int64_t params = b.params + b.master;
      std::printf(
          "%s N=4 rank %d: model %lld B, buffers %lld B; held %lld B = report %lld "
          "(params %lld + master %lld + grads %lld + optimizer %lld + comm %lld) + 4 + "
          "buffers; parameters %.4f of the model; backward peak +%lld B (embedding "
          "%lld B)\n",
          tied ? "tied" : "untied", r, static_cast<long long>(m.model),
          static_cast<long long>(m.buffers), static_cast<long long>(m.held),
          static_cast<long long>(b.total()), static_cast<long long>(b.params),
          static_cast<long long>(b.master), static_cast<long long>(b.grads),
          static_cast<long long>(b.optimizer), static_cast<long long>(b.comm_buffers),
          static_cast<double>(params) / (4.0 * psi), static_cast<long long>(m.backward),
          static_cast<long long>(4 * s.vocab * s.dim));
      ASSERT_EQ(m.model, 4 * psi);
      // Every byte is declared: the model states, AdamW's 4-byte step count, the RoPE buffers.
      EXPECT_EQ(m.held, b.total() + 4 + m.buffers) << "rank " << r;
      // Between steps also the step's gather-order flag (8 B), kept until the next backward
      // reads it: the step skips on it (review 2026-12-07a L1).
      EXPECT_EQ(m.between, m.held + 8) << "rank " << r;
      // Nothing whole: the root unit is empty.
      EXPECT_EQ(b.params, 0) << "rank " << r;
      EXPECT_EQ(m.report.predicted.params, 0);
      // The formula: master and AdamW's two states, 4 + 8 bytes of Ψ/N each, each bucket padded
      // to a multiple of 64 x N elements. No gradient shard and no bucket buffer between steps
      // (allocated by backward's first reduction, freed after the step: FSDP2's set_to_none).
      const int64_t pad = 4 * (m.report.padded_params - m.report.num_params) / kWorld;
      EXPECT_GE(b.master, 4 * psi / kWorld);
      EXPECT_LE(b.master, 4 * psi / kWorld + pad + 4);
      EXPECT_EQ(b.master, 4 * m.report.padded_params / kWorld);
      EXPECT_EQ(b.grads, 0);
      EXPECT_EQ(b.comm_buffers, 0);
      EXPECT_EQ(m.report.predicted.grads, 0);
      EXPECT_EQ(b.optimizer, 2 * b.master);
      EXPECT_NEAR(static_cast<double>(params) / (4.0 * psi), 0.25, 0.01) << "rank " << r;
    }
  }
}

}  // namespace
}  // namespace zero::testing
