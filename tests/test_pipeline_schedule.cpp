// Pipeline schedules as data (zero/pipeline/): each stage's instruction list for GPipe, 1F1B and
// interleaved 1F1B, and the simulator that runs all stages' lists together. The references are
// closed forms from the papers, not the code under test:
//   bubble, GPipe and 1F1B (Huang et al. 2019, GPipe §2.3; Narayanan et al. 2021, Megatron-LM
//     §2.2.1): with equal stages and free links every stage idles (P-1)·(t_f+t_b) of a step of
//     (m+P-1)·(t_f+t_b), a fraction (P-1)/(m+P-1), whatever t_b/t_f;
//   activations held: GPipe all m micro-batches; 1F1B at most P-s on stage s (PipeDream-Flush,
//     Narayanan et al. 2021 §2.2.1), min(P-s, m);
//   GPipe with a link latency L: the forward wave and the backward wave each cross P-1 links,
//     so the step is (m+P-1)·(t_f+t_b) + 2·(P-1)·L (worked out by hand in the test).
// Also: causality under every schedule, the refusals of bad shapes and broken lists, and when a
// send is known delivered. The interleaved schedule's own formulas and Megatron-LM's order are
// in test_pipeline_schedule_interleaved.cpp.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <set>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include "support/schedule_lists.hpp"
#include "zero/pipeline/figures.hpp"
#include "zero/pipeline/schedule.hpp"
#include "zero/pipeline/simulate.hpp"

