// zero-memory's tensor- and pipeline-parallel tables (see zero_memory_parallel.hpp).
#include "zero_memory_parallel.hpp"

#include <cstdio>

namespace zero::tools {
namespace {

constexpr Recompute kModes[] = {Recompute::kNone, Recompute::kCheckpoint,
                                Recompute::kCheckpointOffload};

std::string layout_name(const ParallelLayout& l) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "pp %d x dp %d x tp %d", l.pp, l.dp, l.tp);
  return buf;
}

const char* short_recompute(Recompute r) {
  static const char* const names[] = {"none", "ckpt", "ckpt+offload"};
  return names[static_cast<int>(r)];
}

void print_header(const PlanInput& in, const std::string& name, const ParallelLayout& l) {
  std::printf(
      "zero-memory: %s, Ψ = %lld parameters, %d ranks = %s (Megatron order: tp innermost, "
      "then dp, then pp)\n",
      name.c_str(), (long long)in.num_params, in.world_size, layout_name(l).c_str());
  std::printf(
      "  sequence parallelism %s, %s schedule over %lld micro-batches of %lld x %lld "
      "tokens; GB = 10^9 bytes (parallel_plan.hpp has the model)\n",
      in.sequence_parallel ? "on" : "off", schedule_name(in.schedule), (long long)in.accumulation,
      (long long)in.micro_batch, (long long)in.seq_len);
}

std::string gb(int64_t bytes) { return format_gb(bytes); }

}  // namespace

