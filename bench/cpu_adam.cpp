// cpu-adam: the offload optimizer's AdamW step on one rank's host shard, against torch's CPU
// AdamW variants and the memory bandwidth, side by side in one run.
//
//   build/bench/cpu-adam [numel] [--threads T] [--host-threads H]
//   (default: 100M elements, torch's threads; H: the offload optimizer's own thread count,
//   zero_optimization.offload_optimizer.threads, 0 = torch's)
//
// Variants, each the median of several steps on the same fp32 shard (weight decay on):
//   ours+bf16   optim::make_cpu_adamw, update and the bf16 copy of the new weights in one pass
//               (what an offloaded step does: 16 bytes read, 14 written per element)
//   ours        the same without the bf16 copy (28 bytes)
//   fused       at::_fused_adamw_ (28 bytes); fused+bf16 adds the cast as a second pass
//   foreach     torch.optim.AdamW(foreach=True)'s op sequence (at::_foreach_*), the shard as
//               100 parameters
//   torch       torch::optim::AdamW::step (the C++ API: op by op, no foreach flag)
//   *           with grad_scale 3, a scale that is no power of two (what the engine passes while
//               clipping is active): a true division per element (ATen also writes the
//               unscaled gradient back, 4 bytes per element the B/el column does not count)
//   bound       the fastest of copy_, a threaded memcpy and an in-place add, in bytes read +
//               written per second; % bound = the row's bytes per second / that
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/optim/adamw.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "optim/cpu_adamw.hpp"

namespace {

double median_seconds(int iters, const std::function<void()>& fn) {
  fn();  // warm-up: pages touched, clones dispatched
  std::vector<double> t;
  for (int i = 0; i < iters; ++i) {
    const auto start = std::chrono::steady_clock::now();
    fn();
    t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

constexpr double lr = 1e-3, b1 = 0.9, b2 = 0.999, eps = 1e-8, wd = 0.01;

}  // namespace

int main(int argc, char** argv) {
  int64_t n = 100'000'000;
  int host_threads = 0;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--threads") && i + 1 < argc) {
      at::set_num_threads(std::stoi(argv[++i]));
    } else if (!std::strcmp(argv[i], "--host-threads") && i + 1 < argc) {
      host_threads = std::stoi(argv[++i]);
    } else {
      n = std::stoll(argv[i]);
    }
  }
  at::NoGradGuard no_grad;
  const auto f32 = at::TensorOptions().dtype(at::kFloat);
  const int iters = 5;
  std::printf("%lld fp32 elements, %d threads (ours: %d), median of %d steps\n\n",
              static_cast<long long>(n), at::get_num_threads(),
              host_threads > 0 ? host_threads : at::get_num_threads(), iters);

  // The bound: the fastest of three ways to move bytes (read + write counted), on buffers of
  // 15 bytes per element each way (the bf16 variant's 30), large enough that no cache helps:
  // Tensor::copy_, memcpy split over torch's threads, and an in-place add (reads 2/3, writes
  // 1/3 into lines it read, like AdamW's 16 + 14).
  double copy_bw = 0;
  {
    at::Tensor src = at::rand({n * 15 / 4}, f32), dst = at::zeros_like(src);
    const double moved = 2.0 * src.nbytes();
    const double copy_s = median_seconds(iters, [&] { dst.copy_(src); });
    const char* from = static_cast<const char*>(src.data_ptr());
    char* to = static_cast<char*>(dst.data_ptr());
    const double memcpy_s = median_seconds(iters, [&] {
      at::parallel_for(0, src.nbytes(), 1 << 22,
                       [&](int64_t b, int64_t e) { std::memcpy(to + b, from + b, e - b); });
    });
    at::Tensor x = at::rand({n * 10 / 4}, f32), y = at::rand({n * 10 / 4}, f32);
    const double add_s = median_seconds(iters, [&] { x.add_(y); });
    const double add_moved = 3.0 * x.nbytes();
    std::printf(
        "bandwidth (read + write): copy_ %.2f GB/s, parallel memcpy %.2f GB/s, add_ %.2f GB/s\n\n",
        moved / copy_s / 1e9, moved / memcpy_s / 1e9, add_moved / add_s / 1e9);
    copy_bw = std::max({moved / copy_s, moved / memcpy_s, add_moved / add_s});
  }
  struct Row {
    std::string name;
    double seconds;
    double bytes;  // per element, the least the variant must move
  };
  std::vector<Row> rows;
  at::Tensor p0 = at::randn({n}, f32), g = at::randn({n}, f32);

