// zero-memory --json at T = P = 1: each stage's model states, offload split, activations and
// predicted step time, stage 3's extra terms, and the recommendation.
#include <cstdio>

#include "zero_memory_report.hpp"
#include "zero_memory_rows.hpp"

namespace zero::tools {

void print_json(const PlanInput& in, const MemoryPlan& plan, const TimeSetup& ts) {
  std::printf(
      "{\"num_params\": %lld, \"world_size\": %d, \"micro_batch\": %lld, \"seq_len\": %lld,"
      "\n \"block_activation_bytes\": %lld,\n \"stages\": [",
      (long long)in.num_params, in.world_size, (long long)in.micro_batch, (long long)in.seq_len,
      (long long)(in.shape.known()
                      ? block_activation_bytes(in.shape, in.micro_batch, in.seq_len, in.param_bytes)
                      : 0));
  for (int s = 0; s < 3; ++s) {
    std::printf(
        "%s\n  {\"stage\": %d, \"model_states\": %s, \"startup_peak\": %lld, "
        "\"offload_optimizer\": {\"device\": %lld, \"host\": %lld}, \"activations\": {",
        s ? "," : "", s, to_json(plan_model_states(in, s)).c_str(),
        (long long)plan_startup_peak(in, s), (long long)optimizer_offload_split(in, s).device,
        (long long)optimizer_offload_split(in, s).host);
    for (int r = 0; r < 3; ++r) {
      std::printf("%s\"%s\": %lld", r ? ", " : "", kModeIds[r],
                  (long long)predict_activations(in, kModes[r]).peak());
    }
    const TimeEstimate t = time_of(in, ts, s);
    std::printf(
        "},\n   \"time\": {\"forward_s\": %.6g, \"backward_s\": %.6g, \"recompute_s\": %.6g, "
        "\"grad_comm_s\": %.6g, \"grad_comm_exposed_s\": %.6g, \"param_gather_s\": %.6g, "
        "\"optimizer_s\": %.6g, \"offload_exposed_s\": %.6g, \"step_s\": %.6g, "
        "\"tokens_per_s\": %.6g, \"mfu\": %.6g}}",
        t.forward_s, t.backward_s, t.recompute_s, t.grad_comm_s, t.grad_comm_exposed_s,
        t.param_gather_s, t.optimizer_s, t.offload_exposed_s, t.step_s, t.tokens_per_s, t.mfu);
  }
  // Stage 3 beside the stages the recommendation searches. model_states counts every category,
  // the host-resident part included; host_states is that part (the error-feedback residual, and
  // the offloaded optimizer part with --offload-optimizer), device_states the rest.
  const TimeEstimate t3 = time_of(in, ts, 3);
  const OffloadSplit off3 = optimizer_offload_split(in, 3);
  std::printf(
      "],\n \"stage3\": {\"model_states\": %s, \"host_states\": %lld, \"device_states\": %lld, "
      "\"offload_optimizer\": {\"device\": %lld, \"host\": %lld}, \"root_params\": %lld, "
      "\"gathered\": %lld, \"time\": {\"unit_gather_s\": %.6g, \"unit_gather_exposed_s\": %.6g, "
      "\"unit_gathers\": %lld, \"param_gather_s\": %.6g, \"step_s\": %.6g, \"mfu\": %.6g}},",
      to_json(plan_model_states(in, 3)).c_str(), (long long)plan_host_states(in, 3),
      (long long)device_model_states(in, 3), (long long)off3.device, (long long)off3.host,
      (long long)stage3_root_params(in), (long long)stage3_transient_bytes(in, 3), t3.unit_gather_s,
      t3.unit_gather_exposed_s, (long long)t3.unit_gathers, t3.param_gather_s, t3.step_s, t3.mfu);
  std::printf("\n \"recommendation\": ");
  if (!plan.found) {
    std::printf("null\n}\n");
    return;
  }
  std::printf(
      "{\"stage\": %d, \"recompute\": \"%s\", \"micro_batch\": %lld, \"total\": %lld, "
      "\"offload_optimizer\": %s, \"host_per_rank\": %lld, \"host_per_node\": %lld, "
      "\"host_fits\": %s}\n}\n",
      plan.best.stage, kModeIds[static_cast<int>(plan.best.recompute)],
      (long long)plan.best.micro_batch, (long long)plan.best.total(),
      plan.best.offload ? "true" : "false", (long long)plan.best.host(),
      (long long)plan.host_per_node, plan.host_fits ? "true" : "false");
}

}  // namespace zero::tools