void print_parallel_report(const PlanInput& in, const std::string& name, const PlanLimits& limits,
                           const LayoutHardware& hardware, Recompute recompute) {
  const ParallelLayout l = parallel_layout(in);
  print_header(in, name, l);
  const int stages = l.pp > 1 ? 2 : 3;  // no ZeRO-2 with a pipeline
  std::printf("\n  %-44s", "per-rank memory, worst pipeline stage");
  for (int s = 0; s < 3; ++s) std::printf("      stage %d", s);
  std::printf("\n");
  RankPlan plans[3][3];
  for (int s = 0; s < stages; ++s) {
    for (int r = 0; r < 3; ++r) plans[s][r] = plan_parallel_rank(in, s, kModes[r]);
  }
  auto row = [&](const char* label, auto value) {
    std::printf("  %-44s", label);
    for (int s = 0; s < 3; ++s) {
      std::printf(" %12s", s < stages ? gb(value(s)).c_str() : "n/a");
    }
    std::printf("\n");
  };
  row("parameters on the rank (count x bytes)", [&](int s) { return plans[s][0].states.params; });
  row("gradients", [&](int s) { return plans[s][0].states.grads; });
  row("fp32 master weights", [&](int s) { return plans[s][0].states.master; });
  row("optimizer states", [&](int s) { return plans[s][0].states.optimizer; });
  row("bucket buffers", [&](int s) { return plans[s][0].states.comm_buffers; });
  row("= model states", [&](int s) { return plans[s][0].states.total(); });
  for (int r = 0; r < 3; ++r) {
    const std::string label = std::string("total, ") + recompute_name(kModes[r]);
    row(label.c_str(), [&](int s) { return plans[s][r].total(); });
  }
  std::printf("  parameters per rank: %lld on pipeline stage 0", (long long)rank_params(in, 0));
  if (l.pp > 1) {
    std::printf(", %lld on stage %d", (long long)rank_params(in, l.pp - 1), l.pp - 1);
  }
  std::printf("; the first stage holds %d micro-batches of activations at its peak\n",
              in_flight_micro_batches(in, 0));
  if (l.pp > 1)
    std::printf("  ZeRO stage 2 is not offered with a pipeline (DeepSpeed refuses it)\n");
  std::printf("  budget per rank %s (%s - %.0f%% reserve): ", gb(limits.budget()).c_str(),
              gb(limits.device_bytes).c_str(), 100 * limits.reserve);
  bool any = false;
  for (int r = 0; r < 3 && !any; ++r) {
    for (int s = 0; s < stages && !any; ++s) {
      if (plans[s][r].total() <= limits.budget()) {
        std::printf("stage %d with %s fits at micro-batch %lld\n", s, recompute_name(kModes[r]),
                    (long long)in.micro_batch);
        any = true;
      }
    }
  }
  if (!any) std::printf("nothing fits at micro-batch %lld\n", (long long)in.micro_batch);

  const ParallelHardware hw = hardware(l);
  std::printf("\n  predicted step time, %s; links: tp %s, dp %s, stages %s\n",
              recompute_name(recompute), hw.tp.name.c_str(), hw.dp.name.c_str(),
              hw.p2p.name.c_str());
  std::printf("  %-44s", "per step, seconds");
  for (int s = 0; s < 3; ++s) std::printf("      stage %d", s);
  std::printf("\n");
  ParallelTime t[3];
  for (int s = 0; s < stages; ++s) t[s] = predict_parallel_step_time(in, s, recompute, hw);
  auto trow = [&](const char* label, const char* f, auto value) {
    std::printf("  %-44s", label);
    for (int s = 0; s < 3; ++s) {
      char buf[32] = "n/a";
      if (s < stages) std::snprintf(buf, sizeof buf, f, value(t[s]));
      std::printf(" %12s", buf);
    }
    std::printf("\n");
  };
  trow("compute (forward + backward + recompute)", "%.4g",
       [](const ParallelTime& e) { return e.forward_s + e.backward_s + e.recompute_s; });
  trow("tensor-parallel collectives", "%.4g", [](const ParallelTime& e) { return e.tp_comm_s; });
  trow("stage-boundary sends", "%.4g", [](const ParallelTime& e) { return e.p2p_s; });
  trow("pipeline bubble", "%.4g", [](const ParallelTime& e) { return e.bubble_s; });
  if (l.pp > 1)
    trow("  bubble fraction (of the pipelined part)", "%.4f",
         [](const ParallelTime& e) { return e.bubble_fraction; });
  trow("data-parallel gradients, exposed", "%.4g",
       [](const ParallelTime& e) { return e.grad_comm_exposed_s; });
  trow("parameter all-gather", "%.4g", [](const ParallelTime& e) { return e.param_gather_s; });
  trow("optimizer step", "%.4g", [](const ParallelTime& e) { return e.optimizer_s; });
  trow("= step", "%.4g", [](const ParallelTime& e) { return e.step_s; });
  if (!t[0].stage_compute_s.empty()) {
    std::printf("  stages cut by %s (pipeline.partition): compute per stage",
                partition_name(in.partition));
    for (double c : t[0].stage_compute_s) std::printf(" %.4g", c);
    std::printf(" s; stage %d paces the step\n", t[0].slowest_stage);
  }
  trow("tokens/s (all ranks)", "%.4g", [](const ParallelTime& e) { return e.tokens_per_s; });
  trow("MFU", "%.1f%%", [](const ParallelTime& e) { return 100 * e.mfu; });
  if (l.tp > 1 && in.shape.known()) {
    // The bytes behind "tensor-parallel collectives" (tp_collectives; the example GPT sends
    // exactly these, tests/test_tensor_parallel_comm.cpp).
    const TpCommStep v = tp_comm_per_step(in, recompute, l.pp - 1);
    std::printf(
        "  tensor-parallel traffic per step, one rank of the last stage: %s sent in %lld "
        "all-reduces, %lld all-gathers and %lld reduce-scatters\n",
        gb(v.sent()).c_str(), (long long)v.all_reduce.calls, (long long)v.all_gather.calls,
        (long long)v.reduce_scatter.calls);
  }
}

