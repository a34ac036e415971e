#include "support/allocator_run.hpp"

#include <ATen/ATen.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>

#include <chrono>
#include <mutex>
#include <thread>

#include "support/thread_group.hpp"
#include "support/tiny_net.hpp"
#include "zero/device.hpp"
#include "zero/engine.hpp"

namespace zero::testing {

// c10d keeps a finished gloo collective's tensors after wait() returned; the engine hands it its
// start-up staging as a view that does not own it (comm/unowned_view.hpp), so what the engine
// let go of is freed, but other threads' transient buffers may still be in flight at a reading.
// So read until the figure holds still: three equal readings 2 ms apart, within two seconds.
int64_t settled_host_allocated_bytes() {
  int64_t last = host_allocated_bytes();
  int same = 0;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(2);
  while (same < 2 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
    const int64_t now = host_allocated_bytes();
    same = now == last ? same + 1 : 0;
    last = now;
  }
  return last;
}

AllocatorRun run_with_allocator_readings(const Config& cfg, int world) {
  AllocatorRun out;
  out.reports.resize(world);
  std::mutex mu;
  const auto make_net = [] {
    torch::nn::Sequential net;
    for (int i = 0; i < 4; ++i) net->push_back(torch::nn::Linear(512, 512));
    return net;
  };
  run_ranks(world, [&](std::shared_ptr<comm::Group> group) {
    // The first initialize in a process also pays once-per-process costs that are not the
    // engine's (the host optimizers' rounding probe runs ATen's fused kernel once; the first
    // parallel ATen call starts OpenMP's team): a throwaway engine pays them before the baseline.
    { auto warm = initialize(make_net().ptr(), cfg, group); }
    torch::nn::Sequential net = make_net();
    at::Tensor x = at::randn({4, 512}), y = at::randn({4, 512});
    if (cfg.bf16) x = x.to(at::kBFloat16);
    const auto read = [&](int64_t& into, const char* what) {
      group->barrier(what);
      if (group->rank() == 0) into = settled_host_allocated_bytes();
      group->barrier("measured");
    };
    read(out.before, "baseline");
    auto engine = initialize(net.ptr(), cfg, group);
    read(out.after_init, "initialized");
    // The first steps also warm up the libraries (MKL's per-thread sgemm buffers: ~1 MiB per
    // rank thread under fp32; gloo's and glibc's per-thread caches, which a CUDA build of torch
    // fills a step later, ~270 KiB). Then eight steps must keep nothing that outlives them: the
    // process-wide figure moves by up to ~600 KiB between two readings (other threads' transient
    // buffers), so a leak shows only summed over several steps.
    for (int step = 0; step < 10; ++step) {
      engine.backward(mse(net->forward(x).to(at::kFloat), y));
      engine.step();
      if (step == 1) read(out.after_warm, "warmed up");
      if (step == 9) read(out.after_steps, "stepped");
    }
    std::lock_guard<std::mutex> lock(mu);
    out.reports[group->rank()] = engine.memory_report();
  });
  return out;
}

}  // namespace zero::testing
