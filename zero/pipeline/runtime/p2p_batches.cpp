#include "zero/pipeline/runtime/p2p_batches.hpp"

#include <algorithm>
#include <map>
#include <optional>
#include <tuple>
#include <utility>

#include "zero/pipeline/runtime/early_recvs.hpp"
#include "zero/pipeline/tied_grads.hpp"

namespace zero::pipeline {
namespace {

bool is_send(Op op) { return op == Op::SendActivation || op == Op::SendGrad; }

// One stage's plan, written as the runtime posts (p2p.cpp: post_early, the queue and its
// flushes, settle, wait_sends).
class StagePlanner {
 public:
  StagePlanner(const Schedule& schedule, int stage, const PlanOptions& opts)
      : sch_(schedule),
        s_(stage),
        P_(schedule.stages),
        opts_(opts),
        list_(schedule.per_stage[stage]) {
    const int v = schedule.virtual_stages;
    recv_known_.assign(v, false);
    sent_known_.assign(v, false);
    grad_checked_.assign(v, false);
    for (size_t i = 0; i < list_.size(); ++i)
      if (list_[i].op == Op::Backward) last_backward_ = static_cast<int>(i);
    std::vector<bool> fenced(list_.size(), false);
    for (const auto& holders : opts.ties) {
      if (holders.size() < 2 || std::find(holders.begin(), holders.end(), s_) == holders.end())
        continue;
      Tie t{holders.front(), {holders.begin() + 1, holders.end()}, -1};
      if (t.owner == s_) {
        if (last_backward_ >= 0) fenced[last_backward_] = true;
      } else {
        t.send_after = tied_grad_send_after(schedule, s_, t.owner);
        fenced[t.send_after] = true;
      }
      ties_.push_back(std::move(t));
    }
    if (opts.early_receives && P_ > 1) {
      auto channel = [this](const Instruction& ins) {
        const bool to_next = ins.op == Op::SendActivation || ins.op == Op::RecvGrad;
        const int peer = to_next ? next() : prev();
        return is_send(ins.op) ? group_of(s_, peer) : group_of(peer, s_);
      };
      early_ = early_receives(list_, channel, fenced);
    }
  }

  StagePlan run() {
    if (opts_.steps == 1) {  // a later step alone: every shape known
      std::fill(recv_known_.begin(), recv_known_.end(), true);
      std::fill(sent_known_.begin(), sent_known_.end(), true);
      std::fill(grad_checked_.begin(), grad_checked_.end(), true);
      step_ = 1;
      one_step();
    }
    for (int step = 0; opts_.steps > 1 && step < opts_.steps; ++step) {
      step_ = std::min(step, 1);
      one_step();
    }
    return std::move(plan_);
  }

 private:
  struct Tie {
    int owner;
    std::vector<int> others;
    int send_after;
  };
  struct Queued {
    int group;
    PlannedOp op;
    int* batch_out;  // where the batch index goes (null: nowhere)
  };
  struct Sent {
    std::optional<Instruction> ins;
    int batch;
  };

  int next() const { return (s_ + 1) % P_; }
  int prev() const { return (s_ + P_ - 1) % P_; }

  void queue(bool send, int peer, int index, int* out, bool meta = false) {
    const int group = send ? group_of(s_, peer) : group_of(peer, s_);
    queued_.push_back({group, PlannedOp{send, peer, index, meta}, out});
  }
  void queue_send(int peer, std::optional<Instruction> ins, int index, bool meta = false) {
    sent_.push_back({ins, -1});
    // sent_ may grow before the flush: the index is resolved by position then.
    queued_.push_back({group_of(s_, peer), PlannedOp{true, peer, index, meta}, nullptr});
    pending_sent_.push_back(sent_.size() - 1);
  }

