#include "zero/pipeline/simulate.hpp"

#include <algorithm>
#include <deque>
#include <map>
#include <string>
#include <utility>

namespace zero::pipeline {
namespace {

struct Message {
  bool grad;  // SendGrad, else SendActivation
  int micro_batch;
  int chunk;  // the sender's chunk
  double arrival;
};

// Per (micro-batch, chunk) flags of one stage.
class Flags {
 public:
  Flags(int micro_batches, int chunks) : chunks_(chunks), bits_(micro_batches * chunks, false) {}
  bool get(int mb, int chunk) const { return bits_[mb * chunks_ + chunk]; }
  void set(int mb, int chunk) { bits_[mb * chunks_ + chunk] = true; }

 private:
  int chunks_;
  std::vector<bool> bits_;
};

struct StageState {
  StageState(int m, int v) : forwarded(m, v), backwarded(m, v), act_in(m, v), grad_in(m, v) {}
  size_t pc = 0;
  double clock = 0;
  Flags forwarded, backwarded, act_in, grad_in;
  int in_flight = 0;
  bool reduced = false;
  bool stepped = false;
  StageResult result;
};

class Simulator {
 public:
  Simulator(const Schedule& sched, const OpTimes& times)
      : sched_(sched),
        times_(times),
        p_(sched.stages),
        m_(sched.micro_batches),
        v_(sched.virtual_stages),
        last_virtual_(sched.stages * sched.virtual_stages - 1) {
    for (int s = 0; s < p_; ++s) state_.emplace_back(m_, v_);
  }

  SimulationResult run() {
    bool progress = true;
    while (progress) {
      progress = false;
      for (int s = 0; s < p_; ++s)
        while (!finished(s) && step(s)) progress = true;
    }
    for (int s = 0; s < p_; ++s)
      if (!finished(s)) throw ScheduleError(deadlock_message());
    check_complete();
    SimulationResult out;
    for (auto& st : state_) out.makespan = std::max(out.makespan, st.clock);
    double busy = 0;
    for (auto& st : state_) {
      st.result.idle_fraction = out.makespan > 0 ? 1 - st.result.busy / out.makespan : 0;
      busy += st.result.busy;
      out.stages.push_back(std::move(st.result));
    }
    out.bubble_fraction = out.makespan > 0 ? 1 - busy / (p_ * out.makespan) : 0;
    return out;
  }

 private:
  bool finished(int s) const { return state_[s].pc >= sched_.per_stage[s].size(); }

  std::string name(const Instruction& ins) const { return to_string(ins, v_ > 1); }
  std::string at(int s, const Instruction& ins) const {
    return "stage " + std::to_string(s) + " " + name(ins);
  }
  std::string mb_name(int mb, int chunk) const {
    std::string out = "micro-batch " + std::to_string(mb);
    return v_ > 1 ? out + ", chunk " + std::to_string(chunk) : out;
  }

  // Virtual stage c·P + s is chunk c of stage s.
  int stage_of(int virtual_stage) const { return virtual_stage % p_; }
  int chunk_of(int virtual_stage) const { return virtual_stage / p_; }

  std::deque<Message>& link(int from, int to) { return links_[{from, to}]; }

