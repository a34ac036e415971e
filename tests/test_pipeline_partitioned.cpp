// DeepSpeed's pipeline.pipe_partitioned / grad_partitioned under pipeline x tensor parallelism
// (zero/pipeline/runtime/runtime.hpp): each tensor-parallel rank sends the next stage 1/T of the
// replicated activation (and the previous stage 1/T of the replicated gradient), the receiving
// stage all-gathers the parts over its tensor-parallel group. P = 2 x T = 2, the example GPT
// (models::TpGpt, no sequence parallelism), 1F1B, SGD with momentum, clipping:
//  - with both keys on, either one on, and both off, every rank's losses and parameters after 3
//    steps are the same bits (the parts reassemble the tensor exactly; the computation is the
//    same), and with them off the run is the one test_pipeline_tensor_parallel checks against a
//    single process;
//  - the bytes each rank sends between stages, counted by a group wrapper on the pipeline's
//    groups (activations up, gradients down; the one-time shape message and the tied weights
//    left out): halved at T = 2 in the direction whose key is on, unchanged in the other;
//  - a stage whose output differs between its tensor-parallel ranks is refused on those ranks
//    naming pipeline.pipe_partitioned, and its neighbour's wait ends within the timeout.
#include <gtest/gtest.h>

#include <ATen/CPUGeneratorImpl.h>

#include <chrono>
#include <cstdio>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "support/forwarding_group.hpp"
#include "support/pipeline_tp_case.hpp"
#include "support/thread_group.hpp"
#include "zero/errors.hpp"
#include "zero/models/gpt.hpp"
#include "zero/models/tp_gpt.hpp"
#include "zero/models/tp_gpt_layers.hpp"
#include "zero/pipeline_engine.hpp"

namespace zero::pipeline {
namespace {

using namespace zero::testing::pipeline_tp;

// Bytes of the schedule's activations and gradients this rank sends, by direction.
struct Bytes {
  std::mutex mu;
  std::map<int, int64_t> activations, gradients;  // by world rank
};

class CountingSends final : public testing::ForwardingGroup {
 public:
  CountingSends(std::shared_ptr<comm::Group> g, int world_rank, std::shared_ptr<Bytes> b)
      : ForwardingGroup(std::move(g)), world_rank_(world_rank), b_(std::move(b)) {}
  comm::Work send(at::Tensor& t, int dst, const std::string& w, int tag) override {
    const int64_t n = t.numel() * static_cast<int64_t>(t.element_size());
    const bool shape = w.find("shape") != std::string::npos;
    const bool tied = w.find("tied") != std::string::npos;
    if (!shape && !tied) {
      std::lock_guard<std::mutex> lock(b_->mu);
      if (w.find("'s activation") != std::string::npos) b_->activations[world_rank_] += n;
      if (w.find("'s gradient") != std::string::npos) b_->gradients[world_rank_] += n;
    }
    return ForwardingGroup::send(t, dst, w, tag);
  }
  std::shared_ptr<comm::Group> split(int color, int key, const std::string& n) override {
    auto sub = ForwardingGroup::split(color, key, n);
    return sub ? std::make_shared<CountingSends>(sub, world_rank_, b_) : nullptr;
  }

