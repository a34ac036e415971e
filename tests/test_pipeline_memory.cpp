// The pipeline runtime's memory over a step, measured by the fake accelerator's allocator (each
// stage on its own device index, exact to the byte): 1F1B holds at most P - s micro-batches'
// activations on stage s whatever the number of micro-batches m (PipeDream-Flush's promise, what
// Megatron-LM's forward_backward_pipelining_without_interleaving keeps), GPipe holds all m.
//
// Before the runtime freed its buffers as they stopped being needed, every micro-batch's sent
// output and sent input gradient stayed referenced until the step's ReduceGrads, so 1F1B's peak
// grew by one or two buffers per micro-batch (not measured here against the old code).

// The model is cut so each stage's per-micro-batch bytes are known: one block per stage,
// Linear -> ReLU -> Linear, on rows x width fp32 activations (one "buffer", B bytes). While a
// micro-batch is in flight on stage s its graph keeps the block's input (received from the
// previous stage; on stage 0 the caller's input, not the runtime's) and ReLU's output. Its
// output's data goes right after the send (Megatron's deallocate_output_tensor), and the send's
// buffer once a later message shows the next stage had it (in 1F1B the gradient of the micro-
// batch before: one output in flight); a sent input gradient likewise (one in flight).
#include <gtest/gtest.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/sgd.h>

#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "comm/group.hpp"
#include "support/fake_device.hpp"
#include "support/thread_group.hpp"
#include "zero/pipeline/runtime/runtime.hpp"

