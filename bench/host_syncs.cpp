// Host syncs per training step, counted by the tests' fake accelerator (tests/support/
// fake_device.hpp: each copy to the host, item() and data-dependent operator that would make the
// host wait for a GPU; a staged group's transport copies and queued copies into page-locked
// memory excluded). Two ranks as threads, rank r on fake:r, the example GPT's tiny preset:
//  - plain: the trainer's step (examples/trainer_loop.cpp run_step): per micro-batch forward,
//    engine.backward(loss), engine.step(), the loss summed on the device; ZeRO-1 and 2 over dp 2;
//  - pipeline: PipelineEngine::train_batch at P = 2 (dp 1), ZeRO-1.
// AdamW with clipping, 4 micro-batches per step. Prints one markdown table: the reads of each
// step on each rank (bench/results/host_syncs_cpu.md). Builds against any version of the
// pipeline's train_batch (float or tensor): it never reads the result.
//
//   build/bench/host-syncs
#include <ATen/ATen.h>

#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "comm/group.hpp"
#include "comm/mesh.hpp"
#include "support/fake_device.hpp"
#include "support/thread_group.hpp"
#include "zero/models/gpt.hpp"
#include "zero/models/gpt_layers.hpp"
#include "zero/pipeline_engine.hpp"
#include "zero/zero.hpp"

namespace {

using namespace zero;
namespace fake = zero::testing::fake;

constexpr int kSteps = 5, kRows = 2, kSeq = 16, kMicroBatches = 4;

Config config(int zero_stage, int stages) {
  Config c;
  c.zero_optimization.stage = zero_stage;
  c.train_micro_batch_size_per_gpu = kRows;
  c.gradient_accumulation_steps = kMicroBatches;
  c.gradient_clipping = 0.5;
  c.optimizer.type = "AdamW";
  c.optimizer.lr = 1e-3;
  c.pipeline.stages = stages;
  return c;
}

std::vector<at::Tensor> tokens(int64_t vocab, c10::Device d) {
  std::vector<at::Tensor> v;
  for (int m = 0; m < kMicroBatches; ++m) v.push_back(at::randint(vocab, {kRows, kSeq}).to(d));
  return v;
}

using Reads = std::vector<std::vector<int64_t>>;  // [rank][step]

Reads plain(int zero_stage) {
  Reads reads(2, std::vector<int64_t>(kSteps));
  const models::GptConfig c = models::gpt_preset("tiny");
  testing::run_ranks(
      2,
      [&](std::shared_ptr<comm::Group> g) {
        const int r = g->rank();
        const c10::Device d = fake::device(r);
        at::manual_seed(1);
        models::Gpt model(c);
        model->to(d);
        Engine engine = initialize(model.ptr(), config(zero_stage, 1), g);
        at::Tensor loss_sum = at::zeros({1}, at::TensorOptions(at::kFloat).device(d));
        for (int step = 0; step < kSteps; ++step) {
          const auto in = tokens(c.vocab, d), tg = tokens(c.vocab, d);
          const int64_t before = fake::host_reads(r);
          for (int m = 0; m < kMicroBatches; ++m) {
            const at::Tensor l = model->loss(in[m], tg[m]);
            loss_sum += l.detach().reshape({1});
            engine.backward(l);
            engine.step();
          }
          reads[r][step] = fake::host_reads(r) - before;
        }
      },
      std::chrono::seconds(120), fake::device().type());
  return reads;
}

Reads pipelined() {
  Reads reads(2, std::vector<int64_t>(kSteps));
  const models::GptConfig c = models::gpt_preset("tiny");
  testing::run_ranks(
      2,
      [&](std::shared_ptr<comm::Group> w) {
        comm::Mesh mesh = comm::Mesh::megatron(w, /*tp=*/1, /*pp=*/2);
        const int r = w->rank();
        const c10::Device d = fake::device(r);
        at::manual_seed(1);
        models::Gpt model(c);
        model->to(d);
        pipeline::PipelineEngine pipe(models::gpt_pipeline_layers(model), models::gpt_loss,
                                      config(1, 2), mesh["pp"], mesh["dp"]);
        for (int step = 0; step < kSteps; ++step) {
          const auto in = tokens(c.vocab, d), tg = tokens(c.vocab, d);
          const int64_t before = fake::host_reads(r);
          (void)pipe.train_batch(in, tg);
          reads[r][step] = fake::host_reads(r) - before;
        }
      },
      std::chrono::seconds(120), fake::device().type());
  return reads;
}

void row(const char* what, const char* rank, const std::vector<int64_t>& v) {
  std::printf("| %s | %s |", what, rank);
  for (int64_t n : v) std::printf(" %lld |", static_cast<long long>(n));
  std::printf("\n");
}

}  // namespace

int main() {
  std::printf("| step of | rank |");
  for (int s = 1; s <= kSteps; ++s) std::printf(" step %d |", s);
  std::printf("\n|---|---|");
  for (int s = 1; s <= kSteps; ++s) std::printf("---|");
  std::printf("\n");
  for (int stage : {1, 2}) {
    const Reads r = plain(stage);
    const std::string what = "plain trainer, ZeRO-" + std::to_string(stage) + ", dp 2";
    row(what.c_str(), "0", r[0]);
    row(what.c_str(), "1", r[1]);
  }
  const Reads p = pipelined();
  row("pipeline train_batch, P 2, ZeRO-1", "stage 0", p[0]);
  row("pipeline train_batch, P 2, ZeRO-1", "stage 1", p[1]);
  return 0;
}