  {
    zero::optim::AdamWOptions o{b1, b2, eps, wd};
    auto opt = zero::optim::make_cpu_adamw(o, n, {{0, n}}, f32, {host_threads, false});
    at::Tensor p = p0.clone(), out = at::empty({n}, f32.dtype(at::kBFloat16));
    rows.push_back({"ours+bf16",
                    median_seconds(iters,
                                   [&] {
                                     opt->begin_step(p, g, lr);
                                     opt->update_to(p, g, lr, {}, {0, n}, out);
                                   }),
                    30});
    rows.push_back({"ours", median_seconds(iters, [&] { opt->step(p, g, lr); }), 28});
    // With an active clip the scale is no power of two: a true division per element.
    const at::Tensor scale = at::full({1}, 3.0f), no_inf = at::zeros({1});
    rows.push_back({"ours+bf16*",
                    median_seconds(iters,
                                   [&] {
                                     opt->begin_step(p, g, lr);
                                     opt->update_to(p, g, lr, {scale, no_inf}, {0, n}, out);
                                   }),
                    30});
  }
  {
    at::Tensor p = p0.clone(), m = at::zeros({n}, f32), v = at::zeros({n}, f32);
    at::Tensor st = at::zeros({}, f32), out = at::empty({n}, f32.dtype(at::kBFloat16));
    const auto step = [&] {
      st.add_(1);
      at::_fused_adamw_({p}, {g}, {m}, {v}, {}, {st}, lr, b1, b2, wd, eps, false, false);
    };
    rows.push_back({"fused", median_seconds(iters, step), 28});
    rows.push_back({"fused+bf16",
                    median_seconds(iters,
                                   [&] {
                                     step();
                                     out.copy_(p);
                                   }),
                    30});
    // The same with grad_scale 3, as the engine passes it under clipping (ATen also writes the
    // unscaled gradient back: 4 bytes more per element, not counted; g3 shrinks by 3 a step).
    const at::Tensor scale = at::full({1}, 3.0f);
    at::Tensor g3 = g.clone();
    rows.push_back({"fused+bf16*",
                    median_seconds(iters,
                                   [&] {
                                     st.add_(1);
                                     at::_fused_adamw_({p}, {g3}, {m}, {v}, {}, {st}, lr, b1, b2,
                                                       wd, eps, false, false, scale);
                                     out.copy_(p);
                                   }),
                    30});
  }
  {
    // torch/optim/adamw.py _multi_tensor_adamw, fp32 on CPU, 100 parameters.
    at::Tensor p = p0.clone(), m = at::zeros({n}, f32), v = at::zeros({n}, f32);
    const std::vector<at::Tensor> ps = p.chunk(100), gs = g.chunk(100), ms = m.chunk(100),
                                  vs = v.chunk(100);
    int64_t t = 0;
    rows.push_back({"foreach",
                    median_seconds(iters,
                                   [&] {
                                     ++t;
                                     const double bc1 = 1 - std::pow(b1, t);
                                     const double bc2s = std::sqrt(1 - std::pow(b2, t));
                                     at::_foreach_mul_(ps, 1 - lr * wd);
                                     at::_foreach_lerp_(ms, gs, 1 - b1);
                                     at::_foreach_mul_(vs, b2);
                                     at::_foreach_addcmul_(vs, gs, gs, 1 - b2);
                                     auto denom = at::_foreach_sqrt(vs);
                                     at::_foreach_div_(denom, bc2s);
                                     at::_foreach_add_(denom, eps);
                                     at::_foreach_addcdiv_(ps, ms, denom, -lr / bc1);
                                   }),
                    28});
  }
  {
    at::Tensor param = p0.clone();
    param.mutable_grad() = g.clone();
    torch::optim::AdamW adamw(
        {param}, torch::optim::AdamWOptions(lr).betas({b1, b2}).eps(eps).weight_decay(wd));
    rows.push_back({"torch", median_seconds(iters, [&] { adamw.step(); }), 28});
  }

  double foreach_s = 0;
  for (const Row& r : rows) {
    if (r.name == "foreach") foreach_s = r.seconds;
  }
  std::printf(
      "| step        | time (ms) | Gelem/s | GB/s (B/el) | %% of copy bound | x foreach |\n");
  std::printf("|---|---|---|---|---|---|\n");
  for (const Row& r : rows) {
    const double gbs = r.bytes * n / r.seconds / 1e9;
    std::printf("| %-11s | %9.1f | %7.3f | %6.2f (%2.0f) | %14.0f%% | %8.2f |\n", r.name.c_str(),
                r.seconds * 1e3, n / r.seconds / 1e9, gbs, r.bytes, 100.0 * gbs * 1e9 / copy_bw,
                foreach_s / r.seconds);
  }
  std::printf("| bound       |           |         | %6.2f      |            100%% |          |\n",
              copy_bw / 1e9);
  return 0;
}