namespace zero::pipeline {
namespace {

constexpr int64_t kRows = 32, kWidth = 128;
constexpr int64_t kBuffer = kRows * kWidth * 4;  // one micro-batch's activation, fp32

struct Block : torch::nn::Module {
  Block() {
    fc1 = register_module("fc1", torch::nn::Linear(kWidth, kWidth));
    fc2 = register_module("fc2", torch::nn::Linear(kWidth, kWidth));
  }
  at::Tensor forward(const at::Tensor& x) { return fc2(at::relu(fc1(x))); }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
};

// What one micro-batch's graph holds on stage s while in flight: its input (received; stage 0's
// is the caller's) and ReLU's output.
int64_t per_micro_batch(int stage) { return (stage == 0 ? 1 : 2) * kBuffer; }

// Beyond what one micro-batch holds at m = 1: one output and one input gradient in their sends,
// a Linear's weight and bias gradients computed anew to be added into the accumulated ones (the
// second micro-batch on), and the step's scalars (the loss).
constexpr int64_t kInFlightBuffers = 2 * kBuffer + (kWidth * kWidth + kWidth) * 4 + 1024;

// Receives are posted one compute step early (RuntimeOptions::early_receives): at most one more
// receive buffer per direction this stage receives in (activations unless first, gradients
// unless last), whatever m.
int64_t early_receive_buffers(int stage, int stages) {
  return ((stage > 0) + (stage < stages - 1)) * kBuffer;
}

struct Peak {
  int64_t above_start = 0;  // the step's peak less what was allocated when it started
  int64_t param_bytes = 0;  // the stage's parameters (their gradients appear in the step)
};

// The peak of the second step (the first may settle one-time allocations) on every stage. `v`
// chunks per stage (interleaved): one block per chunk.
std::vector<Peak> measure(int stages, ScheduleKind kind, int m, int v = 1) {
  std::vector<Peak> out(stages);
  testing::run_ranks(
      stages,
      [&](std::shared_ptr<comm::Group> pp) {
        const int s = pp->rank();
        const c10::Device device = testing::fake::device(s);
        at::manual_seed(11);  // every stage draws every block, keeps its own
        std::vector<Layer> all;
        for (int i = 0; i < stages * v; ++i) {
          auto block = std::make_shared<Block>();
          all.push_back({"block " + std::to_string(i), block,
                         [block](const at::Tensor& x) { return block->forward(x); },
                         {}});
        }
        StageLayers layers(std::move(all), PartitionMethod::Uniform, stages, s, 0, v);
        layers.to(device);
        for (const auto& p : layers.parameters()) out[s].param_bytes += p.numel() * 4;
        auto opt = std::make_unique<TorchStageOptimizer>(
            std::make_unique<torch::optim::SGD>(layers.parameters(), torch::optim::SGDOptions(0.01)));
        LossFn loss = [](const at::Tensor& y, const at::Tensor& t) { return at::mse_loss(y, t); };
        RuntimeOptions opts{kind, m};
        opts.virtual_stages = v;
        PipelineRuntime rt(std::move(layers), loss, pp, std::move(opt), opts);
        std::vector<at::Tensor> in, tg;
        for (int i = 0; i < m; ++i) {
          in.push_back(at::randn({kRows, kWidth}).to(device));
          tg.push_back(at::randn({kRows, kWidth}).to(device));
        }
        for (int step = 0; step < 2; ++step) {
          testing::fake::reset_peak(s);
          const int64_t start = testing::fake::allocated_bytes(s);
          rt.train_batch(s == 0 ? in : std::vector<at::Tensor>{},
                         s == stages - 1 ? tg : std::vector<at::Tensor>{});
          out[s].above_start = testing::fake::peak_bytes(s) - start;
        }
      },
      std::chrono::seconds(60), testing::fake::device().type());
  return out;
}

TEST(PipelineMemory, OneFOneBHoldsStagesLessSMicroBatchesWhateverTheirNumber) {
  for (int stages : {2, 4}) {
    // m = 1: one micro-batch in flight and the step's fixed costs (the parameters' gradients, a
    // backward's temporaries), measured. m = 8 and 32: past the warm-up on every stage.
    const auto one = measure(stages, ScheduleKind::OneFOneB, 1);
    const auto few = measure(stages, ScheduleKind::OneFOneB, 8);
    const auto many = measure(stages, ScheduleKind::OneFOneB, 32);
    for (int s = 0; s < stages; ++s) {
      SCOPED_TRACE("P = " + std::to_string(stages) + ", stage " + std::to_string(s));
      std::printf("  1f1b P=%d stage %d: peak above the step's start %lld (m = 1), %lld (m = 8), "
                  "%lld (m = 32) bytes; one micro-batch %lld\n",
                  stages, s, static_cast<long long>(one[s].above_start),
                  static_cast<long long>(few[s].above_start),
                  static_cast<long long>(many[s].above_start),
                  static_cast<long long>(per_micro_batch(s)));
      // Flat in m: within one micro-batch's bytes (the runtime frees at fixed points of the
      // schedule, so the device's peak does not depend on timing).
      EXPECT_LT(std::abs(many[s].above_start - few[s].above_start), per_micro_batch(s));
      // P - s micro-batches in flight: P - s - 1 more than at m = 1, and the buffers above.
      const int64_t bound = one[s].above_start + (stages - s - 1) * per_micro_batch(s) +
                            kInFlightBuffers + early_receive_buffers(s, stages);
      EXPECT_LE(many[s].above_start, bound);
      EXPECT_LE(few[s].above_start, bound);
    }
  }
}

// Interleaved 1F1B (v = 2 chunks per stage) keeps 1F1B's promise: what a stage holds does not
// grow with m. Measured at m = 8 and 32 (multiples of P); the peak differs by less than one
// chunk's micro-batch. Each chunk's in-flight micro-batch holds 2 buffers (its received input
// and ReLU's output), so a peak growing with m would add 24 x 2 buffers at the least.
TEST(PipelineMemory, InterleavedHoldsABoundedNumberOfMicroBatchesWhateverTheirNumber) {
  for (int stages : {2, 4}) {
    const auto few = measure(stages, ScheduleKind::Interleaved, 8, 2);
    const auto many = measure(stages, ScheduleKind::Interleaved, 32, 2);
    for (int s = 0; s < stages; ++s) {
      SCOPED_TRACE("P = " + std::to_string(stages) + ", stage " + std::to_string(s));
      std::printf("  interleaved v=2 P=%d stage %d: peak above the step's start %lld (m = 8), "
                  "%lld (m = 32) bytes; one chunk's micro-batch %lld\n",
                  stages, s, static_cast<long long>(few[s].above_start),
                  static_cast<long long>(many[s].above_start),
                  static_cast<long long>(2 * kBuffer));
      EXPECT_LT(std::abs(many[s].above_start - few[s].above_start), 2 * kBuffer);
    }
  }
}

// GPipe runs every forward before any backward: its peak grows by at least the graph's saved
// bytes per micro-batch, as it should.
TEST(PipelineMemory, GPipeHoldsEveryMicroBatch) {
  const int stages = 2;
  const auto few = measure(stages, ScheduleKind::GPipe, 4);
  const auto many = measure(stages, ScheduleKind::GPipe, 16);
  for (int s = 0; s < stages; ++s) {
    SCOPED_TRACE("stage " + std::to_string(s));
    std::printf("  gpipe P=%d stage %d: peak above the step's start %lld (m = 4), %lld (m = 16)\n",
                stages, s, static_cast<long long>(few[s].above_start),
                static_cast<long long>(many[s].above_start));
    EXPECT_GE(many[s].above_start - few[s].above_start, 12 * per_micro_batch(s));
  }
}

}  // namespace
}  // namespace zero::pipeline