void print_parallel_json(const PlanInput& in, const LayoutHardware& hardware, Recompute recompute) {
  const ParallelLayout l = parallel_layout(in);
  const ParallelHardware hw = hardware(l);
  std::printf(
      "{\"world_size\": %d, \"tp\": %d, \"pp\": %d, \"dp\": %d, \"schedule\": \"%s\", "
      "\"partition\": \"%s\", \"micro_batches\": %lld, \"micro_batch\": %lld, \"seq_len\": %lld, "
      "\"recompute\": \"%s\",\n \"stages\": [",
      in.world_size, l.tp, l.pp, l.dp, schedule_name(in.schedule), partition_name(in.partition),
      (long long)in.accumulation, (long long)in.micro_batch, (long long)in.seq_len,
      short_recompute(recompute));
  const int stages = l.pp > 1 ? 2 : 3;  // no ZeRO-2 with a pipeline
  for (int s = 0; s < stages; ++s) {
    const RankPlan p = plan_parallel_rank(in, s, recompute);
    const ParallelTime t = predict_parallel_step_time(in, s, recompute, hw);
    std::printf(
        "%s\n  {\"stage\": %d, \"rank_bytes\": %lld, \"time\": {\"forward_s\": %.6g, "
        "\"backward_s\": %.6g, \"recompute_s\": %.6g, \"tp_comm_s\": %.6g, \"p2p_s\": %.6g, "
        "\"bubble_fraction\": %.6g, \"bubble_s\": %.6g, \"grad_comm_s\": %.6g, "
        "\"grad_comm_exposed_s\": %.6g, \"param_gather_s\": %.6g, \"optimizer_s\": %.6g, "
        "\"offload_exposed_s\": %.6g, \"step_s\": %.6g, \"tokens_per_s\": %.6g, \"mfu\": %.6g",
        s ? "," : "", s, (long long)p.total(), t.forward_s, t.backward_s, t.recompute_s,
        t.tp_comm_s, t.p2p_s, t.bubble_fraction, t.bubble_s, t.grad_comm_s, t.grad_comm_exposed_s,
        t.param_gather_s, t.optimizer_s, t.offload_exposed_s, t.step_s, t.tokens_per_s, t.mfu);
    if (!t.stage_compute_s.empty()) {
      std::printf(", \"slowest_stage\": %d, \"stage_compute_s\": [", t.slowest_stage);
      for (size_t i = 0; i < t.stage_compute_s.size(); ++i)
        std::printf("%s%.6g", i ? ", " : "", t.stage_compute_s[i]);
      std::printf("]");
    }
    std::printf("}}");
  }
  std::printf("\n]}\n");
}

void print_parallel_search(const PlanInput& in, const std::string& name, const PlanLimits& limits,
                           const LayoutHardware& hardware, int top) {
  const ParallelSearch s = search_parallel(in, limits, hardware);
  std::printf(
      "\nlayouts for %s on %d x %s (budget %s per rank): T in {1,2,4,8} within a node, P "
      "dividing the %lld layers, %s schedule over %lld micro-batches, sequence parallelism %s; "
      "the largest micro-batch that fits, highest predicted MFU first\n",
      name.c_str(), in.world_size, gb(limits.device_bytes).c_str(), gb(limits.budget()).c_str(),
      (long long)in.shape.layers, schedule_name(in.schedule), (long long)in.accumulation,
      in.sequence_parallel ? "on" : "off");
  if (!s.found) {
    std::printf("  nothing fits, at any T, P, stage, checkpointing and micro-batch 1\n");
    return;
  }
  std::printf("  %-26s %5s %-13s %5s %7s %10s %9s %8s %6s\n", "layout", "ZeRO", "recompute",
              "micro", "batch", "per rank", "step s", "bubble", "MFU");
  int shown = 0;
  for (const ParallelCandidate& c : s.fits) {
    if (shown++ == top) break;
    // batch: sequences per step over all replicas, micro-batch x m x D.
    std::printf(
        "  %-26s %5d %-13s %5lld %7lld %10s %9.3f %7.1f%% %5.1f%%\n", layout_name(c.layout).c_str(),
        c.stage, short_recompute(c.recompute), (long long)c.micro_batch,
        (long long)(c.micro_batch * in.accumulation * c.layout.dp), gb(c.memory.total()).c_str(),
        c.time.step_s, 100 * c.time.bubble_fraction, 100 * c.time.mfu);
  }
  if (static_cast<int>(s.fits.size()) > top) {
    std::printf("  (%zu more that fit; --top shows more)\n", s.fits.size() - top);
  }
  const ParallelCandidate& b = s.best;
  std::printf(
      "=> %s, ZeRO stage %d, %s, micro-batch %lld: %s per rank, predicted %.3f s per step, MFU "
      "%.1f%%\n",
      layout_name(b.layout).c_str(), b.stage, recompute_name(b.recompute), (long long)b.micro_batch,
      gb(b.memory.total()).c_str(), b.time.step_s, 100 * b.time.mfu);
  std::printf(
      "   a recommendation only: the trainer runs the tensor_parallel and pipeline.stages it is "
      "configured with (\"auto\" never changes them); set them in the config to use this\n");
}

}  // namespace zero::tools
