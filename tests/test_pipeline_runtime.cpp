// The pipeline runtime (zero/pipeline/runtime/): the example GPT cut into P stages (embedding on
// the first, blocks partitioned, final norm + head + loss on the last), each stage a gloo rank,
// activations and gradients sent between them, trained for several steps with SGD and AdamW.
// The references are independent: the whole model in one process with plain autograd and the
// same torch optimizer, (a) on the whole batch (the micro-batches concatenated) and (b) on the
// micro-batches one after another (gradient accumulation). Losses per step agree with (a) within
// 1e-5 relative in fp32; every parameter afterwards with (b) within 1e-6 and with (a) within
// 1e-5 (AdamW: or twice what (b) itself differs from (a), see run_case), for GPipe, 1F1B and
// interleaved 1F1B (P = 2 and 4 with v = 2 model chunks per stage, P = 2 with v = 3), P = 2, 3
// and 4, tied and untied head, SGD with momentum and AdamW. A stage that stops answering
// makes its neighbours fail within comm_timeout_s, naming the stage and the silent rank. And the
// partition methods against DeepSpeed's rules.
#include <gtest/gtest.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>

#include <ATen/CPUGeneratorImpl.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "comm/group.hpp"
#include "support/fake_device.hpp"
#include "support/forwarding_group.hpp"
#include "support/thread_group.hpp"
#include "support/tp_compare.hpp"
#include "zero/errors.hpp"
#include "zero/models/gpt.hpp"
#include "zero/models/gpt_layers.hpp"
#include "zero/pipeline/partition.hpp"
#include "zero/pipeline/runtime/runtime.hpp"

