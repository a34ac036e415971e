// Exposed point-to-point wait per step of the pipeline runtime, receives posted early
// (RuntimeOptions::early_receives, the default) against each posted at its own instruction and
// waited on at once (what the runtime did before), in paired runs: the two alternate, so the
// machine's load drifts over both alike (bench/results/pipeline_p2p_cpu.md).
//
// P stages as gloo ranks on threads (tests/support/thread_group), 1F1B, each stage one layer
// whose forward sleeps t_f and backward 2 t_f (sleep, not arithmetic: the stage's thread leaves
// the core to gloo's, as a GPU stage leaves the host to the communication stream) and whose
// activation is `mib` MiB of fp32, so a message takes real time on gloo's loopback. Exposed wait
// = the step's time in send / receive instructions (StepTimes::comm_s: posting, and waiting for
// what has not arrived, the pipeline's bubble included), averaged over stages and over 3 steps
// after a warm-up step.
//
//   build/bench/pipeline-p2p [t_f ms = 20] [MiB = 8] [pairs = 5]
#include <ATen/ATen.h>
#include <torch/nn/module.h>
#include <torch/optim/sgd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <vector>

#include "support/thread_group.hpp"
#include "zero/pipeline/runtime/runtime.hpp"

namespace zero::pipeline {
namespace {

void nap(double ms) { std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(ms)); }

Layer sleep_layer(double tf_ms, int64_t numel) {
  auto m = std::make_shared<torch::nn::Module>();
  at::Tensor w = m->register_parameter("w", at::ones({1}));
  Layer l;
  l.name = "sleep";
  l.module = m;
  l.forward = [w, tf_ms, numel](const at::Tensor& in) {
    at::Tensor x = in.is_floating_point() ? in : at::ones({numel});
    nap(tf_ms);
    at::Tensor y = x * w;
    y.register_hook([tf_ms](const at::Tensor& g) {
      nap(2 * tf_ms);
      return g;
    });
    return y;
  };
  return l;
}

struct Result {
  double comm_ms = 0;  // per step, averaged over stages
  double step_ms = 0;  // per step, the slowest stage's wall time
};

Result measure(int P, int m, double tf_ms, int64_t numel, bool early) {
  std::vector<double> comm(P, 0), wall(P, 0);
  testing::run_ranks(P, [&](std::shared_ptr<comm::Group> pp) {
    const int s = pp->rank();
    std::vector<Layer> all;
    for (int i = 0; i < P; ++i) all.push_back(sleep_layer(tf_ms, numel));
    StageLayers layers(std::move(all), PartitionMethod::Uniform, P, s);
    auto opt = std::make_unique<TorchStageOptimizer>(
        std::make_unique<torch::optim::SGD>(layers.parameters(), torch::optim::SGDOptions(0.0)));
    RuntimeOptions opts{ScheduleKind::OneFOneB, m};
    opts.early_receives = early;
    PipelineRuntime rt(
        std::move(layers), [](const at::Tensor& y, const at::Tensor&) { return y.mean(); }, pp,
        std::move(opt), opts);
    std::vector<at::Tensor> in(m, at::zeros({1}, at::kLong)), tg(m, at::zeros({1}));
    rt.train_batch(in, tg);  // warm-up: connections, the shape message
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < 3; ++i) {
      rt.train_batch(in, tg);
      comm[s] += rt.last_times().comm_s * 1e3 / 3;
    }
    wall[s] =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() /
        3;
  });
  Result r;
  for (int s = 0; s < P; ++s) {
    r.comm_ms += comm[s] / P;
    r.step_ms = std::max(r.step_ms, wall[s]);
  }
  return r;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

}  // namespace
}  // namespace zero::pipeline

int main(int argc, char** argv) {
  using namespace zero::pipeline;
  const double tf = argc > 1 ? std::atof(argv[1]) : 20.0;
  const double mib = argc > 2 ? std::atof(argv[2]) : 8.0;
  const int pairs = argc > 3 ? std::atoi(argv[3]) : 5;
  const int64_t numel = static_cast<int64_t>(mib * 1024 * 1024 / 4);
  std::printf(
      "1F1B, t_f = %.0f ms, t_b = %.0f ms, activation %.1f MiB fp32; %d pairs of runs "
      "(at each instruction, early), 3 steps each after a warm-up\n\n",
      tf, 2 * tf, mib, pairs);
  std::printf(
      "| P | m | exposed p2p ms/step at the instruction | early | step ms at the instruction | "
      "early | pairs where early was lower |\n|---|---|---|---|---|---|---|\n");
  for (int P : {2, 4}) {
    for (int m : {4, 8}) {
      std::vector<double> late_c, early_c, late_s, early_s;
      int better = 0;
      for (int i = 0; i < pairs; ++i) {
        // Alternate which goes first, so neither always meets a warmer machine.
        Result a, b;
        if (i % 2 == 0) {
          a = measure(P, m, tf, numel, false);
          b = measure(P, m, tf, numel, true);
        } else {
          b = measure(P, m, tf, numel, true);
          a = measure(P, m, tf, numel, false);
        }
        late_c.push_back(a.comm_ms);
        early_c.push_back(b.comm_ms);
        late_s.push_back(a.step_ms);
        early_s.push_back(b.step_ms);
        better += b.comm_ms < a.comm_ms;
      }
      std::printf("| %d | %d | %.1f | %.1f | %.0f | %.0f | %d of %d |\n", P, m, median(late_c),
                  median(early_c), median(late_s), median(early_s), better, pairs);
      std::fflush(stdout);
    }
  }
  return 0;
}