  // Runs stage s's next instruction; false when it is a receive whose message has not been sent.
  bool step(int s) {
    StageState& st = state_[s];
    const Instruction& ins = sched_.per_stage[s][st.pc];
    bool per_micro_batch = ins.op != Op::ReduceGrads && ins.op != Op::OptimizerStep;
    if (per_micro_batch &&
        (ins.micro_batch < 0 || ins.micro_batch >= m_ || ins.chunk < 0 || ins.chunk >= v_))
      throw ScheduleError(at(s, ins) + ": outside the " + std::to_string(m_) +
                          " micro-batches and " + std::to_string(v_) + " chunks of the schedule");
    int mb = ins.micro_batch;
    int c = ins.chunk;
    int vs = c * p_ + s;
    double start = st.clock;
    switch (ins.op) {
      case Op::Forward: {
        if (st.forwarded.get(mb, c)) throw ScheduleError(at(s, ins) + " runs twice");
        if (vs > 0 && !input_ready(s, mb, c, vs - 1, st.act_in, st.forwarded))
          throw ScheduleError(at(s, ins) + " comes before its input: " +
                              missing_input(s, vs - 1, "RecvActivation", "Forward", mb));
        st.forwarded.set(mb, c);
        st.result.peak_in_flight = std::max(st.result.peak_in_flight, ++st.in_flight);
        busy(st, forward_time(s, c));
        break;
      }
      case Op::Backward: {
        if (st.backwarded.get(mb, c)) throw ScheduleError(at(s, ins) + " runs twice");
        if (!st.forwarded.get(mb, c))
          throw ScheduleError(at(s, ins) + " comes before Forward(" + mb_name(mb, c) + ")");
        if (vs < last_virtual_ && !input_ready(s, mb, c, vs + 1, st.grad_in, st.backwarded))
          throw ScheduleError(at(s, ins) + " comes before its output's gradient: " +
                              missing_input(s, vs + 1, "RecvGrad", "Backward", mb));
        st.backwarded.set(mb, c);
        --st.in_flight;
        busy(st, backward_time(s, c));
        break;
      }
      case Op::SendActivation:
      case Op::SendGrad: {
        bool act = ins.op == Op::SendActivation;
        if (!(act ? st.forwarded : st.backwarded).get(mb, c))
          throw ScheduleError(at(s, ins) + " comes before " + (act ? "Forward(" : "Backward(") +
                              mb_name(mb, c) + ")");
        int to_virtual = act ? vs + 1 : vs - 1;
        if (to_virtual < 0 || to_virtual > last_virtual_)
          throw ScheduleError(at(s, ins) + ": the " + (act ? "last" : "first") +
                              " virtual stage has no one to send to");
        int to = stage_of(to_virtual);
        if (to == s)
          throw ScheduleError(at(s, ins) + ": the next chunk is on this stage; nothing to send");
        link(s, to).push_back({!act, mb, c, st.clock + times_.send_latency});
        break;
      }
      case Op::RecvActivation:
      case Op::RecvGrad: {
        bool act = ins.op == Op::RecvActivation;
        int from_virtual = act ? vs - 1 : vs + 1;
        if (from_virtual < 0 || from_virtual > last_virtual_)
          throw ScheduleError(at(s, ins) + ": the " + (act ? "first" : "last") +
                              " virtual stage has nothing to receive");
        int from = stage_of(from_virtual);
        if (from == s)
          throw ScheduleError(at(s, ins) +
                              ": the previous chunk is on this stage; nothing to receive");
        Flags& got = act ? st.act_in : st.grad_in;
        if (got.get(mb, c)) throw ScheduleError(at(s, ins) + " runs twice");
        auto& q = link(from, s);
        if (q.empty()) return false;
        const Message& head = q.front();
        if (head.grad == act || head.micro_batch != mb || head.chunk != chunk_of(from_virtual))
          throw ScheduleError(at(s, ins) + " meets stage " + std::to_string(from) + "'s " +
                              (head.grad ? "SendGrad(" : "SendActivation(") +
                              mb_name(head.micro_batch, head.chunk) +
                              ") first: the link delivers in order, and stage " +
                              std::to_string(from) + " sends in another order than stage " +
                              std::to_string(s) + " receives");
        st.clock = std::max(st.clock, head.arrival);
        q.pop_front();
        got.set(mb, c);
        break;
      }
      case Op::ReduceGrads: {
        if (st.reduced) throw ScheduleError(at(s, ins) + " runs twice");
        for (int k = 0; k < m_; ++k)
          for (int cc = 0; cc < v_; ++cc)
            if (!st.backwarded.get(k, cc))
              throw ScheduleError(at(s, ins) + " comes before Backward(" + mb_name(k, cc) + ")");
        st.reduced = true;
        busy(st, times_.reduce_grads);
        break;
      }
      case Op::OptimizerStep: {
        if (st.stepped) throw ScheduleError(at(s, ins) + " runs twice");
        if (!st.reduced) throw ScheduleError(at(s, ins) + " comes before ReduceGrads");
        st.stepped = true;
        busy(st, times_.optimizer_step);
        break;
      }
    }
    st.result.timeline.push_back({ins, start, st.clock});
    ++st.pc;
    return true;
  }

  double scale(int s) const { return times_.stage_scale.empty() ? 1.0 : times_.stage_scale[s]; }
  double forward_time(int s, int c) const {
    return times_.chunk_forward.empty() ? times_.forward * scale(s)
                                        : times_.chunk_forward[c * p_ + s];
  }
  double backward_time(int s, int c) const {
    return times_.chunk_backward.empty() ? times_.backward * scale(s)
                                         : times_.chunk_backward[c * p_ + s];
  }

  void busy(StageState& st, double seconds) {
    st.clock += seconds;
    st.result.busy += seconds;
  }

  // Chunk c's input from virtual stage from_virtual (its neighbour) for micro-batch mb: received
  // by chunk c, or computed here when that neighbour is on this stage (P = 1).
  bool input_ready(int s, int mb, int c, int from_virtual, const Flags& received,
                   const Flags& local) const {
    if (stage_of(from_virtual) == s) return local.get(mb, chunk_of(from_virtual));
    return received.get(mb, c);
  }

