// Step time under tensor and pipeline parallelism: formulas in include/zero/parallel_plan.hpp.
#include <algorithm>
#include <stdexcept>
#include <string>
#include <string_view>

#include "zero/parallel_plan.hpp"
#include "zero/pipeline/figures.hpp"
#include "zero/pipeline/partition.hpp"
#include "zero/pipeline/simulate.hpp"
#include "zero/pipeline_flops.hpp"
#include "zero/plan/schedule_of.hpp"

namespace zero {
namespace {

// One entry of the pipeline runtime's layer list for the GPT (examples/gpt_layers.hpp,
// rope_gpt_layers): its parameter count as the partition weighs it, what one tensor-parallel
// rank holds of it, its training FLOPs per token on one rank as the layer declares them
// (include/zero/pipeline_flops.hpp: what pipeline.partition: compute balances, and this
// planner's stage times), and those of its re-run forward under checkpointing.
struct LayerCost {
  int64_t params = 0;
  int64_t rank_params = 0;
  int64_t cost = 0;
  double recompute_flops = 0;
  bool block = false;
  double flops() const { return static_cast<double>(cost); }
};

std::vector<LayerCost> layer_costs(const PlanInput& in, int tp) {
  const ModelShape& m = in.shape;
  const int64_t h = m.hidden, v = m.vocab, t = tp;
  const int64_t matmul = m.attention_params() + 3 * h * m.ffn_dim();
  const double attention = 12.0 * static_cast<double>(h * in.seq_len);
  std::vector<LayerCost> out;
  out.push_back({v * h, v * h / t, pipeline::embedding_flops_per_token(h), 0.0, false});
  const int64_t block_rank = matmul / t + 2 * h;
  for (int64_t i = 0; i < m.layers; ++i) {
    out.push_back({matmul + 2 * h, block_rank,
                   pipeline::matmul_flops_per_token(block_rank) +
                       pipeline::attention_flops_per_token(h, in.seq_len) / t,
                   (2.0 * static_cast<double>(matmul + 2 * h) + attention / 3) / t, true});
  }
  // The head's weight (the tied table too: the runtime registers it on the head as well), the
  // final norm, and the loss over this rank's V / T logits.
  const int64_t head_rank = v * h / t + h;
  out.push_back(
      {v * h + h, head_rank, pipeline::lm_head_flops_per_token(head_rank, v / t), 0.0, false});
  return out;
}

bool unequal_stages(const PlanInput& in) {
  return in.partition != PlanInput::Partition::kEqual && in.shape.known() && in.pipeline_stages > 1;
}

// Virtual stage c holds layers bounds[c] .. bounds[c + 1] - 1 of layer_costs: P·v chunks cut
// as StageLayers cuts them (v = 1 but for the interleaved schedule), chunk c on stage c % P.
std::vector<int> stage_bounds(const PlanInput& in, const std::vector<LayerCost>& layers) {
  std::vector<int64_t> weights;
  pipeline::PartitionMethod method = pipeline::PartitionMethod::Parameters;
  if (in.partition == PlanInput::Partition::kCompute) {
    method = pipeline::PartitionMethod::Compute;
    for (const LayerCost& l : layers) weights.push_back(l.cost);
  } else {
    if (in.partition == PlanInput::Partition::kUniform) method = pipeline::PartitionMethod::Uniform;
    for (const LayerCost& l : layers) weights.push_back(l.params);
  }
  return pipeline::partition_layers(method, weights, in.pipeline_stages * chunks_per_stage(in));
}

}  // namespace

std::vector<int> pipeline_stage_bounds(const PlanInput& in) {
  if (!unequal_stages(in)) return {};
  return stage_bounds(in, layer_costs(in, parallel_layout(in).tp));
}

std::vector<double> stage_flops_per_token(const PlanInput& in) {
  if (!unequal_stages(in)) return {};
  const ParallelLayout l = parallel_layout(in);
  const std::vector<LayerCost> layers = layer_costs(in, l.tp);
  const std::vector<int> b = stage_bounds(in, layers);
  std::vector<double> out(l.pp, 0.0);
  for (size_t c = 0; c + 1 < b.size(); ++c)
    for (int i = b[c]; i < b[c + 1]; ++i) out[c % l.pp] += layers[i].flops();
  return out;
}

ParallelHardware parallel_hardware(const std::string& device, const std::string& inter_link,
                                   const ParallelLayout& l, int per_node) {
  // hardware_preset picks the inter-node link when its `world` exceeds per_node: give it the
  // span of each group in ranks (Megatron's order: tp innermost, then dp, then pp).
  ParallelHardware hw;
  hw.tp = hardware_preset(device, inter_link, l.tp, per_node);
  hw.dp = hardware_preset(device, inter_link, l.tp * l.dp, per_node);
  // Ranks r and r + T·D are on different nodes once T·D reaches a node.
  hw.p2p =
      hardware_preset(device, inter_link, l.tp * l.dp >= per_node ? per_node + 1 : 1, per_node);
  return hw;
}

ParallelTime predict_parallel_step_time(const PlanInput& in, int stage, Recompute r,
                                        const ParallelHardware& hw) {
  const ParallelLayout l = parallel_layout(in);
  if (l.pp > 1 && stage >= 2) {
    throw std::invalid_argument(
        "ZeRO stage " + std::to_string(stage) +
        " with pipeline stages > 1: DeepSpeed refuses it (it reduce-scatters every "
        "micro-step); use stage 0 or 1");
  }
  const Hardware& base = hw.dp;
  if (base.peak_flops <= 0 || base.efficiency <= 0 || base.memory_bw <= 0) {
    throw std::invalid_argument(
        "the time model needs a positive peak FLOP/s, efficiency and "
        "memory bandwidth");
  }
  ParallelTime t;
  const double m = static_cast<double>(std::max<int64_t>(1, in.accumulation));
  const double tokens = static_cast<double>(in.micro_batch * in.seq_len);  // per micro-batch
  const double split = static_cast<double>(l.tp * l.pp);
  const double rate = base.peak_flops * base.efficiency;
  const bool recompute = r != Recompute::kNone;
  t.model_flops_per_token = model_flops_per_token(in);
  const double tf = tokens * t.model_flops_per_token / 3 / split / rate;
  const double tb = 2 * tf;
  const double trc = recompute ? tokens * recompute_flops_per_token(in) / split / rate : 0.0;

  // Tensor parallelism: tp_collectives of the stage that communicates the most (the last: the
  // head and the loss besides its blocks; with one stage, all of it).
  auto tp_call_s = [&](const TpCollective& c) {
    // all_gather_s counts the gathered bytes: a call's input times T.
    const double bytes = static_cast<double>(c.bytes);
    return c.op == TpCollective::Op::kAllReduce   ? all_reduce_s(bytes, l.tp, hw.tp)
           : c.op == TpCollective::Op::kAllGather ? all_gather_s(bytes * l.tp, l.tp, hw.tp)
                                                  : reduce_scatter_s(bytes, l.tp, hw.tp);
  };
  double tp_f = 0, tp_b = 0, tp_step = 0;
  for (const TpCollective& c : tp_collectives(in, r, l.pp - 1)) {
    const double s = tp_call_s(c) * static_cast<double>(c.calls);
    (c.phase == TpCollective::Phase::kForward ? tp_f
     : c.phase == TpCollective::Phase::kStep  ? tp_step
                                              : tp_b) += s;
  }
  const double layers = in.shape.known() ? static_cast<double>(in.shape.layers / l.pp) : 0.0;
  // Pipeline: one activation send forward and one gradient send back per micro-batch.
  double p2p = 0;
  if (l.pp > 1 && in.shape.known()) {
    const double bytes = tokens * static_cast<double>(in.shape.hidden) * in.param_bytes /
                         (in.sequence_parallel ? l.tp : 1);
    if (hw.p2p.all_gather_bw <= 0) throw std::invalid_argument("the stage link needs a rate");
    // Interleaved: every chunk boundary is a stage boundary, v sends each way per micro-batch.
    p2p = chunks_per_stage(in) * (bytes / hw.p2p.all_gather_bw + hw.p2p.latency_s);
  }
  const double micro_f = tf + tp_f + p2p, micro_b = tb + trc + tp_b + p2p;
  t.forward_s = m * tf;
  t.backward_s = m * tb;
  t.recompute_s = m * trc;
  t.tp_comm_s = m * (tp_f + tp_b) + tp_step;
  t.p2p_s = m * 2 * p2p;
  double busy = m * (micro_f + micro_b);
  int64_t most = 0;                  // the parameters of the rank holding the most
  double overlap_window = tb + trc;  // the backward the last gradient buckets hide behind
  const auto kind = schedule_kind(in);
  const int v = chunks_per_stage(in);
  if (unequal_stages(in)) {
    // Each chunk (virtual stage) timed by its own layers, each stage by the sum of its chunks;
    // the simulated schedule's makespan is the pipeline's part of the step, and the slowest
    // stage's idle time in it the bubble.
    const double equal_blocks = static_cast<double>(in.shape.layers / l.pp);
    const std::vector<LayerCost> layers = layer_costs(in, l.tp);
    const std::vector<int> bounds = stage_bounds(in, layers);
    const int chunks = l.pp * v;
    std::vector<std::vector<TpCollective>> stage_tp(l.pp);
    for (int s = 0; s < l.pp; ++s) stage_tp[s] = tp_collectives(in, r, s);
    // One send each way per chunk boundary: p2p is the stage's v of them.
    const double send = p2p / v;
    std::vector<double> cf(chunks), cb(chunks);
    std::vector<double> f(l.pp, 0.0), b(l.pp, 0.0), comp(l.pp), tf_s(l.pp, 0.0), trc_s(l.pp, 0.0),
        tp_s(l.pp, 0.0);
    std::vector<int64_t> params(l.pp, 0);
    for (int vs = 0; vs < chunks; ++vs) {
      const int s = vs % l.pp, c = vs / l.pp;
      double flops = 0, re = 0, blocks = 0;
      for (int i = bounds[vs]; i < bounds[vs + 1]; ++i) {
        flops += layers[i].flops();
        re += layers[i].recompute_flops;
        blocks += layers[i].block ? 1 : 0;
        params[s] += layers[i].rank_params;
      }
      const double tf_c = tokens * flops / 3 / rate;
      const double trc_c = recompute ? tokens * re / rate : 0.0;
      // tp_collectives of stage s, its block terms scaled from the equal share (L / P blocks)
      // to the blocks this chunk holds; the embedding's terms (stage 0's others) on the chunk
      // holding layer 0, the head's and the loss's (the last stage's) on the one holding the
      // last layer: chunk 0 of stage 0 and chunk v - 1 of stage P - 1 (P > 1 here).
      const bool ends = (s == 0 && c == 0) || (s == l.pp - 1 && c == v - 1);
      double tpf = 0, tpb = 0;
      for (const TpCollective& x : stage_tp[s]) {
        if (x.phase == TpCollective::Phase::kStep) continue;  // once per step: tp_step
        const bool block = std::string_view(x.what).find("block") != std::string_view::npos;
        if (!block && !ends) continue;
        const double scale = block && equal_blocks > 0 ? blocks / equal_blocks : 1.0;
        const double sec = tp_call_s(x) * static_cast<double>(x.calls) * scale;
        (x.phase == TpCollective::Phase::kForward ? tpf : tpb) += sec;
      }
      cf[vs] = tf_c + tpf + send;
      cb[vs] = 2 * tf_c + trc_c + tpb + send;
      f[s] += cf[vs];
      b[s] += cb[vs];
      tf_s[s] += tf_c;
      trc_s[s] += trc_c;
      tp_s[s] += tpf + tpb;
    }
    for (int s = 0; s < l.pp; ++s) {
      most = std::max(most, params[s]);
      comp[s] = m * (3 * tf_s[s] + trc_s[s]);
    }
    int k = 0;
    for (int s = 1; s < l.pp; ++s)
      if (f[s] + b[s] > f[k] + b[k]) k = s;
    double mean_f = 0, mean_b = 0;
    for (int s = 0; s < l.pp; ++s) mean_f += f[s] / l.pp, mean_b += b[s] / l.pp;
    pipeline::OpTimes times;
    if (v == 1) {
      // GPipe and 1F1B as planned before chunk times: stage_scale scales a stage's forward and
      // backward alike (the stages' backward / forward ratios differ only by the sends and
      // collectives added to both).
      times.forward = mean_f;
      times.backward = mean_b;
      for (int s = 0; s < l.pp; ++s) times.stage_scale.push_back((f[s] + b[s]) / (mean_f + mean_b));
    } else {
      // Interleaved: a stage's chunks differ (the embedding on its first, the head on the last
      // stage's last, and a partition's uneven cut), so each runs its own times.
      times.chunk_forward = cf;
      times.chunk_backward = cb;
    }
    const double makespan =
        pipeline::simulate(pipeline::make_schedule(kind, l.pp, static_cast<int>(m), v), times)
            .makespan;
    t.forward_s = m * tf_s[k];
    t.backward_s = m * 2 * tf_s[k];
    t.recompute_s = m * trc_s[k];
    t.tp_comm_s = m * tp_s[k] + tp_step;
    busy = m * (f[k] + b[k]);
    t.bubble_s = std::max(0.0, makespan - busy);
    t.bubble_fraction = makespan > 0 ? t.bubble_s / makespan : 0;
    t.stage_compute_s = comp;
    t.slowest_stage = k;
    overlap_window = 2 * tf_s[k] + trc_s[k];
  } else if (l.pp > 1) {
    t.bubble_fraction =
        pipeline::pipeline_figures(kind, l.pp, static_cast<int>(m), v, micro_b / micro_f)
            .bubble_fraction;
    t.bubble_s = busy / (1 - t.bubble_fraction) - busy;
  }

  // Data parallelism over D ranks, on the parameters of the rank holding the most.
  PlanInput y = in;
  y.world_size = l.dp;
  if (most == 0)
    for (int s = 0; s < l.pp; ++s) most = std::max(most, rank_params(in, s));
  y.num_params = most;
  const std::vector<int64_t> buckets = bucket_sizes(y);
  std::vector<double> comm;
  double per_reduce = 0;
  // zero_quantized_gradients (stages 1, 2): codes plus a scale per block, as time_plan.cpp.
  const bool quantized = stage > 0 && in.quantized_bits > 0;
  const double per_element =
      quantized ? in.quantized_bits / 8.0 + 4.0 / static_cast<double>(in.quantized_block)
                : static_cast<double>(in.comm_bytes);
  for (int64_t b : buckets) {
    const double bytes = static_cast<double>(b) * per_element;
    comm.push_back(stage > 0 ? reduce_scatter_s(bytes, l.dp, hw.dp)
                             : all_reduce_s(bytes, l.dp, hw.dp));
    per_reduce += comm.back();
  }
  const double reducing = stage >= 2 ? m : 1;
  t.grad_comm_s = per_reduce * reducing;
  t.grad_comm_exposed_s =
      (in.overlap_comm ? exposed_after_backward(buckets, comm, overlap_window) : per_reduce) *
      reducing;
  if (stage > 0) {
    // Stage 3 publishes only its root unit after the step (time_plan.hpp).
    const double published = static_cast<double>(stage == 3 ? stage3_root_params(y) : most);
    t.param_gather_s =
        all_gather_s(published * in.param_bytes, l.dp, hw.dp) + all_reduce_s(4, l.dp, hw.dp);
  }
  if (stage == 3) {
    double tail = 0;
    const Stage3Pass pass =
        stage3_micro_step(y, tf, tb + trc, l.dp, hw.dp, in.overlap_comm ? &tail : nullptr);
    t.unit_gather_s = m * (pass.forward_gather_s + pass.backward_gather_s);
    t.unit_gather_exposed_s = m * pass.exposed_s;
    if (in.overlap_comm) t.grad_comm_exposed_s = m * tail;
  }
  t.optimizer_s = optimizer_bytes(y, stage) / base.memory_bw;
  // Offloaded checkpoints: every kept block input to the host and back, under the compute.
  if (r == Recompute::kCheckpointOffload && in.shape.known()) {
    if (base.host_bw <= 0) throw std::invalid_argument("offload needs a host bandwidth");
    const double bytes = 2.0 * layers * in.param_bytes * tokens * m *
                         static_cast<double>(in.shape.hidden) / (in.sequence_parallel ? l.tp : 1);
    t.offload_exposed_s =
        std::max(0.0, bytes / base.host_bw - (t.forward_s + t.backward_s + t.recompute_s));
  }
  t.step_s = busy + t.bubble_s + tp_step + t.grad_comm_exposed_s + t.param_gather_s +
             t.unit_gather_exposed_s + t.optimizer_s + t.offload_exposed_s;
  t.tokens_per_s = tokens * m * l.dp / t.step_s;
  t.mfu = t.tokens_per_s * t.model_flops_per_token / (in.world_size * base.peak_flops);
  return t;
}

}  // namespace zero
