#include "zero/pipeline/schedule.hpp"

#include <algorithm>
#include <map>
#include <optional>
#include <tuple>
#include <stdexcept>

namespace zero::pipeline {
namespace {

void check_shape(int stages, int micro_batches, int stage, int virtual_stages) {
  if (stages < 1)
    throw std::invalid_argument("pipeline: stages is " + std::to_string(stages) +
                                "; it must be at least 1");
  if (micro_batches < 1)
    throw std::invalid_argument("pipeline: micro-batches (gradient_accumulation_steps) is " +
                                std::to_string(micro_batches) + "; it must be at least 1");
  if (stage < 0 || stage >= stages)
    throw std::invalid_argument("pipeline: stage " + std::to_string(stage) + " is outside 0.." +
                                std::to_string(stages - 1) + " (" + std::to_string(stages) +
                                " stages)");
  if (virtual_stages < 1)
    throw std::invalid_argument("pipeline: virtual stages (chunks per stage) is " +
                                std::to_string(virtual_stages) + "; it must be at least 1");
}

// Appends one stage's side of a micro-batch's forward or backward through chunk `chunk`, with
// the receive before and the send after it. Virtual stage c·P + s lives on stage s; its
// neighbours live on s ± 1 (mod P), so with P = 1 they are this stage and nothing travels.
class StageWriter {
 public:
  StageWriter(int stages, int stage, int virtual_stages)
      : stages_(stages), stage_(stage), last_virtual_(stages * virtual_stages - 1) {}

  void forward(int mb, int chunk) {
    int vs = chunk * stages_ + stage_;
    bool remote = stages_ > 1;
    if (vs > 0 && remote) out_.push_back({Op::RecvActivation, mb, chunk});
    out_.push_back({Op::Forward, mb, chunk});
    if (vs < last_virtual_ && remote) out_.push_back({Op::SendActivation, mb, chunk});
  }

  void backward(int mb, int chunk) {
    int vs = chunk * stages_ + stage_;
    bool remote = stages_ > 1;
    if (vs < last_virtual_ && remote) out_.push_back({Op::RecvGrad, mb, chunk});
    out_.push_back({Op::Backward, mb, chunk});
    if (vs > 0 && remote) out_.push_back({Op::SendGrad, mb, chunk});
  }

  std::vector<Instruction> finish() {
    out_.push_back({Op::ReduceGrads});
    out_.push_back({Op::OptimizerStep});
    return std::move(out_);
  }