namespace zero::pipeline {
namespace {

constexpr ScheduleKind kFlat[] = {ScheduleKind::GPipe, ScheduleKind::OneFOneB};

using testing::label;
using testing::micro_batches_of;
using testing::position;

// Read from the lists alone, not the simulator: each stage forwards and backwards every
// micro-batch once, the forward first, with the receive right before and the send right after
// it, and ends with ReduceGrads then OptimizerStep.
TEST(PipelineSchedule, EveryMicroBatchOnceForwardBeforeBackward) {
  for (auto kind : kFlat)
    for (int p = 1; p <= 8; ++p)
      for (int m = 1; m <= 16; ++m) {
        Schedule sched = make_schedule(kind, p, m);
        ASSERT_EQ(sched.per_stage.size(), size_t(p));
        for (int s = 0; s < p; ++s) {
          SCOPED_TRACE(label(kind, p, m) + " stage " + std::to_string(s));
          const auto& list = sched.per_stage[s];
          std::vector<int> all(m);
          for (int k = 0; k < m; ++k) all[k] = k;
          auto fwd = micro_batches_of(list, Op::Forward);
          auto bwd = micro_batches_of(list, Op::Backward);
          std::sort(fwd.begin(), fwd.end());
          std::sort(bwd.begin(), bwd.end());
          EXPECT_EQ(fwd, all);
          EXPECT_EQ(bwd, all);
          for (int k = 0; k < m; ++k) {
            int f = position(list, {Op::Forward, k});
            int b = position(list, {Op::Backward, k});
            EXPECT_LT(f, b) << "micro-batch " << k;
            if (s > 0) EXPECT_EQ(position(list, {Op::RecvActivation, k}), f - 1);
            if (s < p - 1) EXPECT_EQ(position(list, {Op::SendActivation, k}), f + 1);
            if (s < p - 1) EXPECT_EQ(position(list, {Op::RecvGrad, k}), b - 1);
            if (s > 0) EXPECT_EQ(position(list, {Op::SendGrad, k}), b + 1);
          }
          // The first stage receives nothing, the last sends nothing onward.
          if (s == 0) EXPECT_TRUE(micro_batches_of(list, Op::RecvActivation).empty());
          if (s == p - 1) EXPECT_TRUE(micro_batches_of(list, Op::SendActivation).empty());
          ASSERT_GE(list.size(), 2u);
          EXPECT_EQ(list[list.size() - 2], (Instruction{Op::ReduceGrads}));
          EXPECT_EQ(list.back(), (Instruction{Op::OptimizerStep}));
        }
      }
}

// Each link carries its messages in order, so a stage must send in the order its neighbour
// receives: activations s -> s+1, gradients s+1 -> s. And the whole step runs to the end.
TEST(PipelineSchedule, SendsAndReceivesPairUpBetweenNeighbours) {
  for (auto kind : kFlat)
    for (int p = 1; p <= 8; ++p)
      for (int m = 1; m <= 16; ++m) {
        SCOPED_TRACE(label(kind, p, m));
        Schedule sched = make_schedule(kind, p, m);
        for (int s = 0; s + 1 < p; ++s) {
          const auto& here = sched.per_stage[s];
          const auto& next = sched.per_stage[s + 1];
          EXPECT_EQ(micro_batches_of(here, Op::SendActivation),
                    micro_batches_of(next, Op::RecvActivation))
              << "stage " << s;
          EXPECT_EQ(micro_batches_of(next, Op::SendGrad), micro_batches_of(here, Op::RecvGrad))
              << "stage " << s;
          EXPECT_EQ(micro_batches_of(here, Op::SendActivation).size(), size_t(m));
        }
        EXPECT_NO_THROW(simulate(sched));
      }
}

// Causality on the simulator's clock, by virtual stage (chunk c of stage s is c·P + s; without
// interleaving, the stage): micro-batch k's forward starts after it ended on the virtual stage
// before (plus the link's latency when that is another stage), its backward after it ended on
// the one after; no stage runs two things at once.
void expect_causal(const Schedule& sched) {
  int p = sched.stages;
  int m = sched.micro_batches;
  int v = sched.virtual_stages;
  OpTimes t;
  t.forward = 1.0;
  t.backward = 2.5;
  t.send_latency = 0.125;
  SimulationResult r = simulate(sched, t);
  std::map<std::pair<int, int>, TimedInstruction> fwd, bwd;  // (virtual stage, micro-batch)
  for (int s = 0; s < p; ++s) {
    double prev_end = 0;
    for (const auto& ti : r.stages[s].timeline) {
      EXPECT_GE(ti.start, prev_end);
      prev_end = ti.end;
      std::pair key(ti.ins.chunk * p + s, ti.ins.micro_batch);
      if (ti.ins.op == Op::Forward) fwd[key] = ti;
      if (ti.ins.op == Op::Backward) bwd[key] = ti;
    }
  }
  auto f = [&](int vs, int k) { return fwd.at(std::pair(vs, k)); };
  auto b = [&](int vs, int k) { return bwd.at(std::pair(vs, k)); };
  double link = p > 1 ? t.send_latency : 0;
  for (int vs = 0; vs < p * v; ++vs)
    for (int k = 0; k < m; ++k) {
      if (vs > 0) EXPECT_GE(f(vs, k).start, f(vs - 1, k).end + link);
      if (vs + 1 < p * v) EXPECT_GE(b(vs, k).start, b(vs + 1, k).end + link);
      EXPECT_GE(b(vs, k).start, f(vs, k).end);
    }
}

TEST(PipelineSchedule, SimulatedTimesRespectDependencies) {
  for (auto kind : kFlat)
    for (int p : {1, 2, 3, 5, 8})
      for (int m : {1, 2, 7, 16}) {
        SCOPED_TRACE(label(kind, p, m));
        expect_causal(make_schedule(kind, p, m));
      }
  for (int p : {1, 2, 4})
    for (int v : {2, 3})
      for (int m : {p, 2 * p, 4 * p}) {
        SCOPED_TRACE(label(ScheduleKind::Interleaved, p, m, v));
        expect_causal(make_schedule(ScheduleKind::Interleaved, p, m, v));
      }
}

// Same work, different order: GPipe and 1F1B run the same forwards and backwards on each stage.
TEST(PipelineSchedule, GPipeAndOneFOneBDoEqualWork) {
  for (int p = 1; p <= 8; ++p)
    for (int m = 1; m <= 16; ++m) {
      SCOPED_TRACE(label(ScheduleKind::OneFOneB, p, m));
      Schedule g = make_schedule(ScheduleKind::GPipe, p, m);
      Schedule o = make_schedule(ScheduleKind::OneFOneB, p, m);
      for (int s = 0; s < p; ++s) {
        auto sorted = [](std::vector<Instruction> l) {
          std::sort(l.begin(), l.end(), [](const Instruction& a, const Instruction& b) {
            return std::pair(int(a.op), a.micro_batch) < std::pair(int(b.op), b.micro_batch);
          });
          return l;
        };
        EXPECT_EQ(sorted(g.per_stage[s]), sorted(o.per_stage[s])) << "stage " << s;
      }
      SimulationResult rg = simulate(g), ro = simulate(o);
      for (int s = 0; s < p; ++s) {
        EXPECT_DOUBLE_EQ(rg.stages[s].busy, m * 3.0);  // m·(t_f + t_b), t_b = 2·t_f = 2
        EXPECT_DOUBLE_EQ(ro.stages[s].busy, m * 3.0);
      }
    }
}

// The textbook bubble (P-1)/(m+P-1) on every stage, for both schedules, at two t_b/t_f ratios;
// and the step (m+P-1)·(t_f+t_b).
TEST(PipelineSchedule, BubbleIsTheTextbookFraction) {
  for (auto kind : kFlat)
    for (double tb : {2.0, 3.0})
      for (int p = 1; p <= 8; ++p)
        for (int m = 1; m <= 16; ++m) {
          SCOPED_TRACE(label(kind, p, m) + " t_b=" + std::to_string(tb));
          OpTimes t;
          t.forward = 1.0;
          t.backward = tb;
          SimulationResult r = simulate(make_schedule(kind, p, m), t);
          double expected = double(p - 1) / (m + p - 1);
          EXPECT_NEAR(r.makespan, (m + p - 1) * (1.0 + tb), 1e-9);
          EXPECT_NEAR(r.bubble_fraction, expected, 1e-12);
          for (int s = 0; s < p; ++s) EXPECT_NEAR(r.stages[s].idle_fraction, expected, 1e-12);
        }
}

// Measured for the table (m = 4, 8, 16): printed, and equal to the closed form.
TEST(PipelineSchedule, BubbleTableForFourStages) {
  for (int m : {4, 8, 16})
    for (auto kind : kFlat) {
      PipelineFigures f = pipeline_figures(kind, 4, m);
      std::printf("P=4 m=%2d %-5s bubble %.4f (formula %.4f), first stage holds %d\n", m,
                  std::string(schedule_name(kind)).c_str(), f.bubble_fraction,
                  f.textbook_bubble_fraction, f.peak_in_flight[0]);
      EXPECT_NEAR(f.bubble_fraction, 3.0 / (m + 3), 1e-12);
    }
}

// GPipe with a link latency L: (m+P-1)·(t_f+t_b) + 2·(P-1)·L. By hand: the last stage's
// forward of micro-batch m-1 ends at (m+P-1)·t_f + (P-1)·L (the forward wave crosses P-1
// links; after it the stages are never starved since each forward takes as long on every
// stage); the last stage then runs its m backwards back to back, and the last backward crosses
// P-1 links and stages back to stage 0: + m·t_b + (P-1)·(t_b + L).
TEST(PipelineSchedule, GPipeLatencyCrossesEachLinkTwice) {
  for (int p = 1; p <= 8; ++p)
    for (int m : {1, 3, 8, 16}) {
      OpTimes t;
      t.forward = 1.0;
      t.backward = 2.0;
      t.send_latency = 0.25;
      SimulationResult r = simulate(make_schedule(ScheduleKind::GPipe, p, m), t);
      EXPECT_DOUBLE_EQ(r.makespan, (m + p - 1) * 3.0 + 2 * (p - 1) * 0.25)
          << label(ScheduleKind::GPipe, p, m);
    }
}

// Unequal stages, GPipe: each phase is a flow shop of m identical jobs through P machines,
// whose makespan is the sum of the P stage times plus (m-1) times the slowest (the bottleneck
// paces every job after the first). The backward phase starts when the last stage's last
// forward ends, and no stage is still forwarding then, so the step is
//   Σ f_s + (m-1)·max f_s + Σ b_s + (m-1)·max b_s.
TEST(PipelineSchedule, GPipeWithUnequalStagesIsPacedByTheSlowest) {
  std::vector<double> scale = {1.0, 2.5, 0.5, 1.5};
  double sum = 0, slowest = 0;
  for (double x : scale) sum += x, slowest = std::max(slowest, x);
  for (int m : {1, 2, 5, 16}) {
    OpTimes t;
    t.forward = 1.0;
    t.backward = 2.0;
    t.stage_scale = scale;
    SimulationResult r = simulate(make_schedule(ScheduleKind::GPipe, 4, m), t);
    EXPECT_DOUBLE_EQ(r.makespan, 3.0 * (sum + (m - 1) * slowest)) << "m=" << m;
    // Stage 1 is the bottleneck: it idles least.
    for (int s : {0, 2, 3}) EXPECT_GT(r.stages[s].idle_fraction, r.stages[1].idle_fraction);
  }
  OpTimes wrong;
  wrong.stage_scale = {1.0, 2.0};
  EXPECT_THROW(simulate(make_schedule(ScheduleKind::GPipe, 4, 4), wrong), std::invalid_argument);
}

// GPipe holds every micro-batch's activations before the first backward; 1F1B at most P-s.
TEST(PipelineSchedule, PeakInFlightActivations) {
  for (int p = 1; p <= 8; ++p)
    for (int m = 1; m <= 16; ++m) {
      SCOPED_TRACE(label(ScheduleKind::OneFOneB, p, m));
      SimulationResult g = simulate(make_schedule(ScheduleKind::GPipe, p, m));
      SimulationResult o = simulate(make_schedule(ScheduleKind::OneFOneB, p, m));
      for (int s = 0; s < p; ++s) {
        EXPECT_EQ(g.stages[s].peak_in_flight, m) << "stage " << s;
        EXPECT_EQ(o.stages[s].peak_in_flight, std::min(p - s, m)) << "stage " << s;
      }
    }
}

template <class E>
std::string error_of(auto&& f) {
  try {
    f();
  } catch (const E& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(PipelineSchedule, BadShapesNameTheNumbers) {
  using IA = std::invalid_argument;
  EXPECT_NE(error_of<IA>([] { one_f_one_b_schedule(0, 4, 0); }).find("stages is 0"),
            std::string::npos);
  EXPECT_NE(error_of<IA>([] { gpipe_schedule(4, 0, 0); }).find("micro-batches"), std::string::npos);
  EXPECT_NE(error_of<IA>([] { gpipe_schedule(4, -2, 0); }).find("is -2"), std::string::npos);
  EXPECT_NE(error_of<IA>([] { one_f_one_b_schedule(4, 8, 4); }).find("stage 4 is outside 0..3"),
            std::string::npos);
  EXPECT_NE(error_of<IA>([] { one_f_one_b_schedule(4, 8, -1); }).find("stage -1"),
            std::string::npos);
  EXPECT_NE(error_of<IA>([] {
              interleaved_schedule(4, 6, 0, 2);
            }).find("multiple of stages: 6 micro-batches on 4 stages (use 8"),
            std::string::npos);
  EXPECT_NE(error_of<IA>([] { interleaved_schedule(4, 8, 0, 0); }).find("virtual stages"),
            std::string::npos);
  EXPECT_NE(error_of<IA>([] { make_schedule(ScheduleKind::GPipe, 4, 8, 2); }).find("interleaved"),
            std::string::npos);
  EXPECT_NE(error_of<IA>([] { parse_schedule_kind("pipedream"); }).find("'pipedream'"),
            std::string::npos);
  EXPECT_EQ(parse_schedule_kind("1f1b"), ScheduleKind::OneFOneB);
  EXPECT_EQ(parse_schedule_kind("gpipe"), ScheduleKind::GPipe);
  EXPECT_EQ(parse_schedule_kind("interleaved"), ScheduleKind::Interleaved);
  OpTimes negative;
  negative.forward = -1;
  EXPECT_THROW(simulate(make_schedule(ScheduleKind::GPipe, 2, 2), negative), IA);
}

// Broken schedules: the simulator must refuse each, naming the stage, the instruction and the
// micro-batch, rather than report a makespan.
TEST(PipelineSchedule, SimulatorRefusesBrokenSchedules) {
  auto broken = [](auto edit) {
    Schedule s = make_schedule(ScheduleKind::OneFOneB, 3, 4);
    edit(s.per_stage);
    return error_of<ScheduleError>([&] { simulate(s); });
  };
  auto swap_first = [](std::vector<Instruction>& l, Instruction a, Instruction b) {
    std::iter_swap(std::find(l.begin(), l.end(), a), std::find(l.begin(), l.end(), b));
  };
  // Stage 1 receives micro-batch 1 before 0: the link holds 0 first.
  std::string mismatch = broken([&](auto& ps) {
    swap_first(ps[1], {Op::RecvActivation, 0}, {Op::RecvActivation, 1});
  });
  EXPECT_NE(mismatch.find("stage 1 RecvActivation(micro-batch 1) meets stage 0's "
                          "SendActivation(micro-batch 0) first"),
            std::string::npos)
      << mismatch;
  // Stage 0 waits for a gradient before sending anything: both ends wait.
  std::string deadlock = broken([](auto& ps) {
    ps[0].insert(ps[0].begin(), Instruction{Op::RecvGrad, 0});
    ps[0].erase(std::find(ps[0].begin() + 1, ps[0].end(), Instruction{Op::RecvGrad, 0}));
  });
  EXPECT_NE(deadlock.find("deadlocks"), std::string::npos) << deadlock;
  EXPECT_NE(deadlock.find("stage 0 waits in RecvGrad(micro-batch 0)"), std::string::npos)
      << deadlock;
  EXPECT_NE(deadlock.find("stage 1 waits in RecvActivation(micro-batch 0)"), std::string::npos)
      << deadlock;
  // A send left out: stage 1 waits forever for the activation stage 0 never sends ...
  std::string unsent = broken([](auto& ps) {
    ps[0].erase(std::find(ps[0].begin(), ps[0].end(), Instruction{Op::SendActivation, 3}));
  });
  EXPECT_NE(unsent.find("stage 1 waits in RecvActivation(micro-batch 3)"), std::string::npos)
      << unsent;
  // ... and stage 0 for the last gradient stage 1 never sends, though it ran to its end.
  std::string unsent_grad = broken([](auto& ps) {
    ps[1].erase(std::find(ps[1].begin(), ps[1].end(), Instruction{Op::SendGrad, 3}));
  });
  EXPECT_NE(unsent_grad.find("stage 0 waits in RecvGrad(micro-batch 3) (instruction"),
            std::string::npos)
      << unsent_grad;
  EXPECT_NE(unsent_grad.find("for stage 1, which finished its list without sending it"),
            std::string::npos)
      << unsent_grad;
  // A receive left out: the send is never received, and the forward has no input.
  std::string unreceived = broken([](auto& ps) {
    ps[2].erase(std::find(ps[2].begin(), ps[2].end(), Instruction{Op::RecvActivation, 2}));
  });
  EXPECT_NE(unreceived.find("stage 2 Forward(micro-batch 2) comes before its input"),
            std::string::npos)
      << unreceived;
  // A backward left out.
  std::string no_backward = broken([](auto& ps) {
    ps[0].erase(std::find(ps[0].begin(), ps[0].end(), Instruction{Op::Backward, 3}));
  });
  EXPECT_NE(no_backward.find("stage 0 ReduceGrads comes before Backward(micro-batch 3)"),
            std::string::npos)
      << no_backward;
  // A forward run twice.
  std::string twice = broken([](auto& ps) {
    ps[2].insert(ps[2].end() - 2, Instruction{Op::Forward, 1});
  });
  EXPECT_NE(twice.find("stage 2 Forward(micro-batch 1) runs twice"), std::string::npos) << twice;
  // A backward before its forward.
  std::string early = broken([&](auto& ps) {
    swap_first(ps[2], {Op::Forward, 0}, {Op::Backward, 0});
  });
  EXPECT_NE(early.find("stage 2 Backward(micro-batch 0) comes before Forward(micro-batch 0)"),
            std::string::npos)
      << early;
  // Interleaved (P = 2, v = 2): chunk 1 of stage 0 receives micro-batch 1 before 0 from stage 1;
  // the error names the chunks.
  Schedule inter = make_schedule(ScheduleKind::Interleaved, 2, 2, 2);
  auto& l0 = inter.per_stage[0];
  std::iter_swap(std::find(l0.begin(), l0.end(), Instruction{Op::RecvActivation, 0, 1}),
                 std::find(l0.begin(), l0.end(), Instruction{Op::RecvActivation, 1, 1}));
  std::string chunked = error_of<ScheduleError>([&] { simulate(inter); });
  EXPECT_NE(chunked.find("stage 0 RecvActivation(micro-batch 1, chunk 1) meets stage 1's "
                         "SendActivation(micro-batch 0, chunk 0) first"),
            std::string::npos)
      << chunked;
  // An extra send nobody receives.
  std::string extra = broken([](auto& ps) {
    ps[0].insert(ps[0].end() - 2, Instruction{Op::SendActivation, 3});
  });
  EXPECT_NE(extra.find("stage 0's SendActivation(micro-batch 3) to stage 1 is never received"),
            std::string::npos)
      << extra;
}

// ---- when a send is known delivered ----------------------------------------------------

// delivered_sends against an execution of every stage's list: the stages run round-robin, each
// as far as its receives allow (a send posts its message, a receive takes one posted for it).
// When a receive completes, every send it vouches for must have been taken by its receiver
// already; every send is vouched for at most once. And the sends left to the step's end (no
// receive vouches for them) do not grow with m under 1F1B: at most P - s + 1 gradients on
// stage s (the previous stage's last activation went out before its last P - s + 1 gradients
// came in) and no activation (the next stage's gradient of the same micro-batch vouches).
TEST(PipelineSchedule, DeliveredSendsAreTakenBeforeTheReceiveThatVouchesForThem) {
  struct Msg {
    Op op;  // the send
    int mb, chunk, from;
    bool operator<(const Msg& o) const {
      return std::tie(op, mb, chunk, from) < std::tie(o.op, o.mb, o.chunk, o.from);
    }
  };
  auto check = [](ScheduleKind kind, int P, int m, int v) {
    SCOPED_TRACE(std::string(schedule_name(kind)) + " P=" + std::to_string(P) +
                 " m=" + std::to_string(m) + " v=" + std::to_string(v));
    const Schedule sch = make_schedule(kind, P, m, v);
    // A message: (virtual stage it goes to, activation?, micro-batch).
    using Key = std::tuple<int, bool, int>;
    auto key_of_send = [&](const Instruction& ins, int s) {
      const int vs = ins.chunk * P + s;
      return ins.op == Op::SendActivation ? Key{vs + 1, true, ins.micro_batch}
                                          : Key{vs - 1, false, ins.micro_batch};
    };
    auto key_of_recv = [&](const Instruction& ins, int s) {
      return Key{ins.chunk * P + s, ins.op == Op::RecvActivation, ins.micro_batch};
    };
    std::vector<std::vector<std::vector<Instruction>>> delivered(P);
    for (int s = 0; s < P; ++s) {
      delivered[s] = delivered_sends(sch, s);
      ASSERT_EQ(delivered[s].size(), sch.per_stage[s].size());
    }
    std::set<Key> posted, taken;
    std::vector<size_t> pc(P, 0);
    std::vector<std::set<Key>> vouched(P);
    bool progress = true;
    while (progress) {
      progress = false;
      for (int s = 0; s < P; ++s) {
        for (; pc[s] < sch.per_stage[s].size(); ++pc[s]) {
          const Instruction& ins = sch.per_stage[s][pc[s]];
          if (ins.op == Op::SendActivation || ins.op == Op::SendGrad) {
            posted.insert(key_of_send(ins, s));
          } else if (ins.op == Op::RecvActivation || ins.op == Op::RecvGrad) {
            const Key k = key_of_recv(ins, s);
            if (!posted.count(k)) break;
            taken.insert(k);
          }
          for (const Instruction& sent : delivered[s][pc[s]]) {
            ASSERT_TRUE(sent.op == Op::SendActivation || sent.op == Op::SendGrad);
            ASSERT_NE(std::find(sch.per_stage[s].begin(), sch.per_stage[s].begin() + pc[s], sent),
                      sch.per_stage[s].begin() + pc[s])
                << to_string(sent, true) << " vouched for before stage " << s << " sent it";
            const Key k = key_of_send(sent, s);
            EXPECT_TRUE(taken.count(k)) << "stage " << s << ": " << to_string(sent, true)
                                        << " not yet received when "
                                        << to_string(ins, true) << " vouched for it";
            EXPECT_TRUE(vouched[s].insert(k).second) << to_string(sent, true) << " twice";
          }
          progress = true;
        }
      }
    }
    for (int s = 0; s < P; ++s) ASSERT_EQ(pc[s], sch.per_stage[s].size()) << "stage " << s;
    if (kind != ScheduleKind::OneFOneB) return;
    for (int s = 0; s < P; ++s) {
      int left_grads = 0, left_acts = 0;
      for (const auto& ins : sch.per_stage[s]) {
        if (ins.op != Op::SendActivation && ins.op != Op::SendGrad) continue;
        if (vouched[s].count(key_of_send(ins, s))) continue;
        (ins.op == Op::SendGrad ? left_grads : left_acts)++;
      }
      EXPECT_EQ(left_acts, 0) << "stage " << s;
      EXPECT_LE(left_grads, std::min(P - s + 1, m)) << "stage " << s;
      if (s > 0) EXPECT_GE(left_grads, 1) << "stage " << s;  // the last gradient, at least
    }
  };
  for (int P : {2, 3, 4})
    for (int m : {1, 2, 4, 8, 64}) {
      check(ScheduleKind::GPipe, P, m, 1);
      check(ScheduleKind::OneFOneB, P, m, 1);
      if (m % P == 0) check(ScheduleKind::Interleaved, P, m, 2);
    }
}

// In 1F1B the next stage's gradient of micro-batch j arrives after it received activation
// j + P - s - 2: that receive vouches for those activations (worked out by hand for P = 4,
// stage 1: warm-up forwards 0 and 1, then F(2) B(0): RecvGrad(0) vouches for activations 0 and
// 1, RecvGrad(1) for activation 2, ...). And stage 1's gradient of micro-batch j is vouched for
// by the activation stage 0 sends after receiving it: activation j + 4.
TEST(PipelineSchedule, DeliveredSendsOfOneFOneBByHand) {
  const Schedule sch = make_schedule(ScheduleKind::OneFOneB, 4, 8);
  const auto d = delivered_sends(sch, 1);
  const auto& list = sch.per_stage[1];
  std::map<std::string, std::vector<std::string>> got;
  for (size_t i = 0; i < list.size(); ++i)
    for (const auto& sent : d[i]) got[to_string(list[i])].push_back(to_string(sent));
  auto act = [](int mb) { return to_string(Instruction{Op::SendActivation, mb}); };
  auto grad = [](int mb) { return to_string(Instruction{Op::SendGrad, mb}); };
  auto recv_grad = [](int mb) { return to_string(Instruction{Op::RecvGrad, mb}); };
  auto recv_act = [](int mb) { return to_string(Instruction{Op::RecvActivation, mb}); };
  EXPECT_EQ(got[recv_grad(0)], (std::vector<std::string>{act(0), act(1)}));
  for (int j = 1; j < 6; ++j) EXPECT_EQ(got[recv_grad(j)], std::vector<std::string>{act(j + 1)});
  for (int j = 0; j + 4 < 8; ++j)
    EXPECT_EQ(got[recv_act(j + 4)], std::vector<std::string>{grad(j)});
}

}  // namespace
}  // namespace zero::pipeline
