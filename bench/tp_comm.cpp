// Bytes one tensor-parallel rank sends per training step of the tensor-parallel example GPT,
// counted at its group (comm::CountingGroup around each rank's gloo group; ranks are threads, as
// in the tests), beside the planner's accounting (zero::tp_comm_per_step, parallel_plan.hpp:
// Megatron's 4 all-reduces of b·s·h per block, or with sequence parallelism 4 all-gathers + 4
// reduce-scatters, plus the embedding, the head, the loss and the norms' gradients). One step:
// forward, backward and under SP the norms' gradient all-reduce; the optimizer and the
// data-parallel group communicate nothing over the tensor-parallel group
// (tests/test_tensor_parallel_comm.cpp checks that through the engine). One markdown row per run:
//
//   tp-comm --model gpt-50m --tp 2 --sp 0 --batch 1 --seq 128
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <map>
#include <string>

#include "comm/counting_group.hpp"
#include "support/thread_group.hpp"
#include "zero/models/tp_gpt.hpp"
#include "zero/parallel_plan.hpp"
#include "zero/tensor_parallel.hpp"

int main(int argc, char** argv) {
  std::map<std::string, std::string> arg = {
      {"--model", "gpt-50m"}, {"--tp", "2"}, {"--sp", "0"}, {"--batch", "1"}, {"--seq", "128"}};
  for (int i = 1; i + 1 < argc; i += 2) arg[argv[i]] = argv[i + 1];
  const int tp = std::stoi(arg["--tp"]);
  const bool sp = arg["--sp"] == "1";
  const int64_t batch = std::stoll(arg["--batch"]), seq = std::stoll(arg["--seq"]);
  zero::models::GptConfig cfg = zero::models::gpt_preset(arg["--model"]);
  cfg.max_seq = std::max(cfg.max_seq, seq);
  zero::models::check_tensor_parallel_shape(cfg, tp);

  zero::PlanInput in;
  in.shape = {cfg.layers, cfg.dim, cfg.heads, cfg.ffn_dim(), cfg.vocab, cfg.tied, cfg.kv_heads};
  in.num_params = cfg.num_params();
  in.world_size = tp;
  in.tensor_parallel = tp;
  in.sequence_parallel = sp;
  in.micro_batch = batch;
  in.seq_len = seq;
  in.param_bytes = 4;  // fp32
  const zero::TpCommStep want = zero::tp_comm_per_step(in, zero::Recompute::kNone, 0);

  zero::comm::CountingGroup::Count got[3];
  double seconds = 0;
  zero::testing::run_ranks(
      tp,
      [&](std::shared_ptr<zero::comm::Group> g) {
        auto counted = std::make_shared<zero::comm::CountingGroup>(g);
        zero::models::TpGpt model(counted, cfg, sp);
        at::Generator gen = at::detail::createCPUGenerator(5);
        const at::Tensor tokens = at::randint(cfg.vocab, {batch, seq}, gen);
        const at::Tensor targets = (tokens * 3 + 1) % cfg.vocab;
        const auto start = std::chrono::steady_clock::now();
        at::Tensor loss = model->loss(tokens, targets);
        loss.backward();
        zero::tensor_parallel::all_reduce_partial_grads(model->placements(), *counted);
        if (g->rank() != 0) return;
        seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        const auto counts = counted->counts();
        const char* ops[] = {"all_reduce", "all_gather", "reduce_scatter"};
        for (int i = 0; i < 3; ++i) {
          if (counts.count(ops[i])) got[i] = counts.at(ops[i]);
        }
      },
      std::chrono::minutes(10));

  const zero::TpCommVolume w[] = {want.all_reduce, want.all_gather, want.reduce_scatter};
  int64_t sent = 0, calls = 0, want_calls = 0;
  for (int i = 0; i < 3; ++i) sent += got[i].sent, calls += got[i].calls, want_calls += w[i].calls;
  // Megatron's per-block term alone: 4 all-reduces of b·s·h·4 bytes per block.
  const int64_t bsh = batch * seq * cfg.dim * 4;
  const int64_t blocks = cfg.layers * 4 * (2 * bsh * (tp - 1) / tp);
  std::printf(
      "| %s | %d | %s | %lld x %lld | %lld / %lld | %.3f | %.3f | %.3f | %.1f%% | %s | %.1f |\n",
      arg["--model"].c_str(), tp, sp ? "yes" : "no", (long long)batch, (long long)seq,
      (long long)calls, (long long)want_calls, sent / 1048576.0, want.sent() / 1048576.0,
      blocks / 1048576.0, 100.0 * blocks / static_cast<double>(want.sent()),
      sent == want.sent() && calls == want_calls ? "equal" : "DIFFERENT", seconds);
  return sent == want.sent() && calls == want_calls ? 0 : 1;
}