 private:
  int stages_;
  int stage_;
  int last_virtual_;
  std::vector<Instruction> out_;
};

}  // namespace

std::string_view schedule_name(ScheduleKind kind) {
  switch (kind) {
    case ScheduleKind::GPipe:
      return "gpipe";
    case ScheduleKind::OneFOneB:
      return "1f1b";
    case ScheduleKind::Interleaved:
      return "interleaved";
  }
  return "?";
}

ScheduleKind parse_schedule_kind(std::string_view name) {
  for (auto kind : {ScheduleKind::GPipe, ScheduleKind::OneFOneB, ScheduleKind::Interleaved})
    if (name == schedule_name(kind)) return kind;
  throw std::invalid_argument("pipeline.schedule: unknown schedule '" + std::string(name) +
                              "' (choose 1f1b, gpipe or interleaved)");
}

std::vector<Instruction> gpipe_schedule(int stages, int micro_batches, int stage) {
  check_shape(stages, micro_batches, stage, 1);
  StageWriter w(stages, stage, 1);
  for (int mb = 0; mb < micro_batches; ++mb) w.forward(mb, 0);
  // Ascending order on every stage: each link then carries the gradients in the order they are
  // received, as point-to-point transports that match messages in order (NCCL) require.
  for (int mb = 0; mb < micro_batches; ++mb) w.backward(mb, 0);
  return w.finish();
}

std::vector<Instruction> one_f_one_b_schedule(int stages, int micro_batches, int stage) {
  check_shape(stages, micro_batches, stage, 1);
  StageWriter w(stages, stage, 1);
  // Stage s forwards P-s-1 micro-batches before its first backward can arrive: the last stage
  // none, the first P-1. From then on each forward is followed by the oldest backward, so at
  // most P-s micro-batches' activations are held on stage s (PipeDream-Flush, Megatron's
  // forward_backward_pipelining_without_interleaving).
  int warmup = std::min(stages - stage - 1, micro_batches);
  int steady = micro_batches - warmup;
  for (int mb = 0; mb < warmup; ++mb) w.forward(mb, 0);
  for (int i = 0; i < steady; ++i) {
    w.forward(warmup + i, 0);
    w.backward(i, 0);
  }
  for (int mb = steady; mb < micro_batches; ++mb) w.backward(mb, 0);
  return w.finish();
}

std::vector<Instruction> interleaved_schedule(int stages, int micro_batches, int stage,
                                              int virtual_stages) {
  check_shape(stages, micro_batches, stage, virtual_stages);
  // One chunk per stage is plain 1F1B (Megatron's interleaved warm-up count assumes v > 1).
  if (virtual_stages == 1) return one_f_one_b_schedule(stages, micro_batches, stage);
  if (micro_batches % stages != 0)
    throw std::invalid_argument(
        "pipeline: the interleaved schedule needs micro-batches (gradient_accumulation_steps) "
        "to be a multiple of stages: " +
        std::to_string(micro_batches) + " micro-batches on " + std::to_string(stages) +
        " stages (use " + std::to_string((micro_batches / stages + 1) * stages) +
        ", or the 1f1b schedule)");
  int p = stages;
  int v = virtual_stages;
  int total = micro_batches * v;
  // Megatron's order: micro-batches go through the chunks in groups of P; the k-th forward on a
  // stage is micro-batch (k / (P·v))·P + k % P in chunk (k % (P·v)) / P, and the k-th backward
  // the same micro-batch in the chunks counted from the last.
  auto mb_of = [&](int k) { return (k / (p * v)) * p + k % p; };
  auto chunk_of = [&](int k, bool forward) {
    int c = (k % (p * v)) / p;
    return forward ? c : v - 1 - c;
  };
  // Warm-up: the first backward on stage s needs micro-batch 0 through all v·P virtual stages,
  // which is (v-1)·P forwards on stage 0 plus twice the stages behind s (there and back).
  int warmup = std::min((p - stage - 1) * 2 + (v - 1) * p, total);
  int steady = total - warmup;
  StageWriter w(stages, stage, v);
  for (int k = 0; k < warmup; ++k) w.forward(mb_of(k), chunk_of(k, true));
  for (int i = 0; i < steady; ++i) {
    int k = warmup + i;
    w.forward(mb_of(k), chunk_of(k, true));
    w.backward(mb_of(i), chunk_of(i, false));
  }
  for (int k = steady; k < total; ++k) w.backward(mb_of(k), chunk_of(k, false));
  return w.finish();
}

Schedule make_schedule(ScheduleKind kind, int stages, int micro_batches, int virtual_stages) {
  check_shape(stages, micro_batches, 0, virtual_stages);
  if (kind != ScheduleKind::Interleaved && virtual_stages != 1)
    throw std::invalid_argument("pipeline: " + std::string(schedule_name(kind)) +
                                " runs one chunk per stage, not " + std::to_string(virtual_stages) +
                                " (virtual stages need the interleaved schedule)");
  Schedule out{kind, stages, micro_batches, virtual_stages, {}};
  for (int s = 0; s < stages; ++s) {
    switch (kind) {
      case ScheduleKind::GPipe:
        out.per_stage.push_back(gpipe_schedule(stages, micro_batches, s));
        break;
      case ScheduleKind::OneFOneB:
        out.per_stage.push_back(one_f_one_b_schedule(stages, micro_batches, s));
        break;
      case ScheduleKind::Interleaved:
        out.per_stage.push_back(interleaved_schedule(stages, micro_batches, s, virtual_stages));
        break;
    }
  }
  return out;
}

namespace {

// A message between virtual stages: an activation or a gradient of a micro-batch, named by the
// virtual stage that receives it.
struct Message {
  bool activation;
  int micro_batch;
  int to;  // virtual stage
  bool operator<(const Message& o) const {
    return std::tie(activation, micro_batch, to) < std::tie(o.activation, o.micro_batch, o.to);
  }
};

// The message instruction `ins` of stage `stage` sends or receives, if it does.
std::optional<Message> message_of(const Instruction& ins, int stages, int stage) {
  const int vs = ins.chunk * stages + stage;
  switch (ins.op) {
    case Op::SendActivation:
      return Message{true, ins.micro_batch, vs + 1};
    case Op::RecvActivation:
      return Message{true, ins.micro_batch, vs};
    case Op::SendGrad:
      return Message{false, ins.micro_batch, vs - 1};
    case Op::RecvGrad:
      return Message{false, ins.micro_batch, vs};
    default:
      return std::nullopt;
  }
}

bool is_send(Op op) { return op == Op::SendActivation || op == Op::SendGrad; }

}  // namespace

std::vector<std::vector<Instruction>> delivered_sends(const Schedule& schedule, int stage) {
  const int p = schedule.stages;
  check_shape(p, schedule.micro_batches, stage, schedule.virtual_stages);
  if (static_cast<int>(schedule.per_stage.size()) != p)
    throw std::invalid_argument("pipeline: a schedule of " + std::to_string(p) + " stages lists " +
                                std::to_string(schedule.per_stage.size()));
  auto stage_of = [&](int vs) { return vs % p; };
  auto sender_of = [&](const Message& m) { return stage_of(m.activation ? m.to - 1 : m.to + 1); };
  // What each message to `stage` vouches for: this stage's messages its sender had received
  // before sending it.
  std::map<Message, std::vector<Message>> vouches;
  for (int t = 0; t < p; ++t) {
    if (t == stage) continue;
    std::vector<Message> received;  // from `stage`, not yet vouched for
    for (const auto& ins : schedule.per_stage[t]) {
      const auto m = message_of(ins, p, t);
      if (!m) continue;
      if (!is_send(ins.op)) {
        if (sender_of(*m) == stage) received.push_back(*m);
      } else if (stage_of(m->to) == stage) {
        vouches[*m] = std::move(received);
        received.clear();
      }
    }
  }
  const auto& mine = schedule.per_stage[stage];
  std::map<Message, Instruction> sends;
  for (const auto& ins : mine)
    if (is_send(ins.op)) sends.emplace(*message_of(ins, p, stage), ins);
  std::vector<std::vector<Instruction>> out(mine.size());
  for (size_t i = 0; i < mine.size(); ++i) {
    const auto m = message_of(mine[i], p, stage);
    if (!m || is_send(mine[i].op)) continue;
    auto it = vouches.find(*m);
    if (it == vouches.end()) continue;
    for (const auto& sent : it->second) out[i].push_back(sends.at(sent));
  }
  return out;
}

std::string_view op_name(Op op) {
  switch (op) {
    case Op::Forward:
      return "Forward";
    case Op::Backward:
      return "Backward";
    case Op::SendActivation:
      return "SendActivation";
    case Op::RecvActivation:
      return "RecvActivation";
    case Op::SendGrad:
      return "SendGrad";
    case Op::RecvGrad:
      return "RecvGrad";
    case Op::ReduceGrads:
      return "ReduceGrads";
    case Op::OptimizerStep:
      return "OptimizerStep";
  }
  return "?";
}

std::string to_string(const Instruction& ins, bool show_chunk) {
  std::string s(op_name(ins.op));
  if (ins.micro_batch < 0) return s;
  s += "(micro-batch " + std::to_string(ins.micro_batch);
  if (show_chunk) s += ", chunk " + std::to_string(ins.chunk);
  return s + ")";
}

}  // namespace zero::pipeline
