// The pipeline runtime's peak memory per stage over one step, 1F1B vs GPipe, for m micro-batches
// per step (bench/results/pipeline_memory_cpu.md). The example GPT (tiny preset) cut into P
// stages, each a gloo rank on a thread (tests/support/thread_group) with its layers on its own
// device of the tests' fake accelerator (tests/support/fake_device): that allocator counts each
// stage's bytes exactly, as CUDA's max_memory_allocated would on one GPU per stage. Also the
// same run on the host, where the stages share one process: the host allocator's peak in use,
// all stages together (what the process's RSS follows; gloo's send Works hold their tensors).
//
// Peak = the most bytes allocated during the second step less those allocated when it started
// (the parameters, the first step's optimizer state and the inputs are there before): the
// step's activations, gradients and buffers in flight. 1F1B holds min(P - s, m) micro-batches
// on stage s, so its peak should be flat in m; GPipe holds all m.
//
//   build/bench/pipeline-memory [rows per micro-batch = 4] [seq = 64]
#include <ATen/ATen.h>
#include <torch/optim/sgd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "support/fake_device.hpp"
#include "support/thread_group.hpp"
#include "zero/host_counting.hpp"
#include "zero/models/gpt.hpp"
#include "zero/models/gpt_layers.hpp"
#include "zero/pipeline/runtime/runtime.hpp"

namespace zero::pipeline {
namespace {

struct Result {
  std::vector<int64_t> stage_peak;  // fake device, per stage
  int64_t host_peak = 0;            // host run, every stage together
};

// One configuration, on the fake accelerator (device = true) or the host.
void run(int P, ScheduleKind kind, int m, int rows, int seq, bool device, Result& out) {
  models::GptConfig c = models::gpt_preset("tiny");
  c.layers = 4;  // one block per stage at P = 4
  at::manual_seed(5);
  models::Gpt init(c);
  auto gen = at::randint(c.vocab, {m * rows, seq + 1}, at::kLong);
  const at::Tensor inputs = gen.narrow(1, 0, seq).contiguous();
  const at::Tensor targets = gen.narrow(1, 1, seq).contiguous();
  out.stage_peak.assign(P, 0);
  auto& host = HostCountingAllocator::get();
  testing::run_ranks(
      P,
      [&](std::shared_ptr<comm::Group> pp) {
        const int s = pp->rank();
        const c10::Device dev = device ? testing::fake::device(s) : c10::Device(c10::kCPU);
        models::Gpt model(c);
        {
          at::NoGradGuard g;
          auto src = init->parameters();
          auto dst = model->parameters();
          for (size_t i = 0; i < src.size(); ++i) dst[i].copy_(src[i]);
        }
        StageLayers layers(models::gpt_pipeline_layers(model), PartitionMethod::Uniform, P, s);
        layers.to(dev);
        auto opt = std::make_unique<TorchStageOptimizer>(std::make_unique<torch::optim::SGD>(
            layers.parameters(), torch::optim::SGDOptions(0.01).momentum(0.9)));
        PipelineRuntime rt(std::move(layers), models::gpt_loss, pp, std::move(opt), {kind, m});
        std::vector<at::Tensor> in, tg;
        for (const auto& t : inputs.chunk(m, 0)) in.push_back(t.to(dev));
        for (const auto& t : targets.chunk(m, 0)) tg.push_back(t.to(dev));
        for (int step = 0; step < 2; ++step) {
          const bool measured_host = step == 1 && !device;
          int64_t start = 0;
          if (measured_host) {
            // Every stage at the start of the step before the host's peak restarts.
            pp->barrier("bench: start of the measured step");
            if (s == 0) {
              host.reset_peak();
              start = host.in_use();
            }
            pp->barrier("bench: peak reset");
          } else if (device) {
            testing::fake::reset_peak(s);
            start = testing::fake::allocated_bytes(s);
          }
          rt.train_batch(s == 0 ? in : std::vector<at::Tensor>{},
                         s == P - 1 ? tg : std::vector<at::Tensor>{});
          if (device) out.stage_peak[s] = testing::fake::peak_bytes(s) - start;
          if (measured_host) {
            pp->barrier("bench: end of the measured step");
            if (s == 0) out.host_peak = host.peak() - start;
          }
        }
      },
      std::chrono::seconds(300), device ? testing::fake::device().type() : c10::DeviceType::CPU);
}

std::string kib(int64_t b) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.0f", b / 1024.0);
  return buf;
}

}  // namespace
}  // namespace zero::pipeline

int main(int argc, char** argv) {
  using namespace zero::pipeline;
  const int rows = argc > 1 ? std::atoi(argv[1]) : 4;
  const int seq = argc > 2 ? std::atoi(argv[2]) : 64;
  zero::HostCountingAllocator::get();  // before any tensor the runs make
  std::printf("GPT tiny preset with 4 blocks, %d rows x %d tokens per micro-batch, SGD; peak of "
              "the second step above its start, KiB\n\n",
              rows, seq);
  std::printf("| schedule | P | m | per stage on its device (fake accelerator), stage 0 .. P-1 | "
              "host, all stages (CPU run) |\n|---|---|---|---|---|\n");
  for (auto kind : {ScheduleKind::OneFOneB, ScheduleKind::GPipe})
    for (int P : {2, 4})
      for (int m : {8, 16, 64}) {
        Result dev, host;
        run(P, kind, m, rows, seq, true, dev);
        run(P, kind, m, rows, seq, false, host);
        std::string stages;
        for (int s = 0; s < P; ++s) stages += (s ? " / " : "") + kib(dev.stage_peak[s]);
        std::printf("| %s | %d | %d | %s | %s |\n", std::string(schedule_name(kind)).c_str(), P, m,
                    stages.c_str(), kib(host.host_peak).c_str());
        std::fflush(stdout);
      }
  return 0;
}
