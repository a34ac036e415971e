// optim-step: one optimizer step (AdamW) on one rank's flat fp32 shard, against the memory
// bandwidth it needs, side by side in one run.
//
//   build/bench/optim-step [numel ...] [--device cuda]      (default: 25M and 100M elements)
//
// Variants, each timed as the median of several steps on the same shard:
//   before      the engine's previous step: fp64 norm (a shard-sized fp64 copy) + .item(),
//               g.mul_(scale), then AdamW op by op (torch::optim::AdamW's sequence, denom scratch)
//   ours        the engine's step now: fp32 norm on the device, clip coefficient and unscale
//               folded into grad_scale, optim::make_adamw (ATen's fused kernel), no host read
//   torch       torch::optim::AdamW::step on the same shard as one parameter
//   fused       at::_fused_adamw_ alone (no norm)
//   copy, add_  28 bytes per element moved by a copy and by an in-place add: the bandwidth bound
//               is the faster of the two; % of bound = bound time / variant time
// Bytes per element: what each variant reads and writes at least (fused 28, ours 28 + 4 for
// the norm); the op-by-op forms move far more (counted per op in the table's note).
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

#include "optim/adamw.hpp"

namespace {

double median_seconds(int iters, const at::Device& dev, const std::function<void()>& fn) {
  const auto sync = [&] {
    if (dev.is_cuda()) at::empty({1}, at::TensorOptions().device(dev)).cpu();
  };
  fn();  // warm-up
  sync();
  std::vector<double> t;
  for (int i = 0; i < iters; ++i) {
    const auto start = std::chrono::steady_clock::now();
    fn();
    sync();
    t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

void row(const char* name, double s, double copy_s, double bytes_per_elem, int64_t n) {
  std::printf("| %-6s | %9.2f | %8.1f | %6.0f%% | %5.1f |\n", name, s * 1e3,
              bytes_per_elem * n / s / 1e9, 100.0 * copy_s / s, bytes_per_elem);
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<int64_t> sizes;
  at::Device dev = at::kCPU;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--device") && i + 1 < argc) {
      dev = at::Device(argv[++i]);
    } else {
      sizes.push_back(std::stoll(argv[i]));
    }
  }
  if (sizes.empty()) sizes = {25'000'000, 100'000'000};
  at::NoGradGuard no_grad;
  const auto f32 = at::TensorOptions().dtype(at::kFloat).device(dev);
  const int iters = dev.is_cuda() ? 20 : 5;
  const double lr = 1e-3, b1 = 0.9, b2 = 0.999, eps = 1e-8, wd = 0.01, clip = 1.0;
  std::printf("device %s, %d threads, median of %d steps\n", dev.str().c_str(),
              at::get_num_threads(), iters);
  for (const int64_t n : sizes) {
    std::printf("\n%lld elements (fp32)\n", static_cast<long long>(n));
    std::printf("| step   | time (ms) | GB/s eff | %% bound | B/el |\n|---|---|---|---|---|\n");
    // Two ways to move the 28 bytes per element fused AdamW moves: a copy (reads 14, writes
    // 14; on CPU the destination's cache lines are also read first, write-allocate) and an
    // in-place add (reads 2/3, writes 1/3 into lines it read, like AdamW's 16 + 12). The bound
    // is the faster of the two.
    double copy_s = 0, add_s = 0;
    {
      at::Tensor src = at::rand({n * 7 / 2}, f32), dst = at::zeros_like(src);
      copy_s = median_seconds(iters, dev, [&] { dst.copy_(src); });
    }
    {
      at::Tensor x = at::rand({n * 7 / 3}, f32), y = at::rand({n * 7 / 3}, f32);
      add_s = median_seconds(iters, dev, [&] { x.add_(y); });
    }
    const double copy_only_s = copy_s;
    copy_s = std::min(copy_s, add_s);
    at::Tensor p = at::randn({n}, f32), g = at::randn({n}, f32);
    {
      at::Tensor m = at::zeros({n}, f32), v = at::zeros({n}, f32), denom = at::empty({n}, f32);
      at::Tensor gw = g.clone();
      int64_t step = 0;
      const double t = median_seconds(iters, dev, [&] {
        const double norm = std::sqrt(
            at::linalg_vector_norm(gw, 2, {}, false, at::kDouble).square().item<double>());
        gw.mul_(std::min(1.0, clip / (norm + 1e-6)));
        ++step;
        p.mul_(1 - lr * wd);
        m.mul_(b1).add_(gw, 1 - b1);
        v.mul_(b2).addcmul_(gw, gw, 1 - b2);
        at::sqrt_out(denom, v);
        denom.div_(std::sqrt(1 - std::pow(b2, step))).add_(eps);
        p.addcdiv_(m, denom, -(lr / (1 - std::pow(b1, step))));
      });
      // norm: read 4 + fp64 copy write 8 + read 8; mul_ 8; decay 8; m 12 (mul) + 12 (add);
      // v 8 + 16; sqrt 8; div 8; add 8; addcdiv 16 -> ~132 bytes per element
      row("before", t, copy_s, 132, n);
    }
    {
      zero::optim::AdamWOptions o;
      o.beta1 = b1;
      o.beta2 = b2;
      o.eps = eps;
      o.weight_decay = wd;
      auto opt = zero::optim::make_adamw(o, n, {{0, n}}, f32);
      at::Tensor divisor = at::full({1}, 2.0, f32);
      const double t = median_seconds(iters, dev, [&] {
        at::Tensor sq = at::linalg_vector_norm(g, 2).square().reshape({1});
        at::Tensor found_inf = sq.isfinite().logical_not().to(at::kFloat);
        at::Tensor norm = sq.sqrt() / divisor;
        at::Tensor coef = at::clamp_max(clip / (norm + 1e-6), 1.0);
        opt->step(p, g, lr, {divisor / coef, found_inf});
      });
      row("ours", t, copy_s, 32, n);
    }
    {
      at::Tensor param = p.clone();
      param.mutable_grad() = g.clone();
      torch::optim::AdamW adamw(
          {param}, torch::optim::AdamWOptions(lr).betas({b1, b2}).eps(eps).weight_decay(wd));
      const double t = median_seconds(iters, dev, [&] { adamw.step(); });
      row("torch", t, copy_s, 108, n);
    }
    {
      at::Tensor m = at::zeros({n}, f32), v = at::zeros({n}, f32), st = at::zeros({}, f32);
      const double t = median_seconds(iters, dev, [&] {
        st.add_(1);
        at::_fused_adamw_({p}, {g}, {m}, {v}, {}, {st}, lr, b1, b2, wd, eps, false, false);
      });
      row("fused", t, copy_s, 28, n);
    }
    row("copy", copy_only_s, copy_s, 28, n);
    row("add_", add_s, copy_s, 28, n);
  }
  return 0;
}
