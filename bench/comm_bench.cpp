// comm-bench: times all-reduce, reduce-scatter and all-gather of the same fp32 payload over the
// group torchrun sets up, so the ZeRO traffic model can be checked against the backend.
//
// ZeRO-2's promise is that reduce-scatter moves half of what all-reduce moves. NCCL keeps it;
// gloo emulates reduce-scatter as an all-reduce followed by a slice, so on CPU the two cost the
// same. This benchmark makes that visible next to every CPU figure we publish.
//
//   torchrun --no-python --standalone --nproc-per-node 2 build/bench/comm-bench [numel]
#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "comm/group.hpp"

namespace {

double median_seconds(zero::comm::Group& g, int iters, const std::function<void()>& fn) {
  std::vector<double> t;
  fn();  // warm-up: gloo connects lazily and allocates on first use
  for (int i = 0; i < iters; ++i) {
    g.barrier("comm-bench barrier");
    const auto start = std::chrono::steady_clock::now();
    fn();
    t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  try {
    at::set_num_threads(1);
    const int64_t numel_arg = argc > 1 ? std::atoll(argv[1]) : (int64_t{1} << 24);
    auto group = zero::comm::Group::from_env({});
    const int n = group->size();
    const int64_t numel = (numel_arg + n - 1) / n * n;
    at::Tensor full = at::ones({numel});
    at::Tensor shard = at::empty({numel / n});
    const int iters = 5;
    const double ar = median_seconds(
        *group, iters, [&] { group->all_reduce_sum(full, "bench all_reduce").wait(); });
    const double rs = median_seconds(*group, iters, [&] {
      group->reduce_scatter_sum(shard, full, "bench reduce_scatter").wait();
    });
    const double ag = median_seconds(
        *group, iters, [&] { group->all_gather(full, shard, "bench all_gather").wait(); });
    // The same gather as an all-reduce of a buffer that is zero outside this rank's slot: twice
    // NCCL's all-gather traffic, but gloo's all-reduce is segmented and pipelined where its
    // all-gather is not, so on CPU it can still be the faster of the two.
    const double ag_ar = median_seconds(*group, iters, [&] {
      full.zero_();
      full.narrow(0, group->rank() * (numel / n), numel / n).copy_(shard);
      group->all_reduce_sum(full, "bench all_gather as all_reduce").wait();
    });
    if (group->rank() == 0) {
      const double mb = static_cast<double>(numel) * 4 / 1e6;
      std::printf(
          "{\"world_size\": %d, \"payload_mb\": %.1f, \"all_reduce_s\": %.6f, "
          "\"reduce_scatter_s\": %.6f, \"all_gather_s\": %.6f, \"all_gather_as_all_reduce_s\": %.6f, "
          "\"reduce_scatter_over_all_reduce\": %.3f, \"nccl_model_ratio\": 0.5}\n",
          n, mb, ar, rs, ag, ag_ar, rs / ar);
    }
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "comm-bench: error: %s\n", e.what());
    return 1;
  }
}