  void flush() {
    if (queued_.empty()) return;
    std::map<int, int> batch_of_group;
    size_t send_at = 0;
    for (auto& q : queued_) {
      int b;
      auto it = batch_of_group.find(q.group);
      if (opts_.batched && it != batch_of_group.end()) {
        b = it->second;
      } else {
        b = static_cast<int>(plan_.batches.size());
        plan_.batches.push_back({q.group, {}, false, step_});
        plan_.items.push_back({PlanItem::Post, b});
        batch_of_group[q.group] = b;
      }
      plan_.batches[b].ops.push_back(q.op);
      if (q.batch_out) *q.batch_out = b;
      if (q.op.send && !q.batch_out) sent_[pending_sent_[send_at++]].batch = b;
    }
    queued_.clear();
    pending_sent_.clear();
  }

  void wait(int batch) { plan_.items.push_back({PlanItem::Wait, batch}); }

  // A receive posted and waited on at once (p2p.cpp's recv()).
  int recv_now(int peer, int index, bool meta = false) {
    int b = -1;
    queue(false, peer, index, &b, meta);
    flush();
    wait(b);
    return b;
  }

  void settle(const std::vector<Instruction>& delivered) {
    flush();
    for (const auto& ins : delivered) {
      for (auto it = sent_.begin(); it != sent_.end();) {
        if (it->ins == ins) {
          wait(it->batch);
          it = sent_.erase(it);
        } else {
          ++it;
        }
      }
    }
  }

  void wait_sends(bool schedule_only) {
    flush();
    for (auto it = sent_.begin(); it != sent_.end();) {
      if (schedule_only && !it->ins) {
        ++it;
        continue;
      }
      wait(it->batch);
      it = sent_.erase(it);
    }
  }

  void one_step() {
    const auto delivered = delivered_sends(sch_, s_);
    std::map<int, int> posted;  // receive index -> its batch
    for (size_t idx = 0; idx < list_.size(); ++idx) {
      const Instruction& ins = list_[idx];
      const int i = static_cast<int>(idx);
      if (idx < early_.size()) {
        for (int r : early_[idx]) {
          if (r == i) continue;
          const Instruction& rec = list_[r];
          const bool act = rec.op == Op::RecvActivation;
          if (!(act ? recv_known_ : sent_known_)[rec.chunk]) continue;
          queue(false, act ? prev() : next(), r, &posted[r]);
        }
      }
      if (ins.op == Op::Forward || ins.op == Op::Backward || ins.op == Op::ReduceGrads ||
          ins.op == Op::OptimizerStep)
        flush();
      switch (ins.op) {
        case Op::RecvActivation:
        case Op::RecvGrad: {
          const bool act = ins.op == Op::RecvActivation;
          const int peer = act ? prev() : next();
          if (auto it = posted.find(i); it != posted.end()) {
            flush();
            wait(it->second);
            posted.erase(it);
          } else {
            if (act && !recv_known_[ins.chunk]) {
              plan_.items.push_back({PlanItem::HostRead, recv_now(peer, i, /*meta=*/true)});
              recv_known_[ins.chunk] = true;
            }
            recv_now(peer, i);
          }
          settle(delivered[idx]);
          break;
        }
        case Op::Forward:
          plan_.items.push_back({PlanItem::Compute, -1});
          break;
        case Op::Backward:
          if (i == last_backward_) {
            for (const auto& t : ties_)
              if (t.owner == s_)
                for (int o : t.others) recv_now(o, -1);
          }
          plan_.items.push_back({PlanItem::Compute, -1});
          break;
        case Op::SendActivation:
          if (!sent_known_[ins.chunk]) {
            if (opts_.check_activations) flush();
            // The shape goes in a batch of its own (with what was queued before it): the
            // receiving stage reads it on the host before it posts the activation's receive.
            queue_send(next(), ins, i, /*meta=*/true);
            flush();
            sent_known_[ins.chunk] = true;
          }
          queue_send(next(), ins, i);
          break;
        case Op::SendGrad:
          if (opts_.check_grads && !grad_checked_[ins.chunk]) {
            flush();
            grad_checked_[ins.chunk] = true;
          }
          queue_send(prev(), ins, i);
          break;
        case Op::ReduceGrads:
          wait_sends(/*schedule_only=*/true);
          plan_.items.push_back({PlanItem::Compute, -1});
          break;
        case Op::OptimizerStep:
          plan_.items.push_back({PlanItem::Compute, -1});
          for (const auto& t : ties_) {
            if (t.owner == s_) {
              for (int o : t.others) queue_send(o, std::nullopt, -1);
            } else {
              recv_now(t.owner, -1);
            }
          }
          break;
      }
      for (const auto& t : ties_)
        if (t.owner != s_ && t.send_after == i) queue_send(t.owner, std::nullopt, -1);
    }
    flush();
    // The loss, broadcast from the last stage over the pipeline group.
    const int b = static_cast<int>(plan_.batches.size());
    plan_.batches.push_back({kUpGroup, {}, true, step_});
    plan_.items.push_back({PlanItem::Post, b});
    wait(b);
    wait_sends(/*schedule_only=*/false);
  }

