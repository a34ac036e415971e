// The hierarchical compressed reduce-scatter (zero/compress/quantized_reduce.hpp, ZeRO++'s qgZ
// layout) on 4 real gloo ranks standing for 2 nodes x 2 ranks (node_of {0, 0, 1, 1}; the
// constructor splits the group with comm::Group::split), checked against the exact fp32
// reduce-scatter:
//  - the result is within the two-stage quantization bound: each rank's own rounding (half a
//    block scale) plus each node's re-quantization of its partial sum;
//  - the bytes that cross "nodes" (the across-node subgroup, counted by comm::CountingGroup) are
//    the formula's, 1/per_node of what the flat all-to-all sends across nodes;
//  - with error feedback, the outputs over 30 steps plus both stages' residuals equal the exact
//    sum, and the error of the sum stays one step's while without feedback it grows;
//  - the node layout: which groups are two-level, ranks per node from the launcher.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <map>
#include <mutex>

#include "comm/counting_group.hpp"
#include "support/scoped_env.hpp"
#include "support/thread_group.hpp"
#include "support/tiny_net.hpp"
#include "zero/compress/node_layout.hpp"
#include "zero/compress/quantized_reduce.hpp"
#include "zero/engine.hpp"

namespace zero::testing {
namespace {

constexpr int kWorld = 4, kNodes = 2, kPerNode = 2;
const std::vector<int> kNodeOf = {0, 0, 1, 1};

// Rank r's bucket at step t: small values and a few spikes, as gradients are.
at::Tensor bucket_of(int rank, int step, int64_t numel) {
  at::Generator gen = at::detail::createCPUGenerator(7000 * step + 13 * rank + 5);
  at::Tensor x = at::randn({numel}, gen).mul_(1e-2);
  for (int64_t i = (rank * 29 + step * 7) % 97; i < numel; i += 97) x[i] = 2.0 * (i % 2 ? 1 : -1);
  return x;
}

double qmax(int bits) { return bits == 8 ? 127.0 : 7.0; }

// Per element of a length-n vector: the largest |v| of the block it sits in (blocks from 0).
at::Tensor block_absmax(const at::Tensor& v, int64_t block) {
  const int64_t n = v.numel(), blocks = (n + block - 1) / block;
  at::Tensor padded = at::zeros({blocks * block}, v.options());
  padded.narrow(0, 0, n).copy_(v.abs());
  return padded.view({blocks, block}).amax(1).repeat_interleave(block).narrow(0, 0, n);
}

struct Case {
  int bits;
  int64_t n;
  int64_t block;
};

class HierarchicalReduceScatter : public ::testing::TestWithParam<Case> {};

TEST_P(HierarchicalReduceScatter, WithinTwoStageBoundOfExact) {
  const Case c = GetParam();
  run_ranks(kWorld, [&](std::shared_ptr<comm::Group> inner) {
    auto group = std::make_shared<comm::CountingGroup>(inner);
    const int d = group->rank();
    const int64_t total = kWorld * c.n;
    compress::QuantizedReduceScatter q(*group, {true, c.bits, c.block, false}, {total}, at::kCPU,
                                       kNodeOf);
    ASSERT_TRUE(q.two_level().has_value());
    at::Tensor in = bucket_of(d, 0, total), exact_in = in.clone();
    at::Tensor out = at::empty({c.n}), exact = at::empty({c.n});
    q.reduce_scatter(0, out, in, "hierarchical").wait();
    group->reduce_scatter_sum(exact, exact_in, "exact").wait();
    // Stage 1: rank r's chunk d is off by at most half its block's scale. Stage 2: node k's
    // partial sum of chunk d (exact sum plus those errors) is quantized again, off by at most
    // half the scale of its block, whose absmax is at most the exact partial's plus the
    // stage-1 errors.
    at::Tensor bound = at::zeros({c.n});
    double absmax = 0;
    for (int k = 0; k < kNodes; ++k) {
      at::Tensor partial = at::zeros({c.n}), stage1 = at::zeros({c.n});
      for (int r = 0; r < kWorld; ++r) {
        if (kNodeOf[r] != k) continue;
        const at::Tensor chunk = bucket_of(r, 0, total).narrow(0, d * c.n, c.n);
        partial += chunk;
        stage1 += block_absmax(chunk, c.block).div(2 * qmax(c.bits));
        absmax += chunk.abs().max().item<double>();
      }
      bound +=
          stage1 +
          (block_absmax(partial, c.block) + block_absmax(stage1, c.block)).div(2 * qmax(c.bits));
    }
    const at::Tensor err = (out - exact).abs();
    const double slack = 4 * absmax * std::ldexp(1.0, -20);  // fp32 rounding of the sums
    EXPECT_TRUE((err <= bound + slack).all().item<bool>())
        << "rank " << d << ": worst excess " << (err - bound).max().item<double>();
    EXPECT_GT(err.max().item<double>(), 1e-6) << "no quantization happened";
    // It went through the node's group and the group across nodes, not the flat one.
    EXPECT_EQ(group->counts().count("all_to_all"), 0u);
    const auto subs = group->subgroups();
    ASSERT_EQ(subs.size(), 2u);
    for (const auto& s : subs) EXPECT_EQ(s->counts().at("all_to_all").calls, 1) << s->name();
  });
}

INSTANTIATE_TEST_SUITE_P(TwoNodesTwoRanks, HierarchicalReduceScatter,
                         ::testing::Values(Case{8, 1000, 64}, Case{4, 1000, 64}, Case{8, 777, 50},
                                           Case{4, 10, 2048}),
                         [](const ::testing::TestParamInfo<Case>& i) {
                           return "int" + std::to_string(i.param.bits) + "_n" +
                                  std::to_string(i.param.n) + "_block" +
                                  std::to_string(i.param.block);
                         });

// Bytes per rank for one bucket: the node's all-to-all sends (per_node - 1) of its per_node
// destinations a row for each node; across nodes only (nodes - 1) rows leave, against
// (world - per_node) rows for the flat all-to-all: per_node times fewer over the slow link.
TEST(HierarchicalReduceScatterBytes, AcrossNodesIsOnePerNodeOfFlat) {
  constexpr int64_t kN = 5000, kBlock = 256, kTotal = kWorld * kN;
  run_ranks(kWorld, [&](std::shared_ptr<comm::Group> inner) {
    auto group = std::make_shared<comm::CountingGroup>(inner);
    at::Tensor in = bucket_of(group->rank(), 0, kTotal), out = at::empty({kN});
    for (int bits : {8, 4}) {
      const int64_t blocks = (kN + kBlock - 1) / kBlock;
      const int64_t row = blocks * kBlock * bits / 8 + 4 * blocks;  // codes + fp32 scales
      compress::QuantizedReduceScatter hier(*group, {true, bits, kBlock, true}, {kTotal}, at::kCPU,
                                            kNodeOf);
      hier.reduce_scatter(0, out, in, "hier").wait();
      // This exchange's two subgroups: the last two split off.
      auto subs = group->subgroups();
      ASSERT_EQ(subs.size(), bits == 8 ? 2u : 4u);
      subs.erase(subs.begin(), subs.end() - 2);
      const auto& within =
          subs[0]->name().find("within node") != std::string::npos ? subs[0] : subs[1];
      const auto& across = within == subs[0] ? subs[1] : subs[0];
      EXPECT_NE(across->name().find("across nodes"), std::string::npos) << across->name();
      EXPECT_EQ(within->sent_bytes(), (kPerNode - 1) * kNodes * row);
      EXPECT_EQ(across->sent_bytes(), (kNodes - 1) * row);
      const compress::SentBytes h =
          compress::hierarchical_sent_bytes(kN, kNodes, kPerNode, bits, kBlock);
      EXPECT_EQ(h.within, within->sent_bytes());
      EXPECT_EQ(h.across, across->sent_bytes());

      // The flat exchange over the same ranks: world - 1 rows, world - per_node to other nodes.
      group->reset();
      compress::QuantizedReduceScatter flat(*group, {true, bits, kBlock, true, false}, {kTotal},
                                            at::kCPU, kNodeOf);
      EXPECT_FALSE(flat.two_level().has_value());
      flat.reduce_scatter(0, out, in, "flat").wait();
      EXPECT_EQ(group->sent_bytes("flat"), (kWorld - 1) * row);
      const compress::SentBytes f = compress::flat_sent_bytes(kN, kNodeOf, bits, kBlock);
      EXPECT_EQ(f.across, (kWorld - kPerNode) * row);
      EXPECT_EQ(f.total(), group->sent_bytes("flat"));
      EXPECT_EQ(f.across, kPerNode * h.across);
      group->reset();
    }
  });
}

// Error feedback in both stages: every rank keeps the residual of what it sent within the node
// (rows in the exchange's order: row l * nodes + k belongs to the rank that is local rank l on
// node k) and of the partial sums it sent across nodes (row k: node k's rank with its own local
// index). What the outputs miss after T steps is exactly the sum of the residuals for this
// shard.
TEST(HierarchicalReduceScatterFeedback, AccumulatedSumIsExactAndWithoutItDrifts) {
  constexpr int kSteps = 30, kBits = 4;
  constexpr int64_t kN = 3000, kBlock = 128, kTotal = kWorld * kN;
  run_ranks(kWorld, [&](std::shared_ptr<comm::Group> group) {
    const int d = group->rank(), node = kNodeOf[d], local = d % kPerNode;
    compress::QuantizedReduceScatter ef(*group, {true, kBits, kBlock, true}, {kTotal}, at::kCPU,
                                        kNodeOf);
    compress::QuantizedReduceScatter plain(*group, {true, kBits, kBlock, false}, {kTotal}, at::kCPU,
                                           kNodeOf);
    at::Tensor sum_ef = at::zeros({kN}, at::kDouble), sum_plain = sum_ef.clone(),
               sum_exact = sum_ef.clone();
    double step_bound = 0;
    for (int t = 0; t < kSteps; ++t) {
      // A persistent part below half an int4 step of the spikes' grid: rounded away each time
      // without feedback.
      at::Tensor in = bucket_of(d, t, kTotal).add_(0.04), copy = in.clone();
      at::Tensor out = at::empty({kN}), exact = at::empty({kN});
      ef.reduce_scatter(0, out, in, "ef").wait();
      sum_ef += out.to(at::kDouble);
      plain.reduce_scatter(0, out, in, "plain").wait();
      sum_plain += out.to(at::kDouble);
      group->reduce_scatter_sum(exact, copy, "exact").wait();
      sum_exact += exact.to(at::kDouble);
      step_bound = std::max(step_bound, exact.abs().max().item<double>());
    }
    ASSERT_EQ(ef.feedback()->buffers(), 2u);
    // Every rank's residuals, gathered: [world, world * n] within the node, [world, nodes * n]
    // across nodes.
    at::Tensor r1 = ef.feedback()->residual(0).clone(), r2 = ef.feedback()->residual(1).clone();
    ASSERT_EQ(r1.numel(), kTotal);
    ASSERT_EQ(r2.numel(), kNodes * kN);
    at::Tensor all1 = at::empty({kWorld * kTotal}), all2 = at::empty({kWorld * kNodes * kN});
    group->all_gather(all1, r1, "residuals within").wait();
    group->all_gather(all2, r2, "residuals across").wait();
    all1 = all1.view({kWorld, kWorld, kN});
    all2 = all2.view({kWorld, kNodes, kN});
    at::Tensor owed = at::zeros({kN}, at::kDouble);
    for (int r = 0; r < kWorld; ++r) owed += all1[r][local * kNodes + node].to(at::kDouble);
    for (int r = 0; r < kWorld; ++r) {
      if (r % kPerNode == local) owed += all2[r][node].to(at::kDouble);
    }
    const double closed = (sum_ef + owed - sum_exact).abs().max().item<double>();
    EXPECT_LT(closed, kSteps * kWorld * 8 * step_bound * std::ldexp(1.0, -23)) << d;
    const double err_ef = (sum_ef - sum_exact).abs().max().item<double>();
    const double err_plain = (sum_plain - sum_exact).abs().max().item<double>();
    EXPECT_GT(err_plain, 2 * err_ef) << "rank " << d;
    EXPECT_GT(err_plain, 0.5 * kSteps * kWorld * 0.04) << "rank " << d;
    // Both residuals are held between steps: 4 bytes per element sent, plus 1/per_node of it.
    EXPECT_EQ(ef.bytes(), 4 * (kTotal + kNodes * kN));
  });
}

TEST(NodeLayout, TwoLevelNeedsSeveralEvenNodesOfSeveralRanks) {
  const auto tl = compress::two_level({0, 0, 1, 1});
  ASSERT_TRUE(tl.has_value());
  EXPECT_EQ(tl->nodes(), 2);
  EXPECT_EQ(tl->per_node(), 2);
  EXPECT_EQ(tl->ranks, (std::vector<std::vector<int>>{{0, 1}, {2, 3}}));
  // Interleaved placement (a dp group strided over the world): still two nodes of two.
  EXPECT_EQ(compress::two_level({0, 1, 0, 1})->ranks,
            (std::vector<std::vector<int>>{{0, 2}, {1, 3}}));
  EXPECT_FALSE(compress::two_level({0, 0, 0, 0}).has_value());     // one node
  EXPECT_FALSE(compress::two_level({0, 1, 2, 3}).has_value());     // one rank per node
  EXPECT_FALSE(compress::two_level({0, 0, 0, 1, 1}).has_value());  // uneven
  EXPECT_FALSE(compress::two_level({}).has_value());
}

TEST(NodeLayout, RanksPerNodeFromTheLauncher) {
  std::map<std::string, std::string> env;
  const auto get = [&env](const char* n) -> const char* {
    auto it = env.find(n);
    return it == env.end() ? nullptr : it->second.c_str();
  };
  EXPECT_EQ(compress::local_world_size_from_env(get), 0);
  env["SLURM_NTASKS_PER_NODE"] = "4(x2),2";  // uneven Slurm nodes: no single number
  EXPECT_EQ(compress::local_world_size_from_env(get), 0);
  env["SLURM_NTASKS_PER_NODE"] = "4";
  EXPECT_EQ(compress::local_world_size_from_env(get), 4);
  env["OMPI_COMM_WORLD_LOCAL_SIZE"] = "2";
  EXPECT_EQ(compress::local_world_size_from_env(get), 2);
  env["LOCAL_WORLD_SIZE"] = "8";  // torchrun's wins
  EXPECT_EQ(compress::local_world_size_from_env(get), 8);
}

TEST(NodeLayout, NodesFromGlobalRanks) {
  run_ranks(kWorld, [&](std::shared_ptr<comm::Group> group) {
    EXPECT_EQ(compress::nodes_of(*group, 2), kNodeOf);
    EXPECT_EQ(compress::nodes_of(*group, 0), (std::vector<int>{0, 0, 0, 0}));
    // A flat-only setting keeps one all-to-all even on a two-level layout.
    compress::QuantizedReduceScatter flat(*group, {true, 8, 64, false, false}, {kWorld * 10},
                                          at::kCPU, kNodeOf);
    EXPECT_FALSE(flat.two_level().has_value());
  });
}

// The engine picks the hierarchical exchange by itself from LOCAL_WORLD_SIZE (2 ranks per node
// of 4 thread ranks) and trains like single-process training within the bound error feedback
// gives (SGD with momentum, stage 2): the last residuals of both stages, each at most half a
// block scale, weighted by the momentum's 1 / (1 - beta).
TEST(HierarchicalTraining, EngineTracksSingleProcessTraining) {
  constexpr int kSteps = 30;
  constexpr int64_t kRows = 48;
  Config cfg = test_config(2, kRows / kWorld, 1, 0, /*bucket=*/64);
  cfg.optimizer.type = "SGD";
  cfg.optimizer.lr = 0.05;
  cfg.optimizer.momentum = 0.9;
  const ReferenceResult ref = train_reference(cfg, kSteps, kRows, /*seed=*/3);
  auto& q = cfg.zero_optimization.quantized_gradients;
  q.enabled = true;
  q.bits = 8;
  q.block = 32;
  struct Out {
    at::Tensor params;
    int64_t comm_buffers = 0, padded = 0;
    bool two_level = false;
  };
  const auto train = [&](const Config& c) {
    ScopedEnv env("LOCAL_WORLD_SIZE", "2");
    std::mutex mu;
    Out out;
    run_ranks(kWorld, [&](std::shared_ptr<comm::Group> group) {
      auto net = make_tiny_net(3);
      auto counted = std::make_shared<comm::CountingGroup>(group);
      auto engine = initialize(net, c, counted);
      const int r = group->rank();
      for (int s = 0; s < kSteps; ++s) {
        Batch b = rank_micro_batch(global_batch(s, kRows), r, kWorld, 0, 1);
        engine.backward(mse(net->forward(b.x), b.y));
        engine.step();
      }
      std::lock_guard<std::mutex> lock(mu);
      if (r == 0) {
        out.params = engine.flat_parameters();
        out.comm_buffers = engine.memory_report().measured.comm_buffers;
        out.padded = engine.memory_report().padded_params;
        // The gradients went through the two subgroups, not an all-to-all of the dp group.
        out.two_level = !counted->subgroups().empty() && counted->counts().count("all_to_all") == 0;
      }
    });
    return out;
  };
  const Out hier = train(cfg);
  q.hierarchical = false;
  const Out flat = train(cfg);
  q.hierarchical = true;
  q.error_feedback = false;
  const Out no_ef = train(cfg);
  EXPECT_TRUE(hier.two_level);
  EXPECT_FALSE(flat.two_level);
  // Residuals: 4 bytes per gradient element sent within the node, plus 4 per element of the
  // partial sums sent across nodes (1 / per_node of them).
  EXPECT_EQ(hier.comm_buffers - no_ef.comm_buffers, 4 * hier.padded + 4 * hier.padded / kPerNode);
  EXPECT_EQ(flat.comm_buffers - no_ef.comm_buffers, 4 * flat.padded);
  double max_norm = 0;
  for (double n : ref.grad_norms) max_norm = std::max(max_norm, n);
  const auto diff = [&](const Out& o) {
    return (o.params - ref.params).abs().max().item<double>();
  };
  std::printf(
      "max |param - reference|: hierarchical int8+EF %.3g, flat int8+EF %.3g, "
      "hierarchical without EF %.3g\n",
      diff(hier), diff(flat), diff(no_ef));
  // As QuantizedTraining's bound (tests/test_compressed_reduce.cpp), twice: two quantizations.
  const double bound = 2 * 2 * 2 * cfg.optimizer.lr * (max_norm / 254) / (1 - 0.9);
  EXPECT_LT(diff(hier), bound);
  EXPECT_LT(diff(flat), bound);
  EXPECT_GT((ref.params - flatten(*make_tiny_net(3))).abs().max().item<double>(), 1e-2);
}

}  // namespace
}  // namespace zero::testing
