// The "auto" choice itself, torch-free: the planner's search restricted to what the user left
// open. Rules and budget in include/zero/auto_strategy.hpp.
#include <algorithm>
#include <cstdio>
#include <vector>

#include "zero/auto_strategy.hpp"
#include "zero/parallel_plan.hpp"

namespace zero {
namespace {

std::string fmt(const char* f, auto... args) {
  char buf[600];
  std::snprintf(buf, sizeof buf, f, args...);
  return buf;
}

// Device bytes: under optimizer offload the host part of the states is not on the device.
// Under tensor (or pipeline) parallelism a rank holds its shard of the parameters, sharded
// again over the data-parallel ranks, and its share of the activations (parallel_plan.hpp); at
// T = P = 1 this is memory_plan.hpp's count.
int64_t peak_bytes(PlanInput in, int stage, Recompute r, int64_t micro) {
  in.micro_batch = micro;
  return rank_device_peak(in, stage, r);
}

// Where nothing fits on data parallelism alone: the least tensor/pipeline parallelism that would
// (parallel_plan.hpp's search; among equals the highest MFU on H100s over 400 Gb/s InfiniBand).
// A hint only: the engine runs the tensor_parallel and pipeline.stages it is configured with.
std::string model_parallel_hint(const PlanInput& in, const PlanLimits& lim) {
  if (!in.shape.known() || in.tensor_parallel * in.pipeline_stages > 1) return "";
  const int per_node = lim.ranks_per_node > 0 ? lim.ranks_per_node : 8;
  const ParallelSearch found = search_parallel(in, lim, [&](const ParallelLayout& l) {
    return parallel_hardware("h100", "ib400", l, per_node);
  });
  const ParallelCandidate* least = nullptr;
  for (const ParallelCandidate& c : found.fits) {
    const int n = c.layout.tp * c.layout.pp;
    if (n > 1 && (!least || n < least->layout.tp * least->layout.pp)) least = &c;
  }
  if (!least) return "";
  return fmt(
      ". Model parallelism would fit: tensor_parallel %d x pipeline stages %d x data-parallel %d, "
      "ZeRO stage %d, %s, micro-batch %lld needs %s per rank (zero-memory --parallel-search "
      "lists more); auto does not change them: set tensor_parallel.autotp_size and "
      "pipeline.stages yourself",
      least->layout.tp, least->layout.pp, least->layout.dp, least->stage,
      recompute_name(least->recompute), (long long)least->micro_batch,
      format_gb(least->memory.total()).c_str());
}

}  // namespace

PlanInput plan_input_for(const Config& cfg, int64_t num_params, int world_size) {
  PlanInput in;
  in.num_params = num_params;
  in.world_size = world_size;
  const auto bytes = [](Dtype d) { return d == Dtype::kFloat32 ? 4 : 2; };
  in.param_bytes = bytes(cfg.param_dtype());
  in.comm_bytes = bytes(cfg.communication_data_type.value_or(cfg.param_dtype()));
  // The engine keeps the accumulator and the reduced shard in grad_accum_dtype.
  in.grad_accum_bytes = bytes(cfg.accum_dtype());
  const std::string& opt = cfg.optimizer.type;
  in.optimizer_states = opt == "SGD" ? (cfg.optimizer.momentum > 0 ? 1 : 0) : 2;
  in.bucket_elements = cfg.zero_optimization.reduce_bucket_size;
  in.param_persistence_threshold = cfg.zero_optimization.stage3.param_persistence_threshold;
  in.model_persistence_threshold = cfg.zero_optimization.stage3.model_persistence_threshold;
  in.prefetch_bucket_size = cfg.zero_optimization.stage3.prefetch_bucket_size;
  in.max_live_parameters = cfg.zero_optimization.stage3.max_live_parameters;
  in.max_reuse_distance = cfg.zero_optimization.stage3.max_reuse_distance;
  in.micro_batch = std::max<int64_t>(1, cfg.train_micro_batch_size_per_gpu);
  in.accumulation = std::max<int64_t>(1, cfg.gradient_accumulation_steps);
  in.overlap_comm = cfg.zero_optimization.overlap_comm;
  in.offload_optimizer = cfg.zero_optimization.offload_optimizer.enabled;
  const auto& q = cfg.zero_optimization.quantized_gradients;
  in.quantized_bits = q.enabled ? q.bits : 0;
  in.quantized_block = q.block;
  in.error_feedback = q.error_feedback;
  const std::string& ef = q.error_feedback_dtype;
  in.error_feedback_store_bytes = ef == "fp32" ? 4 : ef == "int8" ? 1 : ef == "auto" ? 0 : 2;
  in.quantized_hierarchical = q.hierarchical;
  return in;
}

AutoChoice choose_strategy(const PlanInput& in, const PlanLimits& lim, const AutoRequest& req) {
  const Recompute ckpt = req.cpu_offload ? Recompute::kCheckpointOffload : Recompute::kCheckpoint;
  std::vector<Recompute> modes;  // least recompute first
  if (!req.checkpointing.value_or(false)) modes.push_back(Recompute::kNone);
  if (req.checkpointing.value_or(true)) modes.push_back(ckpt);
  std::vector<int> stages;
  for (int s = 0; s < 4; ++s) {
    // The engine offloads the optimizer at stages 1 to 3, never at stage 0.
    if (s == 0 && in.offload_optimizer) continue;
    // Stage 3 is the last resort ("auto" tries it only when nothing at 0-2 fits, below): it
    // all-gathers every unit twice per micro-step.
    if (req.stage ? *req.stage == s : s < 3) stages.push_back(s);
  }
  if (stages.empty()) {
    throw ConfigError(
        "zero: auto: zero_optimization.offload_optimizer needs ZeRO stage 1, 2 or 3; set "
        "zero_optimization.stage to 1, 2, 3 or auto, or turn the offload off");
  }
  // Without a shape activations are unknown: the micro-batch cannot be planned.
  const bool plan_micro = !req.micro_batch && in.shape.known();
  std::vector<int64_t> micros;  // largest first
  if (plan_micro) {
    for (int64_t b = 1; b <= std::max<int64_t>(1, lim.max_micro_batch); b *= 2) {
      if (req.per_rank_batch <= 0 || req.per_rank_batch % b == 0) micros.insert(micros.begin(), b);
    }
  } else {
    micros.push_back(req.micro_batch.value_or(std::max<int64_t>(1, in.micro_batch)));
  }

  const int64_t budget = lim.budget();
  // "auto" reaches stage 3 only when no stage 0-2 setting fits, and only where the engine runs
  // it: not with pipelines (as DeepSpeed).
  const bool stage3_runs = req.stage3_allowed && in.pipeline_stages == 1;
  bool last_resort = false;
  if (!req.stage && stage3_runs) {
    bool any = false;
    for (Recompute r : modes)
      for (int s : stages) any = any || peak_bytes(in, s, r, micros.back()) <= budget;
    if (!any) stages = {3}, last_resort = true;
  }
  for (Recompute r : modes) {
    bool found = false;
    AutoChoice best;
    for (int s : stages) {
      for (int64_t b : micros) {
        const int64_t need = peak_bytes(in, s, r, b);
        if (need > budget) continue;
        if (!found || b > best.micro_batch) {
          found = true;
          best.stage = s, best.micro_batch = b, best.recompute = r, best.bytes = need;
        }
        break;  // the largest micro-batch this stage fits
      }
    }
    if (!found) continue;

    // Why, in the planner's order of concerns, for the values that were "auto".
    std::string why;
    auto add = [&](const std::string& s) { why += (why.empty() ? "" : "; ") + s; };
    if (!req.checkpointing) {
      add(r == Recompute::kNone
              ? "nothing needs recomputing"
              : fmt("no %s fits without checkpointing", req.stage ? "configuration" : "stage"));
    }
    if (plan_micro && micros.front() != best.micro_batch) {
      const auto next = std::find(micros.begin(), micros.end(), best.micro_batch);
      if (next != micros.begin()) {
        const int64_t up = *(next - 1);
        add(fmt("micro-batch %lld needs %s", (long long)up,
                format_gb(peak_bytes(in, best.stage, r, up)).c_str()));
      }
    }
    if (last_resort) {
      add(fmt("no stage 0-2 setting fits (stage 2 with %s at micro-batch %lld needs %s)",
              recompute_name(modes.back()), (long long)micros.back(),
              format_gb(peak_bytes(in, 2, modes.back(), micros.back())).c_str()));
    }
    if (!req.stage && !last_resort) {
      for (int s : stages) {
        if (s == best.stage) continue;
        int64_t fits = 0;
        for (int64_t b : micros) {
          if (peak_bytes(in, s, r, b) <= budget) {
            fits = b;
            break;
          }
        }
        if (fits == 0) {
          add(fmt("stage %d does not fit", s));
        } else if (fits < best.micro_batch) {
          add(fmt("stage %d fits only micro-batch %lld", s, (long long)fits));
        } else if (s > best.stage) {
          add(fmt("stage %d fits too but communicates more", s));
        }
      }
    }
    std::string chose;
    auto pick = [&](bool was_auto, const std::string& what) {
      chose += (chose.empty() ? "" : ", ") + what + (was_auto ? " (auto)" : "");
    };
    pick(!req.stage, fmt("stage %d", best.stage));
    pick(!req.checkpointing, recompute_name(r));
    pick(plan_micro, fmt("micro-batch %lld", (long long)best.micro_batch));
    best.line = fmt("zero: auto: %s: needs %s of the %s budget (%s - %.0f%% reserve)%s%s",
                    chose.c_str(), format_gb(best.bytes).c_str(), format_gb(budget).c_str(),
                    format_gb(lim.device_bytes).c_str(), 100 * lim.reserve, why.empty() ? "" : ": ",
                    why.c_str());
    if (!in.shape.known()) best.line += " (model states only: activations not counted)";
    return best;
  }

  std::string m =
      fmt("zero: auto: nothing fits the %s budget per rank (%s - %.0f%% reserve)",
          format_gb(budget).c_str(), format_gb(lim.device_bytes).c_str(), 100 * lim.reserve);
  const int s = stages.back();
  const Recompute r = modes.back();
  m += fmt("; the smallest, stage %d with %s at micro-batch %lld, needs %s", s, recompute_name(r),
           (long long)micros.back(), format_gb(peak_bytes(in, s, r, micros.back())).c_str());
  m += ". Use more ranks, a smaller model or sequence, a larger "
       "zero_optimization.auto_device_memory, or fix fewer values";
  m += model_parallel_hint(in, lim);
  throw ConfigError(m);
}

}  // namespace zero