namespace zero::pipeline {
namespace {

using models::Gpt;
using models::GptConfig;

constexpr double kTol = 1e-5;       // against the whole batch in one process
constexpr double kAccumTol = 1e-6;  // against single-process gradient accumulation

// ---- partition: DeepSpeed's ds_utils.partition_uniform / partition_balanced ----------------

TEST(PipelinePartition, UniformGivesTheFirstStagesTheRemainder) {
  EXPECT_EQ(partition_uniform(8, 4), (std::vector<int>{0, 2, 4, 6, 8}));
  EXPECT_EQ(partition_uniform(10, 4), (std::vector<int>{0, 3, 6, 8, 10}));
  EXPECT_EQ(partition_uniform(4, 4), (std::vector<int>{0, 1, 2, 3, 4}));
  EXPECT_THROW(partition_uniform(3, 4), std::invalid_argument);
  EXPECT_THROW(partition_uniform(3, 0), std::invalid_argument);
}

// The largest part is as small as any contiguous cut allows (checked against every cut).
TEST(PipelinePartition, ParametersMinimisesTheLargestStage) {
  const std::vector<std::vector<int64_t>> cases{
      {1, 1, 1, 1}, {1, 2, 1}, {5, 1, 1, 1, 1, 5}, {100, 7, 7, 7, 7, 7, 7, 100}, {0, 3, 0, 3, 0}};
  for (const auto& w : cases) {
    for (int parts = 1; parts <= static_cast<int>(w.size()); ++parts) {
      auto b = partition_balanced(w, parts);
      ASSERT_EQ(b.size(), size_t(parts + 1));
      ASSERT_EQ(b.front(), 0);
      ASSERT_EQ(b.back(), static_cast<int>(w.size()));
      int64_t worst = 0;
      for (int p = 0; p < parts; ++p) {
        ASSERT_LT(b[p], b[p + 1]) << "empty stage " << p;
        int64_t sum = 0;
        for (int i = b[p]; i < b[p + 1]; ++i) sum += w[i];
        worst = std::max(worst, sum);
      }
      // Brute force over every cut into `parts` non-empty runs.
      int64_t best = INT64_MAX;
      const int n = static_cast<int>(w.size());
      for (int mask = 0; mask < (1 << (n - 1)); ++mask) {
        if (__builtin_popcount(mask) != parts - 1) continue;
        int64_t sum = 0, mx = 0;
        for (int i = 0; i < n; ++i) {
          sum += w[i];
          if (i == n - 1 || (mask >> i & 1)) {
            mx = std::max(mx, sum);
            sum = 0;
          }
        }
        best = std::min(best, mx);
      }
      EXPECT_EQ(worst, best) << "parts " << parts;
    }
  }
  EXPECT_EQ(parse_partition_method("parameters"), PartitionMethod::Parameters);
  EXPECT_EQ(parse_partition_method("uniform"), PartitionMethod::Uniform);
  try {
    parse_partition_method("type:transformer");
    FAIL();
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("pipeline.partition"), std::string::npos);
  }
}

// ---- training equivalence ------------------------------------------------------------------

enum class Opt { SGD, AdamW };

std::unique_ptr<torch::optim::Optimizer> make_opt(Opt o, std::vector<at::Tensor> params) {
  if (o == Opt::SGD)
    return std::make_unique<torch::optim::SGD>(std::move(params),
                                               torch::optim::SGDOptions(0.1).momentum(0.9));
  return std::make_unique<torch::optim::AdamW>(std::move(params),
                                               torch::optim::AdamWOptions(1e-2).weight_decay(0.1));
}

struct Batch {
  at::Tensor inputs, targets;  // [m * mb, seq]
};

std::vector<Batch> make_batches(const GptConfig& c, int steps, int rows, int seq, uint64_t seed) {
  auto gen = at::detail::createCPUGenerator(seed);
  std::vector<Batch> out;
  for (int s = 0; s < steps; ++s) {
    at::Tensor t = at::randint(c.vocab, {rows, seq + 1}, gen, at::kLong);
    out.push_back({t.narrow(1, 0, seq).contiguous(), t.narrow(1, 1, seq).contiguous()});
  }
  return out;
}

struct Trained {
  std::vector<float> losses;
  std::map<std::string, at::Tensor> params;
};

std::map<std::string, at::Tensor> snapshot(const Gpt& m) {
  std::map<std::string, at::Tensor> out;
  for (const auto& p : m->named_parameters()) out[p.key()] = p.value().detach().clone();
  return out;
}

void load(Gpt& m, const std::map<std::string, at::Tensor>& state) {
  at::NoGradGuard g;
  for (auto& p : m->named_parameters()) p.value().copy_(state.at(p.key()));
}

// The reference: the whole model in one process, one optimizer. accumulate == 1: the whole batch
// in one backward; more: the batch's micro-batches one after another, each loss divided by their
// number (plain gradient accumulation: the same sums in another order).
Trained reference(const GptConfig& c, const std::map<std::string, at::Tensor>& init,
                  const std::vector<Batch>& batches, Opt o, int accumulate = 1) {
  Gpt model(c);
  load(model, init);
  auto opt = make_opt(o, model->parameters());
  Trained out;
  for (const auto& b : batches) {
    auto in = b.inputs.chunk(accumulate, 0);
    auto tg = b.targets.chunk(accumulate, 0);
    double loss = 0;
    for (int i = 0; i < accumulate; ++i) {
      at::Tensor l = model->loss(in[i], tg[i]) / accumulate;
      l.backward();
      loss += l.item<double>();
    }
    opt->step();
    opt->zero_grad();
    out.losses.push_back(static_cast<float>(loss));
  }
  out.params = snapshot(model);
  return out;
}

struct Case {
  int stages;
  ScheduleKind schedule;
  Opt opt;
  bool tied;
  PartitionMethod partition = PartitionMethod::Parameters;
  int micro_batches = 4;
  int layers = 2;  // the tiny preset's
  // Stage s on the fake accelerator's device s (tests/support/fake_device.hpp), its group
  // staging through the host as for any non-CPU device: a buffer the runtime leaves on the host
  // is refused by the group, as NCCL refuses it.
  bool fake_device = false;
  int virtual_stages = 1;  // model chunks per stage (the interleaved schedule)
  int64_t vocab = 0;       // 0: the tiny preset's
  // Reorders the built-in schedule's lists (RuntimeOptions::custom_schedule).
  std::function<void(Schedule&)> edit_schedule;
};

std::string name(const Case& k) {
  return "P=" + std::to_string(k.stages) + " " + std::string(schedule_name(k.schedule)) +
         (k.virtual_stages > 1 ? " v=" + std::to_string(k.virtual_stages) : "") + " " +
         (k.opt == Opt::SGD ? "SGD" : "AdamW") + (k.tied ? " tied" : " untied") +
         " m=" + std::to_string(k.micro_batches) + " " +
         std::string(partition_method_name(k.partition)) + (k.fake_device ? " fake device" : "");
}

void run_case(const Case& k) {
  SCOPED_TRACE(name(k));
  GptConfig c = models::gpt_preset("tiny");
  c.tied = k.tied;
  c.layers = k.layers;
  if (k.vocab > 0) c.vocab = k.vocab;
  const int steps = 4, rows_per_mb = 2, seq = 16;
  at::manual_seed(1234);  // the main thread's draw of the initial weights, before any rank runs
  std::map<std::string, at::Tensor> init = snapshot(Gpt(c));
  auto batches = make_batches(c, steps, rows_per_mb * k.micro_batches, seq, 99);
  Trained ref = reference(c, init, batches, k.opt);
  Trained acc = reference(c, init, batches, k.opt, k.micro_batches);

  std::vector<std::vector<float>> losses(k.stages);
  std::vector<std::map<std::string, at::Tensor>> params(k.stages);
  const c10::DeviceType type =
      k.fake_device ? testing::fake::device().type() : c10::DeviceType::CPU;
  testing::run_ranks(
      k.stages,
      [&](std::shared_ptr<comm::Group> pp) {
        const int stage = pp->rank();
        Gpt model(c);  // every rank's copy starts from the reference's weights
        load(model, init);
        const c10::Device device = k.fake_device ? testing::fake::device(stage) : c10::kCPU;
        model->to(device);
        StageLayers layers(models::gpt_pipeline_layers(model), k.partition, k.stages, stage, 0,
                           k.virtual_stages);
        std::set<const void*> mine;
        for (const auto& p : layers.parameters()) mine.insert(p.unsafeGetTensorImpl());
        auto opt = std::make_unique<TorchStageOptimizer>(make_opt(k.opt, layers.parameters()));
        RuntimeOptions opts{k.schedule, k.micro_batches};
        opts.virtual_stages = k.virtual_stages;
        if (k.edit_schedule) {
          Schedule s = make_schedule(k.schedule, k.stages, k.micro_batches, k.virtual_stages);
          k.edit_schedule(s);
          opts.custom_schedule = std::make_shared<const Schedule>(std::move(s));
        }
        PipelineRuntime rt(std::move(layers), models::gpt_loss, pp, std::move(opt), opts);
        EXPECT_EQ(rt.device(), device);
        for (const auto& b : batches) {
          std::vector<at::Tensor> in, tg;
          for (const auto& t : b.inputs.chunk(k.micro_batches, 0)) in.push_back(t.to(device));
          for (const auto& t : b.targets.chunk(k.micro_batches, 0)) tg.push_back(t.to(device));
          losses[stage].push_back(rt.train_batch(in, tg).item<float>());
        }
        for (const auto& p : model->named_parameters())
          if (mine.count(p.value().unsafeGetTensorImpl())) {
            EXPECT_EQ(p.value().device(), device) << p.key();
            params[stage][p.key()] = p.value().detach().cpu();
          }
      },
      std::chrono::seconds(60), type);

  std::set<std::string> covered;
  for (int s = 0; s < k.stages; ++s) {
    ASSERT_EQ(losses[s].size(), ref.losses.size());
    for (size_t i = 0; i < ref.losses.size(); ++i)
      EXPECT_NEAR(losses[s][i], ref.losses[i], kTol * std::abs(ref.losses[i]))
          << "stage " << s << " step " << i;
    for (const auto& [key, t] : params[s]) {
      const std::string what = "stage " + std::to_string(s) + " " + key;
      // A tied weight's gradient is summed in another order here (the embedding's m parts on the
      // first stage, the head's on the last, then the two) than in one process (the two parts
      // of each micro-batch in turn); AdamW magnifies that rounding into every later step, by as
      // much as another summation order does in one process (accumulation against the whole
      // batch: how much depends on the CPU's kernels, 1.46e-5 for blocks.0.w_down on an AVX2
      // machine where a fixed 1e-5 failed).
      double acc_tol = kAccumTol;
      if (k.tied && k.opt == Opt::AdamW)
        acc_tol = std::max(kTol, 2 * testing::max_rel_err(acc.params.at(key), ref.params.at(key)));
      testing::expect_rel_close(t, acc.params.at(key), acc_tol, what + " (vs accumulation)");
      // SGD's update is proportional to the gradient: the whole batch's sums in another order
      // move the parameters by a rounding. AdamW divides by sqrt(v): where a gradient is ~0 it
      // magnifies that rounding, by as much as the single-process accumulation shows.
      double tol = kTol;
      if (k.opt == Opt::AdamW)
        tol = std::max(tol, 2 * testing::max_rel_err(acc.params.at(key), ref.params.at(key)));
      testing::expect_rel_close(t, ref.params.at(key), tol, what + " (vs whole batch)");
      covered.insert(key);
    }
  }
  EXPECT_EQ(covered.size(), ref.params.size()) << "some parameter is on no stage";
  std::printf("  %s: losses %.6f .. %.6f (reference %.6f .. %.6f)\n", name(k).c_str(),
              losses[0].front(), losses[0].back(), ref.losses.front(), ref.losses.back());
}

TEST(PipelineRuntime, TwoStagesMatchSingleProcessTraining) {
  for (auto schedule : {ScheduleKind::GPipe, ScheduleKind::OneFOneB})
    for (auto opt : {Opt::SGD, Opt::AdamW}) run_case({2, schedule, opt, /*tied=*/false});
}

TEST(PipelineRuntime, FourStagesMatchSingleProcessTraining) {
  for (auto schedule : {ScheduleKind::GPipe, ScheduleKind::OneFOneB})
    for (auto opt : {Opt::SGD, Opt::AdamW}) run_case({4, schedule, opt, /*tied=*/false});
}

// Fewer micro-batches than stages (1F1B's warm-up is cut short), one micro-batch, and uniform
// partition of a deeper model.
TEST(PipelineRuntime, MicroBatchCountsAndUniformPartition) {
  run_case({4, ScheduleKind::OneFOneB, Opt::AdamW, false, PartitionMethod::Parameters, 2});
  run_case({2, ScheduleKind::OneFOneB, Opt::SGD, false, PartitionMethod::Parameters, 1});
  run_case({3, ScheduleKind::GPipe, Opt::AdamW, false, PartitionMethod::Uniform, 3, 5});
}

// pipeline.partition: compute, end to end. The tiny GPT with V = 4096 (h = 64, f = 256, 2 blocks,
// tied) at its max_seq s = 128: a block costs 6·65664 + 12·128·64 = 492288 FLOPs per token, the
// head 6·(4096·64 + 64) + 8·4096 = 1606016, the embedding 64. By parameters (262144, 65664,
// 65664, 262208) the cut is 2 | 2 layers; by compute the head alone (1606016) beats the block and
// head together: 3 | 1. Trained with those bounds against single-process training.
TEST(PipelineRuntime, ComputePartitionMatchesSingleProcessTraining) {
  GptConfig c = models::gpt_preset("tiny");
  c.vocab = 4096;
  const Gpt model(c);
  EXPECT_EQ(
      StageLayers(models::gpt_pipeline_layers(model), PartitionMethod::Parameters, 2, 0).bounds(),
      (std::vector<int>{0, 2, 4}));
  EXPECT_EQ(
      StageLayers(models::gpt_pipeline_layers(model), PartitionMethod::Compute, 2, 0).bounds(),
      (std::vector<int>{0, 3, 4}));
  for (auto opt : {Opt::SGD, Opt::AdamW}) {
    Case k{2, ScheduleKind::OneFOneB, opt, /*tied=*/true, PartitionMethod::Compute};
    k.vocab = 4096;
    run_case(k);
  }
}

// Megatron-LM's interleaved 1F1B: the model cut into P x v chunks, stage s running chunks s,
// s + P, ...; the last stage's chunk c feeds the first stage's chunk c + 1. P = 2 and 4 with v =
// 2 (4 and 8 chunks: the tiny preset with 2 and 6 blocks, one layer per chunk), P = 2 with v =
// 3 (6 chunks), micro-batches a multiple of P, SGD and AdamW, against the same single-process
// references. The tied embedding (stage 0, chunk 0) and head (the last stage's last chunk) too.
Case interleaved(int stages, int v, Opt opt, bool tied, int m, int layers) {
  Case k{stages, ScheduleKind::Interleaved, opt, tied, PartitionMethod::Parameters, m, layers};
  k.virtual_stages = v;
  return k;
}

TEST(PipelineRuntime, InterleavedTwoStagesMatchSingleProcessTraining) {
  for (auto opt : {Opt::SGD, Opt::AdamW}) run_case(interleaved(2, 2, opt, false, 4, 2));
  run_case(interleaved(2, 3, Opt::SGD, false, 2, 4));
}

TEST(PipelineRuntime, InterleavedFourStagesMatchSingleProcessTraining) {
  for (auto opt : {Opt::SGD, Opt::AdamW}) run_case(interleaved(4, 2, opt, false, 8, 6));
}

TEST(PipelineRuntime, InterleavedTiedEmbeddingAndHead) {
  for (auto opt : {Opt::SGD, Opt::AdamW}) {
    run_case(interleaved(2, 2, opt, true, 4, 2));
    run_case(interleaved(4, 2, opt, true, 4, 6));
  }
}

// Bad shapes are refused on every stage before any message, naming what to change.
TEST(PipelineRuntime, InterleavedRefusesBadShapes) {
  GptConfig c = models::gpt_preset("tiny");
  c.layers = 2;
  auto error = [&](int stages, int v, int m, int layers_v) {
    std::vector<std::string> errors(stages);
    testing::run_ranks(stages, [&](std::shared_ptr<comm::Group> pp) {
      Gpt model(c);
      try {
        StageLayers layers(models::gpt_pipeline_layers(model), PartitionMethod::Uniform, stages,
                           pp->rank(), 0, layers_v);
        auto opt = std::make_unique<TorchStageOptimizer>(make_opt(Opt::SGD, layers.parameters()));
        RuntimeOptions opts{ScheduleKind::Interleaved, m};
        opts.virtual_stages = v;
        PipelineRuntime rt(std::move(layers), models::gpt_loss, pp, std::move(opt), opts);
      } catch (const std::invalid_argument& e) {
        errors[pp->rank()] = e.what();
      }
    });
    for (const auto& e : errors) EXPECT_FALSE(e.empty()) << "a stage went on";
    return errors[0];
  };
  // 3 micro-batches on 2 stages: Megatron's multiple of P.
  EXPECT_NE(error(2, 2, 3, 2).find("to be a multiple of stages: 3 micro-batches on 2 stages (use 4"),
            std::string::npos);
  // 4 layers cannot fill 2 x 3 chunks.
  EXPECT_NE(error(2, 3, 4, 3).find("4 layers cannot fill pipeline.stages 2 x "
                                   "pipeline.virtual_stages 3 = 6 model chunks"),
            std::string::npos);
  // The layers cut for v = 1, the runtime asked for 2.
  EXPECT_NE(error(2, 2, 4, 1).find("cut into 1 chunks per stage but the runtime runs "
                                   "pipeline.virtual_stages 2"),
            std::string::npos);
}

// The tied embedding and head on the first and last stage: their gradients summed between the
// two stages, against single-process training of the tied model (one weight, one gradient).
// The tied head's copy sends its gradient where the owner takes it, whatever follows the last
// backward: here the last stage's ReduceGrads comes between its last Backward and that
// micro-batch's SendGrad (a schedule the simulator accepts). The runtime used to send the tied
// gradient only when a SendGrad came right after, so the owner waited out the timeout.
TEST(PipelineRuntime, TiedGradientDoesNotDependOnWhatFollowsTheLastBackward) {
  for (auto [P, kind, v, m] : {std::tuple{2, ScheduleKind::OneFOneB, 1, 4},
                               std::tuple{4, ScheduleKind::OneFOneB, 1, 4},
                               std::tuple{2, ScheduleKind::Interleaved, 2, 4}}) {
    Case k{P, kind, Opt::AdamW, /*tied=*/true, PartitionMethod::Parameters, m};
    k.virtual_stages = v;
    k.edit_schedule = [P = P, m = m](Schedule& s) {
      auto& last = s.per_stage[P - 1];
      last.erase(std::find(last.begin(), last.end(), Instruction{Op::ReduceGrads}));
      last.insert(std::find(last.begin(), last.end(), Instruction{Op::SendGrad, m - 1, 0}),
                  Instruction{Op::ReduceGrads});
    };
    run_case(k);
  }
}

TEST(PipelineRuntime, TiedEmbeddingAndHeadAcrossStages) {
  for (auto schedule : {ScheduleKind::GPipe, ScheduleKind::OneFOneB})
    for (auto opt : {Opt::SGD, Opt::AdamW}) {
      run_case({2, schedule, opt, /*tied=*/true});
      run_case({4, schedule, opt, /*tied=*/true});
    }
}

// On an accelerator: every buffer the runtime sends or receives (the activation's shape, the
// activations, the gradients, the tied weight and its gradient, the loss) must be on the stage's
// device. The fake accelerator's group refuses host tensors, as NCCL does (before this, the
// first receive of a shape failed: "got a tensor on cpu but this process group moves
// privateuseone tensors"). Against the same references as on the host, with SGD: the fake
// device reaches the CPU's kernels through the fallback, yet its AdamW results differed from
// the host reference by up to 4e-5 relative after 4 steps (AdamW magnifies roundings where a
// gradient is ~0; the host tests above cover AdamW), while the losses agree to every digit.
TEST(PipelineRuntime, StagesOnAnAcceleratorKeepTheirBuffersThere) {
  Case k{2, ScheduleKind::OneFOneB, Opt::SGD, /*tied=*/true};
  k.fake_device = true;
  run_case(k);
  run_case({3, ScheduleKind::GPipe, Opt::SGD, false, PartitionMethod::Parameters, 2, 2, true});
}

// ---- the order of messages on each group ---------------------------------------------------

// A real gloo group that records, per peer, the order of its point-to-point operations: what
// NCCL requires of a pair of ranks on one group. There every send and receive between two ranks
// runs in order on one stream and a send does not finish before its receive started, so the
// k-th operation of a toward b must be the receive (send) of the k-th operation of b toward a,
// or both streams can block: a sends activation 1 while b sends gradient 0.
struct Log {
  std::mutex mu;
  // [channel][rank][peer] -> ("send"/"recv", elements) in order
  std::map<std::string, std::map<int, std::map<int, std::vector<std::pair<std::string, int64_t>>>>>
      ops;
};

class RecordingGroup final : public testing::ForwardingGroup {
 public:
  RecordingGroup(std::shared_ptr<comm::Group> g, std::string channel, std::shared_ptr<Log> log)
      : ForwardingGroup(std::move(g)), channel_(std::move(channel)), log_(std::move(log)) {}
  comm::Work send(at::Tensor& t, int dst, const std::string& w, int tag) override {
    record("send", dst, t.numel());
    return ForwardingGroup::send(t, dst, w, tag);
  }
  comm::Work recv(at::Tensor& t, int src, const std::string& w, int tag) override {
    record("recv", src, t.numel());
    return ForwardingGroup::recv(t, src, w, tag);
  }
  std::shared_ptr<comm::Group> split(int color, int key, const std::string& n) override {
    auto sub = ForwardingGroup::split(color, key, n);
    return sub ? std::make_shared<RecordingGroup>(sub, channel_ + "/" + n, log_) : nullptr;
  }