  const Schedule& sch_;
  int s_, P_;
  PlanOptions opts_;
  const std::vector<Instruction>& list_;
  int last_backward_ = -1;
  std::vector<Tie> ties_;
  std::vector<std::vector<int>> early_;
  std::vector<bool> recv_known_, sent_known_, grad_checked_;
  std::vector<Queued> queued_;
  std::vector<Sent> sent_;
  std::vector<size_t> pending_sent_;
  int step_ = 0;
  StagePlan plan_;
};

std::string describe(const StagePlan& plan, int stage, size_t item) {
  const PlanItem& it = plan.items[item];
  std::string s = "stage " + std::to_string(stage) + " item " + std::to_string(item) + " (";
  if (it.kind == PlanItem::Compute) return s + "compute)";
  const PlannedBatch& b = plan.batches[it.batch];
  s += it.kind == PlanItem::Post ? "post" : it.kind == PlanItem::Wait ? "wait on" : "host read of";
  s += " batch " + std::to_string(it.batch) + " of step " + std::to_string(b.step + 1) + ":";
  if (b.collective) s += " the loss's broadcast";
  for (const auto& op : b.ops)
    s += std::string(op.send ? " send to " : " recv from ") + std::to_string(op.peer) +
         (op.index >= 0 ? " for instruction " + std::to_string(op.index) : " (tied)") +
         (op.meta ? " (shape)" : "");
  return s + ")";
}

}  // namespace

std::vector<StagePlan> p2p_plan(const Schedule& schedule, const PlanOptions& opts) {
  std::vector<StagePlan> plans;
  for (int s = 0; s < schedule.stages; ++s) plans.push_back(StagePlanner(schedule, s, opts).run());
  return plans;
}

std::string device_deadlock(const std::vector<StagePlan>& plans, bool batched) {
  const int P = static_cast<int>(plans.size());
  struct Node {
    int stage;
    size_t item;
    int pred = -1;              // the previous node on its stream
    int c_dep = -1;             // Post: the compute stream's last node before it
    int gate = -1;              // the last host read before it
    int post = -1;              // Wait / HostRead: its batch's Post node
    std::vector<int> partners;  // Post: the Post nodes holding its messages' other ends
    bool started = false, done = false;
  };
  std::vector<Node> nodes;
  std::vector<std::vector<int>> node_of(P);             // [stage][item]
  std::vector<std::map<int, int>> post_of(P);           // [stage][batch] -> node
  std::map<std::tuple<int, int, int, int>, int> sends;  // (group, from, to, k) -> node
  std::map<std::tuple<int, int, int, int>, int> recvs;
  std::map<std::pair<int, int>, std::vector<int>> collectives;  // (group, k) -> nodes
  for (int s = 0; s < P; ++s) {
    const StagePlan& plan = plans[s];
    std::map<std::pair<int, int>, int> last_on;  // stream -> node; (-1, -1): compute
    std::map<std::tuple<int, int, int>, int> count;
    std::map<int, int> coll_count;
    int last_c = -1, gate = -1;
    for (size_t i = 0; i < plan.items.size(); ++i) {
      const PlanItem& it = plan.items[i];
      Node n{s, i};
      n.gate = gate;
      const int id = static_cast<int>(nodes.size());
      if (it.kind == PlanItem::Post) {
        const PlannedBatch& b = plan.batches[it.batch];
        const int peer = batched || b.collective || b.ops.empty() ? -1 : b.ops.front().peer;
        const std::pair<int, int> stream{b.group, peer};
        if (auto f = last_on.find(stream); f != last_on.end()) n.pred = f->second;
        last_on[stream] = id;
        n.c_dep = last_c;
        post_of[s][it.batch] = id;
        if (b.collective) collectives[{b.group, coll_count[b.group]++}].push_back(id);
        for (const auto& op : b.ops) {
          const int from = op.send ? s : op.peer, to = op.send ? op.peer : s;
          const int k = count[{b.group, from, to}]++;
          (op.send ? sends : recvs)[{b.group, from, to, k}] = id;
        }
      } else {
        n.pred = last_c;
        last_c = id;
        if (it.kind != PlanItem::Compute) n.post = post_of[s].at(it.batch);
        if (it.kind == PlanItem::HostRead) gate = id;
      }
      node_of[s].push_back(id);
      nodes.push_back(std::move(n));
    }
  }
  for (const auto& [key, from_node] : sends) {
    auto r = recvs.find(key);
    if (r == recvs.end())
      return "a send from stage " + std::to_string(std::get<1>(key)) + " to stage " +
             std::to_string(std::get<2>(key)) + " has no receive";
    nodes[from_node].partners.push_back(r->second);
    nodes[r->second].partners.push_back(from_node);
  }
  if (recvs.size() != sends.size()) return "a receive has no send";
  for (const auto& [key, list] : collectives) {
    if (static_cast<int>(list.size()) != P) return "a collective misses a stage";
    for (int a : list)
      for (int b : list)
        if (a != b) nodes[a].partners.push_back(b);
  }
  // Each node is looked at again only when something it waits for moved: linear in the edges.
  const int N = static_cast<int>(nodes.size());
  std::vector<std::vector<int>> on_done(N), on_start(N);
  for (int id = 0; id < N; ++id) {
    const Node& n = nodes[id];
    for (int d : {n.pred, n.c_dep, n.gate, n.post})
      if (d >= 0) on_done[d].push_back(id);
    for (int p : n.partners) on_start[p].push_back(id);
  }
  auto done = [&](int id) { return id < 0 || nodes[id].done; };
  std::vector<int> work(N);
  for (int id = 0; id < N; ++id) work[id] = N - 1 - id;
  while (!work.empty()) {
    const int id = work.back();
    work.pop_back();
    Node& n = nodes[id];
    if (n.done) continue;
    const bool was_started = n.started;
    if (plans[n.stage].items[n.item].kind == PlanItem::Post) {
      if (!n.started && done(n.pred) && done(n.c_dep) && done(n.gate)) n.started = true;
      if (n.started && std::all_of(n.partners.begin(), n.partners.end(),
                                   [&](int p) { return nodes[p].started; }))
        n.done = true;
    } else if (done(n.pred) && done(n.gate) && done(n.post)) {
      n.started = n.done = true;
    }
    if (n.started && !was_started) {
      for (int d : on_start[id]) work.push_back(d);
      if (!n.done) work.push_back(id);
    }
    if (n.done)
      for (int d : on_done[id]) work.push_back(d);
  }
  std::string stuck;
  for (int s = 0; s < P; ++s) {
    for (int id : node_of[s]) {
      if (nodes[id].done) continue;
      stuck += (stuck.empty() ? "" : "; ") + describe(plans[s], s, nodes[id].item);
      break;
    }
  }
  return stuck;
}

bool batching_is_safe(const Schedule& schedule, const PlanOptions& opts) {
  PlanOptions o = opts;
  o.batched = true;
  return device_deadlock(p2p_plan(schedule, o), true).empty();
}

}  // namespace zero::pipeline