  std::string missing_input(int s, int from_virtual, const char* recv, const char* local,
                            int mb) const {
    if (stage_of(from_virtual) == s)
      return std::string("no ") + local + "(" + mb_name(mb, chunk_of(from_virtual)) +
             ") earlier on this stage";
    return std::string("no ") + recv + " earlier in its list";
  }

  std::string deadlock_message() const {
    std::string msg = "pipeline schedule deadlocks:";
    for (int s = 0; s < p_; ++s) {
      const auto& st = state_[s];
      if (finished(s)) continue;
      const Instruction& ins = sched_.per_stage[s][st.pc];
      int vs = ins.chunk * p_ + s;
      int from = stage_of(ins.op == Op::RecvActivation ? vs - 1 : vs + 1);
      msg += " stage " + std::to_string(s) + " waits in " + name(ins) + " (instruction " +
             std::to_string(st.pc) + ") for stage " + std::to_string(from);
      if (finished(from)) msg += ", which finished its list without sending it";
      msg += ";";
    }
    msg.pop_back();
    return msg;
  }

  void check_complete() const {
    for (const auto& [key, q] : links_) {
      if (q.empty()) continue;
      auto [from, to] = key;
      throw ScheduleError("stage " + std::to_string(from) + "'s " +
                          (q.front().grad ? "SendGrad(" : "SendActivation(") +
                          mb_name(q.front().micro_batch, q.front().chunk) + ") to stage " +
                          std::to_string(to) + " is never received");
    }
    for (int s = 0; s < p_; ++s) {
      const auto& st = state_[s];
      for (int k = 0; k < m_; ++k)
        for (int c = 0; c < v_; ++c) {
          if (!st.forwarded.get(k, c))
            throw ScheduleError("stage " + std::to_string(s) + " never runs Forward(" +
                                mb_name(k, c) + ")");
          if (!st.backwarded.get(k, c))
            throw ScheduleError("stage " + std::to_string(s) + " never runs Backward(" +
                                mb_name(k, c) + ")");
        }
      if (!st.stepped)
        throw ScheduleError("stage " + std::to_string(s) + " never runs " +
                            (st.reduced ? "OptimizerStep" : "ReduceGrads"));
    }
  }

  const Schedule& sched_;
  OpTimes times_;
  int p_, m_, v_, last_virtual_;
  std::vector<StageState> state_;
  std::map<std::pair<int, int>, std::deque<Message>> links_;  // (from, to)
};

}  // namespace

SimulationResult simulate(const Schedule& schedule, const OpTimes& times) {
  if (schedule.stages < 1 || schedule.micro_batches < 1 || schedule.virtual_stages < 1)
    throw std::invalid_argument("pipeline simulation: stages " + std::to_string(schedule.stages) +
                                ", micro-batches " + std::to_string(schedule.micro_batches) +
                                " and virtual stages " + std::to_string(schedule.virtual_stages) +
                                " must each be >= 1");
  if (static_cast<int>(schedule.per_stage.size()) != schedule.stages)
    throw std::invalid_argument(
        "pipeline simulation: " + std::to_string(schedule.per_stage.size()) +
        " instruction lists for " + std::to_string(schedule.stages) + " stages");
  for (double t : {times.forward, times.backward, times.send_latency, times.reduce_grads,
                   times.optimizer_step})
    if (!(t >= 0)) throw std::invalid_argument("pipeline simulation: durations must be >= 0");
  if (!times.stage_scale.empty() && static_cast<int>(times.stage_scale.size()) != schedule.stages)
    throw std::invalid_argument("pipeline simulation: " + std::to_string(times.stage_scale.size()) +
                                " stage scales for " + std::to_string(schedule.stages) + " stages");
  for (double x : times.stage_scale)
    if (!(x >= 0)) throw std::invalid_argument("pipeline simulation: stage scales must be >= 0");
  if (!times.chunk_forward.empty() || !times.chunk_backward.empty()) {
    const size_t chunks = static_cast<size_t>(schedule.stages) * schedule.virtual_stages;
    if (times.chunk_forward.size() != chunks || times.chunk_backward.size() != chunks)
      throw std::invalid_argument(
          "pipeline simulation: " + std::to_string(times.chunk_forward.size()) +
          " chunk forward and " + std::to_string(times.chunk_backward.size()) +
          " chunk backward times for " + std::to_string(chunks) +
          " chunks (stages x virtual stages); give one of each per chunk");
    if (!times.stage_scale.empty())
      throw std::invalid_argument(
          "pipeline simulation: chunk times and stage scales together; scale the chunk times "
          "instead");
    for (const auto* v : {&times.chunk_forward, &times.chunk_backward})
      for (double t : *v)
        if (!(t >= 0)) throw std::invalid_argument("pipeline simulation: durations must be >= 0");
  }
  return Simulator(schedule, times).run();
}

}  // namespace zero::pipeline
