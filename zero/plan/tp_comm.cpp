// Tensor-parallel communication per micro-batch and step: the accounting in
// include/zero/parallel_plan.hpp (tp_collectives), which tests/test_tensor_parallel_comm.cpp
// checks against the bytes the example GPT hands its tensor-parallel group.
#include <algorithm>

#include "zero/parallel_plan.hpp"

namespace zero {

std::vector<TpCollective> tp_collectives(const PlanInput& in, Recompute r, int stage) {
  const ParallelLayout l = parallel_layout(in);
  std::vector<TpCollective> out;
  const ModelShape& m = in.shape;
  if (l.tp == 1 || !m.known()) return out;
  using Op = TpCollective::Op;
  using Phase = TpCollective::Phase;
  const int64_t t = l.tp, sb = in.micro_batch * in.seq_len;
  const int64_t full = sb * m.hidden * in.param_bytes;  // B: one activation, whole sequence
  const int64_t part = full / t;                        // its sequence part under SP
  const int64_t layers = m.layers / l.pp;
  const bool sp = in.sequence_parallel, first = stage == 0, last = stage == l.pp - 1;
  auto add = [&](Op op, Phase phase, int64_t bytes, int64_t calls, const char* what) {
    if (calls > 0) out.push_back({op, phase, bytes, calls, what});
  };
  // Each region boundary: a forward collective and its conjugate in backward.
  if (first) {
    // The embedding's id check, agreed over the group (comm::gather_status): each rank's
    // [min, max] id, int64.
    add(Op::kAllGather, Phase::kForward, 2 * 8, 1, "token id range check");
    if (sp) {
      add(Op::kReduceScatter, Phase::kForward, full, 1, "embedding output");
      add(Op::kAllGather, Phase::kBackward, part, 1, "embedding output gradient");
    } else {
      add(Op::kAllReduce, Phase::kForward, full, 1, "embedding output");
    }
  }
  // Two regions per block (attention, MLP), each entered once and left once.
  const int64_t recomputed = r == Recompute::kNone ? 0 : 2 * layers;
  if (sp) {
    add(Op::kAllGather, Phase::kForward, part, 2 * layers, "block region inputs");
    add(Op::kReduceScatter, Phase::kForward, full, 2 * layers, "block region outputs");
    add(Op::kReduceScatter, Phase::kBackward, full, 2 * layers, "block region input gradients");
    add(Op::kAllGather, Phase::kBackward, part, 2 * layers, "block region output gradients");
    // The column products keep only the sequence shard and gather it again for their weight
    // gradients (Megatron's LinearWithGradAccumulationAndAsyncCommunication).
    add(Op::kAllGather, Phase::kBackward, part, 2 * layers, "block region inputs, gathered again");
    add(Op::kAllGather, Phase::kRecompute, part, recomputed, "re-run block region inputs");
    add(Op::kReduceScatter, Phase::kRecompute, full, recomputed, "re-run block region outputs");
  } else {
    add(Op::kAllReduce, Phase::kForward, full, 2 * layers, "block region outputs");
    add(Op::kAllReduce, Phase::kBackward, full, 2 * layers, "block region input gradients");
    add(Op::kAllReduce, Phase::kRecompute, full, recomputed, "re-run block region outputs");
  }
  if (last) {
    if (sp) {
      add(Op::kAllGather, Phase::kForward, part, 1, "head input");
      add(Op::kReduceScatter, Phase::kBackward, full, 1, "head input gradient");
      // An untied head is a column-parallel layer (gathers again, above); the tied head reads
      // the embedding's table through a plain gather that keeps the whole sequence.
      if (!m.tied) add(Op::kAllGather, Phase::kBackward, part, 1, "head input, gathered again");
    } else {
      add(Op::kAllReduce, Phase::kBackward, full, 1, "head input gradient");
    }
    // The loss in fp32 whatever the compute dtype, after its target check (each rank's
    // [shape error, min id, max id], int64, gathered as the embedding's).
    add(Op::kAllGather, Phase::kForward, 3 * 8, 1, "cross-entropy target check");
    add(Op::kAllGather, Phase::kForward, 4 * sb, 1, "cross-entropy maxima");
    add(Op::kAllReduce, Phase::kForward, 2 * 4 * sb, 1, "cross-entropy sums");
  }
  if (sp) {
    const int64_t norms = 2 * layers * m.hidden + (last ? m.hidden : 0);
    add(Op::kAllReduce, Phase::kStep, norms * in.param_bytes, 1, "replicated gradients");
  }
  return out;
}

int64_t sent_bytes(const TpCollective& c, int tp) {
  const int64_t n = tp;
  switch (c.op) {
    case TpCollective::Op::kAllReduce:
      return 2 * c.bytes * (n - 1) / n;
    case TpCollective::Op::kReduceScatter:
      return c.bytes * (n - 1) / n;
    case TpCollective::Op::kAllGather:
      return c.bytes * (n - 1);
  }
  return 0;
}

TpCommStep tp_comm_per_step(const PlanInput& in, Recompute r, int stage) {
  const ParallelLayout l = parallel_layout(in);
  const int64_t m = std::max<int64_t>(1, in.accumulation);
  TpCommStep step;
  for (const TpCollective& c : tp_collectives(in, r, stage)) {
    TpCommVolume& v = c.op == TpCollective::Op::kAllReduce   ? step.all_reduce
                      : c.op == TpCollective::Op::kAllGather ? step.all_gather
                                                             : step.reduce_scatter;
    const int64_t calls = c.calls * (c.phase == TpCollective::Phase::kStep ? 1 : m);
    v.calls += calls;
    v.payload += calls * c.bytes;
    v.sent += calls * sent_bytes(c, l.tp);
  }
  return step;
}

}  // namespace zero