 private:
  void record(const char* kind, int peer, int64_t numel) {
    std::lock_guard<std::mutex> lock(log_->mu);
    log_->ops[channel_][rank()][peer].emplace_back(kind, numel);
  }
  std::string channel_;
  std::shared_ptr<Log> log_;
};

// Every pair of stages, on every group the runtime uses, posts matching operations in the same
// order: 1F1B and GPipe, 2 and 4 stages, interleaved with 2 chunks per stage on 2 and 4 stages
// (the last stage's chunks send to the first stage's, and with P = 2 activations and gradients
// cross in both directions), the tied embedding and head (their weight and gradient travel
// between the first and last stage), two steps.
TEST(PipelineRuntime, EachGroupCarriesMatchingOperationsInTheSameOrderOnBothSides) {
  struct Layout {
    ScheduleKind schedule;
    int stages, v;
  };
  for (const Layout& lay : {Layout{ScheduleKind::OneFOneB, 2, 1}, {ScheduleKind::OneFOneB, 4, 1},
                            {ScheduleKind::GPipe, 2, 1}, {ScheduleKind::GPipe, 4, 1},
                            {ScheduleKind::Interleaved, 2, 2}, {ScheduleKind::Interleaved, 4, 2}}) {
    const ScheduleKind schedule = lay.schedule;
    const int stages = lay.stages;
    GptConfig c = models::gpt_preset("tiny");
    c.layers = std::max(2, stages * lay.v - 2);  // interleaved: one layer per chunk
    c.tied = true;
    at::manual_seed(3);
    const auto init = snapshot(Gpt(c));
    {
      SCOPED_TRACE(std::string(schedule_name(schedule)) + " P=" + std::to_string(stages) +
                   " v=" + std::to_string(lay.v));
      const int m = 4;
      auto batches = make_batches(c, 2, 2 * m, 8, 11);
      auto log = std::make_shared<Log>();
      testing::run_ranks(stages, [&](std::shared_ptr<comm::Group> g) {
        auto pp = std::make_shared<RecordingGroup>(g, "pp", log);
        Gpt model(c);
        load(model, init);
        StageLayers layers(models::gpt_pipeline_layers(model), PartitionMethod::Uniform, stages,
                           pp->rank(), 0, lay.v);
        auto opt = std::make_unique<TorchStageOptimizer>(make_opt(Opt::SGD, layers.parameters()));
        RuntimeOptions opts{schedule, m};
        opts.virtual_stages = lay.v;
        PipelineRuntime rt(std::move(layers), models::gpt_loss, pp, std::move(opt), opts);
        for (const auto& b : batches) rt.train_batch(b.inputs.chunk(m, 0), b.targets.chunk(m, 0));
      });
      int pairs = 0;
      for (auto& [channel, ranks] : log->ops)
        for (auto& [a, peers] : ranks)
          for (auto& [b, mine] : peers) {
            const auto& theirs = log->ops[channel][b][a];
            SCOPED_TRACE(channel + ": rank " + std::to_string(a) + " with rank " +
                         std::to_string(b));
            ASSERT_EQ(mine.size(), theirs.size());
            for (size_t i = 0; i < mine.size(); ++i) {
              ASSERT_NE(mine[i].first, theirs[i].first)
                  << "operation " << i << ": both " << mine[i].first;
              ASSERT_EQ(mine[i].second, theirs[i].second) << "operation " << i;
            }
            ++pairs;
          }
      EXPECT_GT(pairs, 0);
    }
  }
}

// ---- a dead stage ------------------------------------------------------------------------

// Stage 1 of 3 builds its runtime, then never runs a step (hung, not exited: the bound, not a
// closed connection, must end its neighbours' waits). Stage 0 waits for a gradient from it,
// stage 2 for an activation; both fail within comm_timeout_s naming their stage and rank 1.
TEST(PipelineRuntime, DeadStageFailsItsNeighboursWithinTheTimeout) {
  GptConfig c = models::gpt_preset("tiny");
  c.layers = 2;
  at::manual_seed(7);
  auto init = snapshot(Gpt(c));
  auto batch = make_batches(c, 1, 4, 8, 5)[0];
  std::mutex mu;
  std::condition_variable cv;
  int finished = 0;
  std::vector<std::string> messages(3);
  std::vector<double> waited(3, 0);
  testing::run_ranks(
      3,
      [&](std::shared_ptr<comm::Group> pp) {
        const int stage = pp->rank();
        Gpt model(c);
        load(model, init);
        StageLayers layers(models::gpt_pipeline_layers(model), PartitionMethod::Uniform, 3, stage);
        auto opt = std::make_unique<TorchStageOptimizer>(make_opt(Opt::SGD, layers.parameters()));
        PipelineRuntime rt(std::move(layers), models::gpt_loss, pp, std::move(opt),
                           {ScheduleKind::OneFOneB, 2});
        if (stage == 1) {
          std::unique_lock<std::mutex> lock(mu);
          cv.wait_for(lock, std::chrono::seconds(60), [&] { return finished == 2; });
          return;
        }
        const auto t0 = std::chrono::steady_clock::now();
        try {
          rt.train_batch(batch.inputs.chunk(2, 0), batch.targets.chunk(2, 0));
        } catch (const CommError& e) {
          messages[stage] = e.what();
        }
        waited[stage] =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        std::lock_guard<std::mutex> lock(mu);
        ++finished;
        cv.notify_all();
      },
      std::chrono::milliseconds(2000));
  for (int s : {0, 2}) {
    SCOPED_TRACE("stage " + std::to_string(s) + ": " + messages[s]);
    EXPECT_NE(messages[s].find("pipeline stage " + std::to_string(s) + " of 3"), std::string::npos);
    EXPECT_NE(messages[s].find("from stage 1 (recv from rank 1"), std::string::npos);
    EXPECT_GE(waited[s], 1.5);
    EXPECT_LT(waited[s], 20.0);
    std::printf("  stage %d failed after %.1f s: %s\n", s, waited[s], messages[s].c_str());
  }
}

}  // namespace
}  // namespace zero::pipeline
