// The pipeline runtime's measured bubble and first-stage activation peak, GPipe vs 1F1B, and
// 1F1B vs interleaved 1F1B with v = 2 chunks per stage (bench/results/pipeline_bubble_cpu.md). P stages as gloo ranks on threads
// (tests/support/thread_group), each stage one layer whose forward takes t_f and whose backward
// takes t_b = 2 t_f of wall time (a sleep, not arithmetic: P threads on a small CPU would
// otherwise share cores and the measured idle time would be the scheduler's, not the
// pipeline's). What is measured is the runtime itself: its instruction lists, the real send/recv
// between stages, the waits. Bubble = 1 - (time a stage spent in its forwards and backwards) /
// (its step's wall time), averaged over stages, over 3 steps after one warm-up, against the
// textbook (P - 1) / (m + P - 1) and zero/pipeline/simulate.hpp's. Interleaved: the stage's work
// split over v layers (chunks) of t_f / v and t_b / v each, against Megatron's (P - 1) / (v m)
// of idle per unit of work, i.e. a fraction (P - 1) / (v m + P - 1) of the step.
//
// Activations: each layer's forward saves one buffer of known size for its backward, allocated
// with a deleter that counts it out when autograd frees it: the peak per stage is the number of
// micro-batches whose activations the runtime held at once (1F1B: min(P - s, m) on stage s,
// GPipe: m).
//
//   build/bench/pipeline-bubble [t_f ms = 10] [interleaved]
#include <ATen/ATen.h>
#include <torch/nn/module.h>
#include <torch/optim/sgd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "support/thread_group.hpp"
#include "zero/pipeline/runtime/runtime.hpp"
#include "zero/pipeline/simulate.hpp"

namespace zero::pipeline {
namespace {

constexpr int64_t kRows = 4, kDim = 256;  // one saved buffer: 4 KiB in fp32

// Nap for `ms` and count the time actually slept (a loaded machine oversleeps: that is busy
// time, not bubble).
void nap(double ms, std::atomic<int64_t>* busy_us) {
  const auto t0 = std::chrono::steady_clock::now();
  std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(ms));
  *busy_us +=
      std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() - t0)
          .count();
}

struct Counter {
  std::atomic<int64_t> live{0}, peak{0}, busy_us{0};
  void add(int64_t n) {
    const int64_t now = live += n;
    int64_t p = peak.load();
    while (now > p && !peak.compare_exchange_weak(p, now)) {
    }
  }
};

// One layer: y = x + keep * w (keep saved for backward, counted), t_f asleep in forward, t_b in
// backward (a hook on the output's gradient).
Layer sleep_layer(double tf_ms, Counter* counter) {
  auto m = std::make_shared<torch::nn::Module>();
  m->register_parameter("w", at::ones({kDim}));
  at::Tensor w = m->named_parameters()["w"];
  Layer l;
  l.name = "sleep";
  l.module = m;
  l.forward = [w, tf_ms, counter](const at::Tensor& in) {
    at::Tensor x = in.is_floating_point() ? in : at::ones({kRows, kDim});
    nap(tf_ms, &counter->busy_us);
    const int64_t bytes = kRows * kDim * 4;
    float* data = static_cast<float*>(std::malloc(bytes));
    for (int64_t i = 0; i < kRows * kDim; ++i) data[i] = 1.0f;
    counter->add(1);
    at::Tensor keep = at::from_blob(
        data, {kRows, kDim},
        [counter](void* p) {
          std::free(p);
          counter->add(-1);
        },
        at::kFloat);
    at::Tensor y = x + keep * w;  // keep is saved for w's gradient
    y.register_hook([tf_ms, counter](const at::Tensor& g) {
      nap(2 * tf_ms, &counter->busy_us);
      return g;
    });
    return y;
  };
  return l;
}

struct Result {
  double bubble = 0;  // 1 - busy / wall, averaged over stages
  double step_ms = 0;
  std::vector<int64_t> peak;  // per stage, micro-batches held at once
};

