// Per-rank memory under tensor and pipeline parallelism: formulas in
// include/zero/parallel_plan.hpp.
#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

#include "zero/parallel_plan.hpp"
#include "zero/pipeline/figures.hpp"
#include "zero/plan/schedule_of.hpp"

namespace zero {

ParallelLayout parallel_layout(const PlanInput& in) {
  const int t = in.tensor_parallel, p = in.pipeline_stages, w = in.world_size;
  if (t < 1 || p < 1) {
    throw std::invalid_argument("tensor_parallel (" + std::to_string(t) +
                                ") and pipeline stages (" + std::to_string(p) + ") must be >= 1");
  }
  if (w % (t * p) != 0) {
    throw std::invalid_argument(
        "world size " + std::to_string(w) +
        " is not divisible by tensor_parallel x pipeline stages = " + std::to_string(t) + " x " +
        std::to_string(p) + " = " + std::to_string(t * p) +
        "; pick T and P (tensor_parallel.autotp_size / --tp, "
        "pipeline.stages / --pp) whose product divides it");
  }
  if (in.shape.known() && in.shape.layers % p != 0) {
    throw std::invalid_argument("pipeline stages " + std::to_string(p) + " do not divide the " +
                                std::to_string(in.shape.layers) + " layers; pick a divisor");
  }
  const int v = chunks_per_stage(in);
  if (p > 1 && in.schedule == PlanInput::Schedule::kInterleaved) {
    if (v < 1) throw std::invalid_argument("pipeline.virtual_stages must be >= 1");
    // Equal chunks need P·v to divide the blocks; the runtime's partitions (uniform,
    // parameters, compute) cut [embedding, L blocks, head] into any P·v non-empty chunks.
    const bool equal = in.partition == PlanInput::Partition::kEqual;
    if (in.shape.known() && equal && in.shape.layers % (p * v) != 0) {
      throw std::invalid_argument(
          "the interleaved schedule cuts the " + std::to_string(in.shape.layers) +
          " layers into P x v = " + std::to_string(p) + " x " + std::to_string(v) +
          " equal chunks: they must divide them; pick pipeline.virtual_stages accordingly, or "
          "a pipeline.partition (--partition) that cuts as the runtime does");
    }
    if (in.shape.known() && !equal && in.shape.layers + 2 < p * v) {
      throw std::invalid_argument(
          "the interleaved schedule cuts the " + std::to_string(in.shape.layers + 2) +
          " layers (embedding, blocks, head) into P x v = " + std::to_string(p) + " x " +
          std::to_string(v) +
          " chunks: every chunk needs a layer; use fewer pipeline.virtual_stages or stages");
    }
    if (v > 1 && in.accumulation % p != 0) {
      throw std::invalid_argument("the interleaved schedule runs micro-batches in groups of P = " +
                                  std::to_string(p) + ": " + std::to_string(in.accumulation) +
                                  " micro-batches (gradient_accumulation_steps) are not a "
                                  "multiple of it");
    }
  }
  return {t, p, w / (t * p)};
}

const char* schedule_name(PlanInput::Schedule s) {
  return s == PlanInput::Schedule::kGPipe         ? "gpipe"
         : s == PlanInput::Schedule::kInterleaved ? "interleaved"
                                                  : "1f1b";
}

PlanInput::Schedule parse_schedule(const std::string& name) {
  if (name == "1f1b") return PlanInput::Schedule::kOneFOneB;
  if (name == "gpipe") return PlanInput::Schedule::kGPipe;
  if (name == "interleaved") return PlanInput::Schedule::kInterleaved;
  throw std::invalid_argument("pipeline schedule '" + name + "': 1f1b, gpipe or interleaved");
}

pipeline::ScheduleKind schedule_kind(const PlanInput& in) {
  switch (in.schedule) {
    case PlanInput::Schedule::kGPipe:
      return pipeline::ScheduleKind::GPipe;
    case PlanInput::Schedule::kInterleaved:
      return pipeline::ScheduleKind::Interleaved;
    default:
      return pipeline::ScheduleKind::OneFOneB;
  }
}

int chunks_per_stage(const PlanInput& in) {
  return in.schedule == PlanInput::Schedule::kInterleaved ? in.virtual_stages : 1;
}

const char* partition_name(PlanInput::Partition p) {
  switch (p) {
    case PlanInput::Partition::kUniform:
      return "uniform";
    case PlanInput::Partition::kParameters:
      return "parameters";
    case PlanInput::Partition::kCompute:
      return "compute";
    case PlanInput::Partition::kEqual:
      break;
  }
  return "equal";
}

PlanInput::Partition parse_partition(const std::string& name) {
  for (auto p : {PlanInput::Partition::kEqual, PlanInput::Partition::kUniform,
                 PlanInput::Partition::kParameters, PlanInput::Partition::kCompute})
    if (name == partition_name(p)) return p;
  throw std::invalid_argument("pipeline partition '" + name +
                              "': equal, uniform, parameters or compute (pipeline.partition)");
}

int64_t rank_params(const PlanInput& in, int stage) {
  const ParallelLayout l = parallel_layout(in);
  if (l.tp == 1 && l.pp == 1) return in.num_params;  // whatever count the user gave
  const ModelShape& m = in.shape;
  if (!m.known()) return in.num_params / (l.tp * l.pp);
  const int64_t h = m.hidden, t = l.tp;
  const int64_t block = (m.attention_params() + 3 * h * m.ffn_dim()) / t + 2 * h;
  int64_t n = m.layers / l.pp * block;
  const bool first = stage == 0, last = stage == l.pp - 1;
  const int64_t table = m.vocab * h / t;
  if (first) n += table;  // embedding
  // The head on the last stage; a tied table is the embedding itself with one stage, a copy
  // kept in step with it on the last stage with several (Megatron's shared word embeddings).
  if (last && (!first || !m.tied)) n += table;
  if (last) n += h;  // final norm
  return n;
}

int in_flight_micro_batches(const PlanInput& in, int stage) {
  const ParallelLayout l = parallel_layout(in);
  if (l.pp == 1) return 1;  // data parallelism runs each micro-batch's backward before the next
  const int m = static_cast<int>(std::max<int64_t>(1, in.accumulation));
  // Interleaved: in whole micro-batches of the stage's layers (a chunk holds 1/v of them).
  const auto f = pipeline::pipeline_figures(schedule_kind(in), l.pp, m, chunks_per_stage(in));
  return static_cast<int>(std::ceil(f.peak_activation_micro_batches.at(stage)));
}

namespace {

// The two parts of memory_plan.hpp's block count: inside attention/MLP, and around them.
struct BlockParts {
  int64_t inside = 0, around = 0;
};

BlockParts block_parts(const PlanInput& in) {
  const ModelShape& m = in.shape;
  const int64_t p = in.param_bytes, sb = in.seq_len * in.micro_batch, h = m.hidden;
  return {4 * p * sb * h + 4 * p * sb * m.ffn_dim() + 4 * m.head_count() * sb,
          2 * p * sb * h + 2 * (4 + p) * sb * h + 8 * sb};
}

}  // namespace

int64_t block_activation_bytes_per_rank(const PlanInput& in) {
  const int t = in.tensor_parallel;
  const BlockParts b = block_parts(in);
  return b.inside / t + b.around / (in.sequence_parallel ? t : 1);
}

ActivationEstimate predict_stage_activations(const PlanInput& in, Recompute r, int stage) {
  const ParallelLayout l = parallel_layout(in);
  if (l.tp == 1 && l.pp == 1) return predict_activations(in, r);
  ActivationEstimate a;
  const ModelShape& m = in.shape;
  if (!m.known()) return a;
  const int64_t t = l.tp, tsp = in.sequence_parallel ? t : 1;
  const int64_t p = in.param_bytes, sb = in.seq_len * in.micro_batch, sbh = sb * m.hidden;
  const int64_t k = in_flight_micro_batches(in, stage);
  const int64_t layers = m.layers / l.pp;
  const int64_t block = block_activation_bytes_per_rank(in);
  const int64_t input = p * sbh / tsp;
  const bool first = stage == 0, last = stage == l.pp - 1;
  if (first) a.head += k * 8 * sb;  // token ids
  if (last) {
    // Final norm (÷ T with SP) and the gathered head input; the vocabulary-parallel loss.
    a.head += k * ((sbh * (4 + p) + 4 * sb) / tsp + p * sbh);
    a.loss = 12 * sb * m.vocab / t + (k - 1) * 4 * sb * m.vocab / t;
  }
  a.checkpointed = r != Recompute::kNone;
  switch (r) {
    case Recompute::kNone:
      a.blocks = k * layers * block;
      break;
    case Recompute::kCheckpoint:
      a.blocks = k * layers * input;
      a.recompute = block;
      break;
    case Recompute::kCheckpointOffload:
      a.blocks = std::min<int64_t>(k * layers, 2) * input;
      a.host = k * layers * input;
      a.recompute = block;
      break;
  }
  return a;
}

PlanInput rank_states_input(const PlanInput& in, int stage) {
  const ParallelLayout l = parallel_layout(in);
  PlanInput x = in;
  x.num_params = rank_params(in, stage);
  x.world_size = l.dp;
  return x;
}

int64_t rank_device_peak(const PlanInput& in, int stage, Recompute r) {
  const ParallelLayout l = parallel_layout(in);
  int64_t worst = 0;
  for (int s : {0, l.pp - 1}) {
    const PlanInput x = rank_states_input(in, s);
    worst = std::max(worst, plan_model_states(x, stage).total() - plan_host_states(x, stage) +
                                predict_stage_activations(in, r, s).peak() +
                                stage3_transient_bytes(x, stage));
  }
  return worst;
}

RankPlan plan_parallel_rank(const PlanInput& in, int stage, Recompute r) {
  const ParallelLayout l = parallel_layout(in);
  RankPlan worst;
  for (int s = 0; s < l.pp; ++s) {
    // A middle stage holds no more than the first (no embedding, fewer in flight).
    if (s > 0 && s < l.pp - 1) continue;
    PlanInput x = rank_states_input(in, s);
    x.offload_optimizer = false;
    RankPlan rp;
    rp.pipeline_stage = s;
    rp.params = x.num_params;
    rp.states = plan_model_states(x, stage);
    rp.act = predict_stage_activations(in, r, s);
    rp.gathered = stage3_transient_bytes(x, stage);
    if (s == 0 || rp.total() > worst.total()) worst = rp;
  }
  return worst;
}

}  // namespace zero