 private:
  int world_rank_;
  std::shared_ptr<Bytes> b_;
};

struct Trial {
  std::shared_ptr<Bytes> bytes = std::make_shared<Bytes>();
  std::map<int, std::vector<float>> losses;                 // by world rank
  std::map<int, std::map<std::string, at::Tensor>> params;  // by world rank, its shards
};

constexpr int kWorld = 4;

Trial train(bool acts, bool grads, bool tied) {
  models::GptConfig c = models::gpt_preset("tiny");
  c.tied = tied;
  at::manual_seed(11);
  models::Gpt init(c);
  auto gen = at::detail::createCPUGenerator(23);
  const int rows = kMicroBatches * kRowsPerMicroBatch;
  std::vector<at::Tensor> tokens;
  for (int s = 0; s < 3; ++s)
    tokens.push_back(at::randint(c.vocab, {rows, kSeq + 1}, gen, at::kLong));
  Trial run;
  std::mutex mu;
  testing::run_ranks(kWorld, [&](std::shared_ptr<comm::Group> w) {
    PipelineGrid grid = make_pipeline_grid(w, 2, 2);
    grid.pp = std::make_shared<CountingSends>(comm::of(grid.pp), w->rank(), run.bytes);
    models::TpGpt model(grid.tp, c);
    model->load_full(*init);
    Config cfg = engine_config(Opt::SGD, 2, 2);
    cfg.extra["pipeline.pipe_partitioned"] = acts ? "true" : "false";
    cfg.extra["pipeline.grad_partitioned"] = grads ? "true" : "false";
    PipelineEngine pipe(models::tp_gpt_pipeline_layers(model), models::tp_gpt_loss(grid.tp), cfg,
                        grid);
    std::vector<float> losses;
    for (const auto& t : tokens) {
      auto in = t.narrow(1, 0, kSeq).contiguous().chunk(kMicroBatches, 0);
      auto tg = t.narrow(1, 1, kSeq).contiguous().chunk(kMicroBatches, 0);
      losses.push_back(pipe.train_batch(in, tg).item<float>());
    }
    std::lock_guard<std::mutex> lock(mu);
    run.losses[w->rank()] = losses;
    for (const auto& p : model->named_parameters())
      run.params[w->rank()][p.key()] = p.value().detach().clone();
  });
  return run;
}

void expect_same_training(const Trial& a, const Trial& b) {
  for (int r = 0; r < kWorld; ++r) {
    SCOPED_TRACE("rank " + std::to_string(r));
    EXPECT_EQ(a.losses.at(r), b.losses.at(r));
    for (const auto& [name, t] : a.params.at(r))
      EXPECT_TRUE(at::equal(t, b.params.at(r).at(name))) << name;
  }
}

// World ranks 0, 1: stage 0 (tp ranks 0, 1); 2, 3: stage 1.
TEST(PipelinePartitioned, SplitsTheReplicatedTrafficOverTheTensorRanksWithTheSameTraining) {
  for (bool tied : {false, true}) {
    SCOPED_TRACE(tied ? "tied" : "untied");
    const Trial off = train(false, false, tied), on = train(true, true, tied);
    const Trial acts = train(true, false, tied), grads = train(false, true, tied);
    expect_same_training(off, on);
    expect_same_training(off, acts);
    expect_same_training(off, grads);
    for (int r : {0, 1}) {  // stage 0 sends activations
      const int64_t whole = off.bytes->activations.at(r);
      EXPECT_EQ(whole, 3 * kMicroBatches * kRowsPerMicroBatch * kSeq * 64 * 4);  // [b, s, dim] fp32
      EXPECT_EQ(on.bytes->activations.at(r) * 2, whole);
      EXPECT_EQ(acts.bytes->activations.at(r) * 2, whole);
      EXPECT_EQ(grads.bytes->activations.at(r), whole);
      EXPECT_EQ(off.bytes->gradients.count(r), 0u);
    }
    for (int r : {2, 3}) {  // stage 1 sends gradients
      const int64_t whole = off.bytes->gradients.at(r);
      EXPECT_EQ(whole, 3 * kMicroBatches * kRowsPerMicroBatch * kSeq * 64 * 4);
      EXPECT_EQ(on.bytes->gradients.at(r) * 2, whole);
      EXPECT_EQ(grads.bytes->gradients.at(r) * 2, whole);
      EXPECT_EQ(acts.bytes->gradients.at(r), whole);
    }
  }
}

// A first stage whose output is its tensor-parallel rank's own (x + rank): splitting it would
// reassemble a tensor neither rank holds. Refused on both ranks of that stage before anything is
// sent; the last stage, waiting for the activation, fails within the groups' timeout.
TEST(PipelinePartitioned, RefusesAnActivationTheTensorRanksDoNotShare) {
  std::vector<std::string> errors(kWorld);
  std::vector<double> waited(kWorld, 0);
  testing::run_ranks(
      kWorld,
      [&](std::shared_ptr<comm::Group> w) {
        const PipelineGrid grid = make_pipeline_grid(w, 2, 2);
        const double own = grid.tp_rank;
        std::vector<Layer> layers;
        for (int i = 0; i < 2; ++i) {
          auto lin = torch::nn::Linear(4, 4);
          Layer l{"linear " + std::to_string(i), lin.ptr(), nullptr, {}};
          l.forward = [lin, i, own](const at::Tensor& x) mutable {
            at::Tensor y = lin->forward(x.to(at::kFloat));
            return i == 0 ? y + own : y;
          };
          layers.push_back(std::move(l));
        }
        auto loss = [](const at::Tensor& y, const at::Tensor&) { return y.pow(2).mean(); };
        PipelineEngine pipe(layers, loss, engine_config(Opt::SGD, 2, 2), grid);
        std::vector<at::Tensor> in(kMicroBatches, at::ones({2, 4})),
            tg(kMicroBatches, at::ones({1}));
        const auto t0 = std::chrono::steady_clock::now();
        try {
          pipe.train_batch(in, tg);
        } catch (const std::exception& e) {
          errors[w->rank()] = e.what();
        }
        waited[w->rank()] =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      },
      std::chrono::milliseconds(3000));
  for (int r : {0, 1}) {
    SCOPED_TRACE(errors[r]);
    EXPECT_NE(errors[r].find("pipeline.pipe_partitioned splits chunk 0's activation over the "
                             "tensor-parallel group, but its ranks hold different values"),
              std::string::npos);
    EXPECT_NE(errors[r].find("set pipeline.pipe_partitioned: false"), std::string::npos);
  }
  for (int r = 0; r < kWorld; ++r)
    std::printf("  rank %d failed after %.1f s: %s\n", r, waited[r], errors[r].c_str());
  for (int r : {2, 3}) {
    SCOPED_TRACE(errors[r]);
    EXPECT_NE(errors[r].find("from stage 0"), std::string::npos);
    EXPECT_LT(waited[r], 30.0);
  }
}

}  // namespace
}  // namespace zero::pipeline
