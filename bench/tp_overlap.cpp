// What the overlapped backward of the column-parallel layers hides: forward + backward of the
// tensor-parallel example GPT timed with ColumnParallelLinearOptions::overlap_comm on and off, in
// pairs (on, off, on, off, ...: the machine's drift falls on both), ranks as threads over gloo as
// in the tests. Prints one markdown row: the median step time of each, the median of the
// pairs' ratios (on / off; below 1: the overlap hides communication), and the exposed
// communication of each: rank 0's time inside the tensor-parallel collectives' waits per step
// (a group wrapper times every Work::wait; forward and backward together). On a 2-core CPU the
// ranks' compute and gloo's threads share the cores, so little can hide. The figure that matters is
// a GPU's, where the collectives run on NCCL's stream; this program cannot take it (ranks are
// threads over gloo on the CPU, and NCCL needs a GPU per rank) and none has been taken: the
// 2-GPU tensor-parallel runs prepared in scripts/gpu-check.sh check NCCL's results, not time.
//
//   tp-overlap --model gpt-25m --tp 2 --sp 0 --batch 2 --seq 128 --pairs 5
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "support/forwarding_group.hpp"
#include "support/thread_group.hpp"
#include "zero/models/tp_gpt.hpp"
#include "zero/tensor_parallel.hpp"

namespace {

// Hands every collective to the inner group and adds the time spent in its Work's wait to
// `waited_s`: the communication the rank's compute did not hide.
class WaitTimingGroup final : public zero::testing::ForwardingGroup {
 public:
  using ForwardingGroup::ForwardingGroup;
  zero::comm::Work all_reduce_sum(at::Tensor& t, const std::string& what) override {
    return timed(inner().all_reduce_sum(t, what));
  }
  zero::comm::Work reduce_scatter_sum(at::Tensor& out, at::Tensor& in,
                                      const std::string& what) override {
    return timed(inner().reduce_scatter_sum(out, in, what));
  }
  zero::comm::Work all_gather(at::Tensor& out, at::Tensor& in, const std::string& what) override {
    return timed(inner().all_gather(out, in, what));
  }
  double waited_s = 0;

 private:
  zero::comm::Work timed(zero::comm::Work inner) {
    auto work = std::make_shared<zero::comm::Work>(std::move(inner));
    return zero::comm::Work([this, work] {
      const auto start = std::chrono::steady_clock::now();
      work->wait();
      waited_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    });
  }
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  std::map<std::string, std::string> arg = {{"--model", "gpt-25m"}, {"--tp", "2"},
                                            {"--sp", "0"},          {"--batch", "2"},
                                            {"--seq", "128"},       {"--pairs", "5"}};
  for (int i = 1; i + 1 < argc; i += 2) arg[argv[i]] = argv[i + 1];
  const int tp = std::stoi(arg["--tp"]), pairs = std::stoi(arg["--pairs"]);
  const bool sp = arg["--sp"] == "1";
  const int64_t batch = std::stoll(arg["--batch"]), seq = std::stoll(arg["--seq"]);
  zero::models::GptConfig cfg = zero::models::gpt_preset(arg["--model"]);
  cfg.max_seq = std::max(cfg.max_seq, seq);
  zero::models::check_tensor_parallel_shape(cfg, tp);

  std::vector<double> on, off, ratio, wait_on, wait_off;
  zero::testing::run_ranks(
      tp,
      [&](std::shared_ptr<zero::comm::Group> inner) {
        auto timing = std::make_shared<WaitTimingGroup>(inner);
        std::shared_ptr<zero::comm::Group> g = timing;
        zero::models::TpGpt model(g, cfg, sp);
        std::vector<zero::tensor_parallel::ColumnParallelLinearImpl*> columns;
        for (const auto& m : model->modules())
          if (auto* c = dynamic_cast<zero::tensor_parallel::ColumnParallelLinearImpl*>(m.get()))
            columns.push_back(c);
        at::Generator gen = at::detail::createCPUGenerator(5);
        const at::Tensor tokens = at::randint(cfg.vocab, {batch, seq}, gen);
        const at::Tensor targets = (tokens * 3 + 1) % cfg.vocab;
        double waited = 0;  // the last step's
        auto step = [&](bool overlap) {
          for (auto* c : columns) c->set_overlap_comm(overlap);
          g->barrier("tp-overlap step");
          timing->waited_s = 0;
          const auto start = std::chrono::steady_clock::now();
          at::Tensor loss = model->loss(tokens, targets);
          loss.backward();
          waited = timing->waited_s;
          g->barrier("tp-overlap step end");
          model->zero_grad();
          return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        };
        step(true);  // warm-up: first-touch allocations, gloo's connections
        for (int p = 0; p < pairs; ++p) {
          const double a = step(true), wa = waited;
          const double b = step(false), wb = waited;
          if (g->rank() == 0) {
            on.push_back(a), off.push_back(b), ratio.push_back(a / b);
            wait_on.push_back(wa), wait_off.push_back(wb);
          }
        }
      },
      std::chrono::minutes(10));
  std::printf("| %s | %d | %s | %lld x %lld | %d | %.3f | %.3f | %.3f | %.3f | %.3f |\n",
              arg["--model"].c_str(), tp, sp ? "yes" : "no", (long long)batch, (long long)seq,
              pairs, median(on), median(off), median(ratio), median(wait_on), median(wait_off));
  return 0;
}
