// Host syncs on the hot path, counted by the fake accelerator (support/fake_device.hpp,
// host_reads: each copy to the host, item() and data-dependent operator a GPU would make the host
// wait for), and the pipeline's fixed activation shape.
//
// A pipeline step queues its work without waiting for the device: the activation's shape travels
// once, at the first step (one read on each receiving stage), and the loss comes back as a device
// tensor. Before, each step read the shape on every stage after the first and the loss on every
// stage (2 reads a step on stage 1 of 2, 1 on stage 0; bench/results/host_syncs_cpu.md).
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/sgd.h>

#include <chrono>
#include <mutex>
#include <string>
#include <vector>

#include "comm/group.hpp"
#include "comm/mesh.hpp"
#include "support/fake_device.hpp"
#include "support/thread_group.hpp"
#include "zero/models/gpt.hpp"
#include "zero/models/gpt_layers.hpp"
#include "zero/pipeline/runtime/runtime.hpp"
#include "zero/pipeline_engine.hpp"

namespace zero::pipeline {
namespace {

namespace fake = testing::fake;

// The counter itself: what it must see and what it must not, so that a zero below means
// something.
TEST(HostSyncs, TheCounterSeesEveryReadAndNoTransport) {
  const c10::Device dev = fake::device(0);
  const at::Tensor t = at::arange(6, at::TensorOptions(at::kFloat).device(dev));
  int64_t before = fake::host_reads(0);
  const at::Tensor u = (t * 2 + 1).sum();  // kernels: run on the host by the fallback, not reads
  EXPECT_EQ(fake::host_reads(0), before);
  EXPECT_EQ(u.cpu().item<float>(), 36.0f);  // the copy is the read; item() on the host copy not
  EXPECT_EQ(fake::host_reads(0), before + 1);
  EXPECT_EQ(u.item<float>(), 36.0f);
  EXPECT_EQ(fake::host_reads(0), before + 2);
  EXPECT_TRUE(t.equal(t.clone()));
  EXPECT_EQ(fake::host_reads(0), before + 3);
  // Queued into page-locked memory: not a wait (a GPU reads it later, after an event).
  const int64_t queued = fake::async_host_copies(0);
  at::Tensor pinned = at::empty({6}, at::TensorOptions(at::kFloat).pinned_memory(true));
  pinned.copy_(t, /*non_blocking=*/true);
  EXPECT_EQ(fake::host_reads(0), before + 3);
  EXPECT_EQ(fake::async_host_copies(0), queued + 1);
  // Into pageable memory a non_blocking copy still waits.
  at::empty({6}).copy_(t, /*non_blocking=*/true);
  EXPECT_EQ(fake::host_reads(0), before + 4);

  // A staged group's copies to the host are transport (NCCL moves the tensor device to device).
  std::vector<int64_t> reads(2), after(2);
  testing::run_ranks(
      2,
      [&](std::shared_ptr<comm::Group> g) {
        const int r = g->rank();
        at::Tensor x =
            at::full({4}, r + 1.0, at::TensorOptions(at::kFloat).device(fake::device(r)));
        reads[r] = fake::host_reads(r);
        g->all_reduce_sum(x, "all-reduce").wait();
        at::Tensor y = at::empty_like(x);
        if (r == 0) g->send(x, 1, "send").wait();
        if (r == 1) g->recv(y, 0, "recv").wait();
        after[r] = fake::host_reads(r);
        EXPECT_EQ(x.cpu()[0].item<float>(), 3.0f);  // and reading the result is a read
      },
      std::chrono::seconds(30), fake::device().type());
  EXPECT_EQ(after[0], reads[0]);
  EXPECT_EQ(after[1], reads[1]);
}

constexpr int kSteps = 5, kRows = 2, kSeq = 16, kMicroBatches = 4;

// The example GPT cut in 2 stages on fake:0 and fake:1, trained by the ZeRO engine (stage 1,
// AdamW, clipping: the step's norm and verdict stay on the device); the reads each step makes on
// each stage.
std::vector<std::vector<int64_t>> pipeline_reads(const std::string& optimizer) {
  std::vector<std::vector<int64_t>> reads(2, std::vector<int64_t>(kSteps + 1));
  const models::GptConfig c = models::gpt_preset("tiny");
  testing::run_ranks(
      2,
      [&](std::shared_ptr<comm::Group> w) {
        comm::Mesh mesh = comm::Mesh::megatron(w, /*tp=*/1, /*pp=*/2);
        const int rank = w->rank();
        const c10::Device device = fake::device(rank);
        at::manual_seed(3);
        models::Gpt model(c);
        model->to(device);
        Config cfg;
        cfg.zero_optimization.stage = 1;
        cfg.train_micro_batch_size_per_gpu = kRows;
        cfg.gradient_accumulation_steps = kMicroBatches;
        cfg.gradient_clipping = 0.5;
        cfg.optimizer.type = optimizer;
        cfg.optimizer.lr = 1e-2;
        cfg.pipeline.stages = 2;
        PipelineEngine pipe(models::gpt_pipeline_layers(model), models::gpt_loss, cfg, mesh["pp"],
                            mesh["dp"]);
        std::vector<at::Tensor> losses;
        for (int step = 0; step < kSteps; ++step) {
          std::vector<at::Tensor> in, tg;
          for (int m = 0; m < kMicroBatches; ++m) {
            in.push_back(at::randint(c.vocab, {kRows, kSeq}, at::kLong).to(device));
            tg.push_back(at::randint(c.vocab, {kRows, kSeq}, at::kLong).to(device));
          }
          const int64_t before = fake::host_reads(rank);
          losses.push_back(pipe.train_batch(in, tg));
          reads[rank][step] = fake::host_reads(rank) - before;
        }
        // Reading the losses is the one read (a trainer's print step).
        const int64_t before = fake::host_reads(rank);
        const at::Tensor all = at::stack(losses).cpu();
        reads[rank][kSteps] = fake::host_reads(rank) - before;
        EXPECT_EQ(losses.back().device(), device);
        EXPECT_TRUE(at::isfinite(all).all().item<bool>());
      },
      std::chrono::seconds(60), fake::device().type());
  return reads;
}

TEST(HostSyncs, PipelineSteadyStateStepReadsNothingFromTheDevice) {
  for (const char* optimizer : {"SGD", "AdamW"}) {
    SCOPED_TRACE(optimizer);
    const auto reads = pipeline_reads(optimizer);
    for (int s = 0; s < 2; ++s) {
      for (int step = 0; step <= kSteps; ++step)
        std::printf("  %s stage %d %s: %lld host reads\n", optimizer, s,
                    step < kSteps ? ("step " + std::to_string(step + 1)).c_str() : "loss read",
                    static_cast<long long>(reads[s][step]));
    }
    // Step 1: the receiving stage reads the activation's shape, once. Step 2: the engine's
    // buckets take the gradients' arrival order seen in step 1, agreed over dp with one read on
    // each rank (zero/grads/grad_order.cpp, once per run, as DDP rebuilds its buckets once).
    EXPECT_EQ(reads[0][0], 0);
    EXPECT_EQ(reads[1][0], 1);
    EXPECT_EQ(reads[0][1], 1);
    EXPECT_EQ(reads[1][1], 1);
    // Every step after: nothing on either stage.
    for (int step = 2; step < kSteps; ++step) {
      EXPECT_EQ(reads[0][step], 0) << "stage 0, step " << step + 1;
      EXPECT_EQ(reads[1][step], 0) << "stage 1, step " << step + 1;
    }
    EXPECT_EQ(reads[0][kSteps], 1);
    EXPECT_EQ(reads[1][kSteps], 1);
  }
}

// ---- fixed activation shapes ----------------------------------------------------------------

constexpr int64_t kWidth = 8;

struct Block : torch::nn::Module {
  Block() { fc = register_module("fc", torch::nn::Linear(kWidth, kWidth)); }
  torch::nn::Linear fc{nullptr};
};

struct ShapeRun {
  std::vector<std::string> errors;         // per stage, "" when none
  std::vector<std::vector<float>> losses;  // per stage
  std::vector<float> reference;            // one process, the same weights
  std::vector<double> seconds;             // per stage, until it returned or threw
};

// Two stages of one Linear each (SGD at lr 0: the weights stay, so each step's loss has a
// single-process reference), trained on batches of `rows[i]` rows per micro-batch in step i.
ShapeRun run_shapes(const std::vector<int64_t>& rows, bool dynamic_shape) {
  ShapeRun out;
  out.errors.resize(2);
  out.losses.resize(2);
  out.seconds.resize(2);
  at::manual_seed(5);
  std::vector<std::shared_ptr<Block>> blocks{std::make_shared<Block>(), std::make_shared<Block>()};
  std::vector<std::vector<at::Tensor>> inputs, targets;
  for (int64_t r : rows) {
    inputs.push_back(at::randn({2 * r, kWidth}).chunk(2, 0));
    targets.push_back(at::randn({2 * r, kWidth}).chunk(2, 0));
    at::NoGradGuard no_grad;
    double sum = 0;
    for (int m = 0; m < 2; ++m)
      sum += at::mse_loss(blocks[1]->fc(blocks[0]->fc(inputs.back()[m])), targets.back()[m])
                 .item<double>();
    out.reference.push_back(static_cast<float>(sum / 2));
  }
  std::mutex mu;
  testing::run_ranks(
      2,
      [&](std::shared_ptr<comm::Group> pp) {
        const int s = pp->rank();
        const c10::Device device = fake::device(s);
        const auto t0 = std::chrono::steady_clock::now();
        try {
          std::vector<Layer> all;
          for (int i = 0; i < 2; ++i) {
            auto block = std::make_shared<Block>();
            block->fc->weight.data().copy_(blocks[i]->fc->weight);
            block->fc->bias.data().copy_(blocks[i]->fc->bias);
            all.push_back({"block " + std::to_string(i),
                           block,
                           [block](const at::Tensor& x) { return block->fc(x); },
                           {}});
          }
          StageLayers layers(std::move(all), PartitionMethod::Uniform, 2, s);
          layers.to(device);
          auto opt = std::make_unique<TorchStageOptimizer>(std::make_unique<torch::optim::SGD>(
              layers.parameters(), torch::optim::SGDOptions(0.0)));
          LossFn loss = [](const at::Tensor& y, const at::Tensor& t) { return at::mse_loss(y, t); };
          RuntimeOptions opts{ScheduleKind::OneFOneB, 2};
          opts.dynamic_shape = dynamic_shape;
          PipelineRuntime rt(std::move(layers), loss, pp, std::move(opt), opts);
          for (size_t i = 0; i < rows.size(); ++i) {
            std::vector<at::Tensor> in, tg;
            for (int m = 0; m < 2; ++m) {
              in.push_back(inputs[i][m].to(device));
              tg.push_back(targets[i][m].to(device));
            }
            const float l = rt.train_batch(in, tg).item<float>();
            std::lock_guard<std::mutex> lock(mu);
            out.losses[s].push_back(l);
          }
        } catch (const std::exception& e) {
          std::lock_guard<std::mutex> lock(mu);
          out.errors[s] = e.what();
        }
        out.seconds[s] =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      },
      std::chrono::seconds(5), fake::device().type());
  return out;
}

TEST(PipelineShapes, FixedShapesTrainEveryStepFromOneShapeMessage) {
  const ShapeRun run = run_shapes({4, 4, 4}, false);
  for (int s = 0; s < 2; ++s) {
    ASSERT_EQ(run.errors[s], "") << "stage " << s;
    ASSERT_EQ(run.losses[s].size(), 3u);
    for (size_t i = 0; i < 3; ++i) EXPECT_NEAR(run.losses[s][i], run.reference[i], 1e-6);
  }
}

// A later step's activation of another shape: the sender says so, naming both shapes and the
// stages, before it sends anything the receiver would take for the announced shape; the receiver
// fails within its comm timeout (5 s here) instead of hanging or computing on garbage.
TEST(PipelineShapes, ALaterStepOfAnotherShapeIsRefusedByTheSenderNamingBothShapes) {
  const ShapeRun run = run_shapes({4, 3}, false);
  const std::string& e = run.errors[0];
  EXPECT_NE(e.find("pipeline stage 0 of 2"), std::string::npos) << e;
  EXPECT_NE(e.find("step 2, micro-batch 0"), std::string::npos) << e;
  EXPECT_NE(e.find("[3, 8] Float"), std::string::npos) << e;
  EXPECT_NE(e.find("[4, 8] Float"), std::string::npos) << e;
  EXPECT_NE(e.find("stage 1 receives every activation"), std::string::npos) << e;
  EXPECT_NE(e.find("dynamic_shape"), std::string::npos) << e;
  EXPECT_EQ(run.losses[0].size(), 1u);  // step 1 trained
  EXPECT_NE(run.errors[1], "") << "the receiving stage must fail, not hang";
  EXPECT_LT(run.seconds[1], 30);
  std::printf("  sender: %s\n  receiver (%.1f s): %s\n", e.c_str(), run.seconds[1],
              run.errors[1].c_str());
}

// Variable shapes (sequence lengths) with dynamic_shape: each micro-batch's shape travels with
// it, and every step's loss is the single-process one.
TEST(PipelineShapes, DynamicShapesCarryEachMicroBatchsShape) {
  const ShapeRun run = run_shapes({4, 3, 5}, true);
  for (int s = 0; s < 2; ++s) {
    ASSERT_EQ(run.errors[s], "") << "stage " << s;
    ASSERT_EQ(run.losses[s].size(), 3u);
    for (size_t i = 0; i < 3; ++i) EXPECT_NEAR(run.losses[s][i], run.reference[i], 1e-6);
  }
}

}  // namespace
}  // namespace zero::pipeline