// v > 1: interleaved, P x v layers of t_f / v; layer i runs on stage i % P and counts there
// (its peak is then in chunk micro-batches).
Result measure(int P, int m, ScheduleKind kind, double tf_ms, int v = 1) {
  std::vector<Counter> counters(P);
  std::vector<double> wall(P, 0);
  testing::run_ranks(P, [&](std::shared_ptr<comm::Group> pp) {
    const int s = pp->rank();
    std::vector<Layer> all;
    for (int i = 0; i < P * v; ++i) all.push_back(sleep_layer(tf_ms / v, &counters[i % P]));
    StageLayers layers(std::move(all), PartitionMethod::Uniform, P, s, 0, v);
    auto opt = std::make_unique<TorchStageOptimizer>(
        std::make_unique<torch::optim::SGD>(layers.parameters(), torch::optim::SGDOptions(0.0)));
    RuntimeOptions opts{kind, m};
    opts.virtual_stages = v;
    PipelineRuntime rt(std::move(layers),
                       [](const at::Tensor& y, const at::Tensor&) { return y.mean(); }, pp,
                       std::move(opt), opts);
    std::vector<at::Tensor> in(m, at::zeros({kRows}, at::kLong)), tg(m, at::zeros({1}));
    rt.train_batch(in, tg);  // warm-up: connections, the shape message
    counters[s].busy_us = 0;
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < 3; ++i) rt.train_batch(in, tg);
    wall[s] =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() /
        3;
  });
  Result r;
  for (int s = 0; s < P; ++s) {
    r.bubble += (1 - counters[s].busy_us.load() / 3e3 / wall[s]) / P;
    r.step_ms = std::max(r.step_ms, wall[s]);
  }
  for (auto& c : counters) r.peak.push_back(c.peak.load());
  return r;
}

}  // namespace
}  // namespace zero::pipeline

int main(int argc, char** argv) {
  using namespace zero::pipeline;
  const double tf = argc > 1 ? std::atof(argv[1]) : 10.0;
  if (argc > 2 && std::string(argv[2]) == "interleaved") {
    const int v = 2;
    std::printf("t_f = %.0f ms, t_b = %.0f ms per stage and micro-batch (interleaved: %d chunks "
                "of t_f / %d, t_b / %d); 3 steps after a warm-up\n\n",
                tf, 2 * tf, v, v, v);
    std::printf(
        "| P | m | (P-1)/(m+P-1) | measured 1F1B | (P-1)/(vm+P-1) | simulated interleaved | "
        "measured interleaved | idle/work 1F1B vs (P-1)/m | idle/work interleaved vs "
        "(P-1)/(vm) | step ms 1F1B / interleaved | activations held on stage 0, 1F1B / "
        "interleaved (micro-batches) |\n"
        "|---|---|---|---|---|---|---|---|---|---|---|\n");
    for (int P : {2, 4}) {
      for (int m : {4, 8, 16}) {
        const double one = double(P - 1) / (m + P - 1), inter = double(P - 1) / (v * m + P - 1);
        const double sim =
            simulate(make_schedule(ScheduleKind::Interleaved, P, m, v)).bubble_fraction;
        const Result f = measure(P, m, ScheduleKind::OneFOneB, tf);
        const Result i = measure(P, m, ScheduleKind::Interleaved, tf, v);
        std::printf(
            "| %d | %d | %.3f | %.3f | %.3f | %.3f | %.3f | %.3f vs %.3f | %.3f vs %.3f | %.0f / "
            "%.0f | %lld / %.1f |\n",
            P, m, one, f.bubble, inter, sim, i.bubble, f.bubble / (1 - f.bubble),
            double(P - 1) / m, i.bubble / (1 - i.bubble), double(P - 1) / (v * m), f.step_ms,
            i.step_ms, (long long)f.peak[0], double(i.peak[0]) / v);
        std::fflush(stdout);
      }
    }
    return 0;
  }
  std::printf("t_f = %.0f ms, t_b = %.0f ms per stage and micro-batch; 3 steps after a warm-up\n\n",
              tf, 2 * tf);
  std::printf(
      "| P | m | (P-1)/(m+P-1) | simulated 1F1B | measured 1F1B | measured GPipe | step ms "
      "1F1B / GPipe | activations held on stage 0, 1F1B / GPipe (micro-batches) |\n"
      "|---|---|---|---|---|---|---|---|\n");
  for (int P : {2, 4}) {
    for (int m : {4, 8, 16}) {
      const double textbook = double(P - 1) / (m + P - 1);
      const double sim = simulate(make_schedule(ScheduleKind::OneFOneB, P, m)).bubble_fraction;
      const Result f = measure(P, m, ScheduleKind::OneFOneB, tf);
      const Result g = measure(P, m, ScheduleKind::GPipe, tf);
      std::printf("| %d | %d | %.3f | %.3f | %.3f | %.3f | %.0f / %.0f | %lld / %lld |\n", P, m,
                  textbook, sim, f.bubble, g.bubble, f.step_ms, g.step_ms, (long long)f.peak[0],
                  (long long)g.peak[0]);
      std::fflush(stdout);
    }
  }
  return 0;
}
