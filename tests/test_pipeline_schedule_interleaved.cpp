// The interleaved 1F1B schedule as data (zero/pipeline/schedule.hpp; Narayanan et al. 2021,
// Megatron-LM §2.2.2): each stage's lists for v model chunks, against closed forms from the papers
// and Megatron-LM's own construction of the order, not the code under test:
//   bubble: the idle time shrinks by v, to (P-1)·(t_f+t_b)/v, a fraction (P-1)/(v·m+P-1) of the
//     step, (P-1)/(v·m) over the ideal m·(t_f+t_b);
//   activations held on the first stage: P·(1 + (P-1)/(P·v)) micro-batches' worth (Korthikanti
//     et al. 2022, §4.2.3 / appendix);
//   every ordered pair of stages agrees on the order of what travels between them;
//   the compute order is Megatron's schedule table (get_schedule_table and the warm-up count of
//     forward_backward_pipelining_with_interleaving).
// test_pipeline_schedule.cpp has GPipe and 1F1B, the simulator and the refusals.
#include <gtest/gtest.h>

#include <map>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "support/interleaved_by_hand.hpp"
#include "support/schedule_lists.hpp"
#include "zero/pipeline/figures.hpp"
#include "zero/pipeline/schedule.hpp"
#include "zero/pipeline/simulate.hpp"

namespace zero::pipeline {
namespace {

using testing::label;
using testing::micro_batches_of;
using testing::position;

// Interleaved: m a multiple of P, v = 2..4 chunks per stage. Every (micro-batch, chunk) once per
// stage, the step runs, the bubble is (P-1)/(v·m+P-1), and the first stage holds
// P·(1 + (P-1)/(P·v)) micro-batches' worth of activations once v·m is large enough to fill it.
TEST(PipelineSchedule, InterleavedMeetsMegatronsFormulas) {
  for (int p = 1; p <= 8; ++p)
    for (int v = 2; v <= 4; ++v)
      for (int m = p; m <= 16; m += p) {
        SCOPED_TRACE(label(ScheduleKind::Interleaved, p, m, v));
        Schedule sched = make_schedule(ScheduleKind::Interleaved, p, m, v);
        for (int s = 0; s < p; ++s)
          for (int c = 0; c < v; ++c) {
            auto fwd = micro_batches_of(sched.per_stage[s], Op::Forward, c);
            auto bwd = micro_batches_of(sched.per_stage[s], Op::Backward, c);
            std::sort(fwd.begin(), fwd.end());
            std::sort(bwd.begin(), bwd.end());
            ASSERT_EQ(fwd.size(), size_t(m));
            ASSERT_EQ(bwd.size(), size_t(m));
            for (int k = 0; k < m; ++k) EXPECT_EQ(fwd[k], k);
            for (int k = 0; k < m; ++k) EXPECT_EQ(bwd[k], k);
          }
        PipelineFigures f = pipeline_figures(ScheduleKind::Interleaved, p, m, v);
        EXPECT_NEAR(f.bubble_fraction, double(p - 1) / (v * m + p - 1), 1e-12);
        double korthikanti = p * (1.0 + double(p - 1) / (p * v));
        if (v * m >= korthikanti * v)
          EXPECT_NEAR(f.peak_activation_micro_batches[0], korthikanti, 1e-12);
        // Never more than everything, never less than 1F1B's P (or m) on the first stage.
        EXPECT_LE(f.peak_in_flight[0], v * m);
        EXPECT_GE(f.peak_activation_micro_batches[0], std::min(p, m));
      }
}

// Interleaving beats 1F1B's bubble by v at the same P and m.
TEST(PipelineSchedule, InterleavedBubbleIsSmaller) {
  PipelineFigures flat = pipeline_figures(ScheduleKind::OneFOneB, 4, 8);
  PipelineFigures inter = pipeline_figures(ScheduleKind::Interleaved, 4, 8, 2);
  EXPECT_NEAR(flat.bubble_fraction, 3.0 / 11, 1e-12);
  EXPECT_NEAR(inter.bubble_fraction, 3.0 / 19, 1e-12);
  // v = 1 is plain 1F1B.
  EXPECT_EQ(make_schedule(ScheduleKind::Interleaved, 4, 6, 1).per_stage,
            make_schedule(ScheduleKind::OneFOneB, 4, 6).per_stage);
}

// The interleaved lists read alone, not simulated: on every stage and chunk each micro-batch's
// forward comes before its backward, the receive right before and the send right after them,
// and every ordered pair of stages agrees on the order of what travels between them (a link
// delivers in order: activations s -> s+1 and, from the last stage, to chunk c+1 of stage 0;
// gradients the other way). The receiver's chunk is the sender's, or the next (previous) one
// across the wrap from the last stage to the first.
TEST(PipelineSchedule, InterleavedListsPairUpBetweenNeighbours) {
  struct Msg {
    bool grad;
    int mb, to_chunk;
    bool operator==(const Msg&) const = default;
  };
  for (int p = 2; p <= 6; ++p)
    for (int v = 2; v <= 4; ++v)
      for (int m = p; m <= 3 * p; m += p) {
        SCOPED_TRACE(label(ScheduleKind::Interleaved, p, m, v));
        Schedule sched = make_schedule(ScheduleKind::Interleaved, p, m, v);
        std::map<std::pair<int, int>, std::vector<Msg>> sent, received;  // (from, to)
        for (int s = 0; s < p; ++s) {
          const auto& list = sched.per_stage[s];
          for (int c = 0; c < v; ++c)
            for (int k = 0; k < m; ++k) {
              int vs = c * p + s;
              int f = position(list, {Op::Forward, k, c});
              int b = position(list, {Op::Backward, k, c});
              ASSERT_GE(f, 0);
              EXPECT_LT(f, b) << "chunk " << c << " micro-batch " << k;
              if (vs > 0) EXPECT_EQ(position(list, {Op::RecvActivation, k, c}), f - 1);
              if (vs < p * v - 1) EXPECT_EQ(position(list, {Op::SendActivation, k, c}), f + 1);
              if (vs < p * v - 1) EXPECT_EQ(position(list, {Op::RecvGrad, k, c}), b - 1);
              if (vs > 0) EXPECT_EQ(position(list, {Op::SendGrad, k, c}), b + 1);
            }
          for (const auto& ins : list) {
            int next = (s + 1) % p, prev = (s + p - 1) % p;
            switch (ins.op) {
              case Op::SendActivation:
                sent[{s, next}].push_back({false, ins.micro_batch, ins.chunk + (next == 0)});
                break;
              case Op::SendGrad:
                sent[{s, prev}].push_back({true, ins.micro_batch, ins.chunk - (s == 0)});
                break;
              case Op::RecvActivation:
                received[{prev, s}].push_back({false, ins.micro_batch, ins.chunk});
                break;
              case Op::RecvGrad:
                received[{next, s}].push_back({true, ins.micro_batch, ins.chunk});
                break;
              default:
                break;
            }
          }
        }
        EXPECT_EQ(sent.size(), received.size());
        for (const auto& [link, msgs] : sent) {
          EXPECT_TRUE(msgs == received[link]) << "link " << link.first << " -> " << link.second;
          // Each neighbour link carries every micro-batch of every chunk boundary it spans.
          EXPECT_FALSE(msgs.empty());
        }
        EXPECT_NO_THROW(simulate(sched));
      }
}

// Megatron-LM's own construction of the interleaved order (megatron/core/pipeline_parallel/
// schedules.py: get_schedule_table, convert_schedule_table_to_order, and the warm-up count of
// forward_backward_pipelining_with_interleaving), written out here as Megatron writes it: the
// micro-batches in groups of P (microbatch_group_size_per_vp_stage's default), each group run
// through chunk 0, then chunk 1, ...; the k-th forward is table[k] and the k-th backward the
// same micro-batch in chunk v-1-c; (P-s-1)·2 + (v-1)·P warm-up forwards, capped at m·v (the
// current code; an older release ran all forwards first when m == P), then one forward one
// backward, then the remaining backwards. The compute instructions of each stage's list must
// follow this order exactly.
TEST(PipelineSchedule, InterleavedFollowsMegatronsScheduleTable) {
  for (int p = 1; p <= 6; ++p)
    for (int v = 2; v <= 4; ++v)
      for (int m = p; m <= 4 * p; m += p) {
        SCOPED_TRACE(label(ScheduleKind::Interleaved, p, m, v));
        std::vector<std::pair<int, int>> table;  // (micro-batch, chunk)
        for (int first = 0; first < m; first += p)
          for (int c = 0; c < v; ++c)
            for (int k = first; k < std::min(first + p, m); ++k) table.push_back({k, c});
        Schedule sched = make_schedule(ScheduleKind::Interleaved, p, m, v);
        for (int s = 0; s < p; ++s) {
          int total = m * v;
          int warmup = std::min((p - s - 1) * 2 + (v - 1) * p, total);
          std::vector<Instruction> want;
          auto fwd = [&](int k) { want.push_back({Op::Forward, table[k].first, table[k].second}); };
          auto bwd = [&](int k) {
            want.push_back({Op::Backward, table[k].first, v - 1 - table[k].second});
          };
          for (int k = 0; k < warmup; ++k) fwd(k);
          for (int k = warmup; k < total; ++k) fwd(k), bwd(k - warmup);
          for (int k = total - warmup; k < total; ++k) bwd(k);
          std::vector<Instruction> got;
          for (const auto& ins : sched.per_stage[s])
            if (ins.op == Op::Forward || ins.op == Op::Backward) got.push_back(ins);
          EXPECT_EQ(got, want) << "stage " << s;
        }
      }
}

// Megatron's statement of the interleaved bubble (Narayanan et al. 2021 §2.2.2): with v chunks
// per stage, each chunk's forward and backward take 1/v of the stage's, and the bubble is
// (P-1)/(v·m) of the ideal step m·(t_f + t_b): the simulated step minus the ideal, over it.
TEST(PipelineSchedule, InterleavedBubbleOverTheIdealIsPMinusOneOverVM) {
  for (int p = 1; p <= 8; ++p)
    for (int v = 1; v <= 4; ++v)
      for (int m = p; m <= 16; m += p) {
        SCOPED_TRACE(label(ScheduleKind::Interleaved, p, m, v));
        OpTimes t;
        t.forward = 1.0 / v;
        t.backward = 2.0 / v;
        SimulationResult r = simulate(make_schedule(ScheduleKind::Interleaved, p, m, v), t);
        double ideal = m * 3.0;
        EXPECT_NEAR((r.makespan - ideal) / ideal, double(p - 1) / (v * m), 1e-9);
      }
}

// Chunk times (OpTimes::chunk_forward / chunk_backward) equal to what forward, backward and
// stage_scale give each chunk run the same schedule exactly: every instruction's start and end,
// the makespan, the bubble and the peaks, bit for bit, for all three schedules.
TEST(PipelineSchedule, EqualChunkTimesGiveTheStageTimesResults) {
  struct Case {
    ScheduleKind kind;
    int p, m, v;
  };
  for (const Case& k :
       {Case{ScheduleKind::GPipe, 3, 4, 1}, Case{ScheduleKind::OneFOneB, 4, 8, 1},
        Case{ScheduleKind::Interleaved, 2, 4, 2}, Case{ScheduleKind::Interleaved, 4, 8, 2},
        Case{ScheduleKind::Interleaved, 4, 8, 3}}) {
    SCOPED_TRACE(label(k.kind, k.p, k.m, k.v));
    const Schedule sched = make_schedule(k.kind, k.p, k.m, k.v);
    OpTimes stage;
    stage.forward = 0.7 / k.v;
    stage.backward = 1.9 / k.v;
    stage.send_latency = 0.05;
    stage.reduce_grads = 0.3;
    stage.optimizer_step = 0.2;
    for (int s = 0; s < k.p; ++s) stage.stage_scale.push_back(1.0 + 0.25 * s);
    OpTimes chunk = stage;
    chunk.stage_scale.clear();
    for (int vs = 0; vs < k.p * k.v; ++vs) {
      chunk.chunk_forward.push_back(stage.forward * stage.stage_scale[vs % k.p]);
      chunk.chunk_backward.push_back(stage.backward * stage.stage_scale[vs % k.p]);
    }
    const SimulationResult a = simulate(sched, stage), b = simulate(sched, chunk);
    EXPECT_EQ(a.makespan, b.makespan);
    EXPECT_EQ(a.bubble_fraction, b.bubble_fraction);
    ASSERT_EQ(a.stages.size(), b.stages.size());
    for (size_t s = 0; s < a.stages.size(); ++s) {
      EXPECT_EQ(a.stages[s].busy, b.stages[s].busy);
      EXPECT_EQ(a.stages[s].peak_in_flight, b.stages[s].peak_in_flight);
      ASSERT_EQ(a.stages[s].timeline.size(), b.stages[s].timeline.size());
      for (size_t i = 0; i < a.stages[s].timeline.size(); ++i) {
        EXPECT_EQ(a.stages[s].timeline[i].start, b.stages[s].timeline[i].start);
        EXPECT_EQ(a.stages[s].timeline[i].end, b.stages[s].timeline[i].end);
      }
    }
  }
}

// P = 2, v = 2, m = 2 with every chunk its own time. Virtual stages 0..3 (stage 0 holds 0 and 2,
// stage 1 holds 1 and 3) forward in 1, 2, 3, 4 and backward in 2, 5, 6, 7. Megatron's order
// (support/interleaved_by_hand.hpp) worked by hand, F(mb, vs) and B(mb, vs) with [start, end]:
//   stage 0: F(0,0) [0,1], F(1,0) [1,2], F(0,2) [3,6] (waits for F(0,1)), F(1,2) [6,9],
//            B(0,2) [17,23] (waits for B(0,3)), B(1,2) [28,34], B(0,0) [34,36], B(1,0) [39,41]
//   stage 1: F(0,1) [1,3], F(1,1) [3,5], F(0,3) [6,10], B(0,3) [10,17], F(1,3) [17,21],
//            B(1,3) [21,28], B(0,1) [28,33], B(1,1) [34,39] (waits for B(1,2))
// The step takes 41; the stages are busy 24 and 36.
TEST(PipelineSchedule, InterleavedChunkTimesMeetAHandWorkedStep) {
  OpTimes t;
  t.chunk_forward = {1, 2, 3, 4};
  t.chunk_backward = {2, 5, 6, 7};
  const SimulationResult r = simulate(make_schedule(ScheduleKind::Interleaved, 2, 2, 2), t);
  EXPECT_DOUBLE_EQ(r.makespan, 41);
  EXPECT_DOUBLE_EQ(r.stages[0].busy, 24);
  EXPECT_DOUBLE_EQ(r.stages[1].busy, 36);
  EXPECT_DOUBLE_EQ(r.bubble_fraction, 1 - 60.0 / (2 * 41));
  // The dependency walk over the hand-written order agrees (the reference the planner's test
  // uses), here and for m = 4 with other unequal times.
  const auto hand =
      testing::hand_timing(testing::interleaved_p2v2_by_hand(2), t.chunk_forward, t.chunk_backward);
  EXPECT_DOUBLE_EQ(hand.makespan, 41);
  std::mt19937 gen(34);
  std::uniform_real_distribution<double> u(0.5, 4.0);
  for (int m : {2, 4}) {
    for (int trial = 0; trial < 5; ++trial) {
      OpTimes x;
      for (int vs = 0; vs < 4; ++vs) {
        x.chunk_forward.push_back(u(gen));
        x.chunk_backward.push_back(u(gen));
      }
      const SimulationResult got = simulate(make_schedule(ScheduleKind::Interleaved, 2, m, 2), x);
      const auto want = testing::hand_timing(testing::interleaved_p2v2_by_hand(m), x.chunk_forward,
                                             x.chunk_backward);
      EXPECT_DOUBLE_EQ(got.makespan, want.makespan) << "m " << m << " trial " << trial;
      EXPECT_DOUBLE_EQ(got.stages[0].busy, want.busy[0]);
      EXPECT_DOUBLE_EQ(got.stages[1].busy, want.busy[1]);
    }
  }
}

TEST(PipelineSchedule, ChunkTimesAreChecked) {
  const Schedule sched = make_schedule(ScheduleKind::Interleaved, 2, 2, 2);
  OpTimes t;
  t.chunk_forward = {1, 1, 1};
  t.chunk_backward = {2, 2, 2};
  EXPECT_THROW(simulate(sched, t), std::invalid_argument) << "3 times for 4 chunks";
  t.chunk_forward = {1, 1, 1, 1};
  t.chunk_backward = {2, 2, 2, -1};
  EXPECT_THROW(simulate(sched, t), std::invalid_argument) << "a negative time";
  t.chunk_backward = {2, 2, 2, 2};
  t.stage_scale = {1, 2};
  EXPECT_THROW(simulate(sched, t), std::invalid_argument) << "chunk times and stage scales";
  t.stage_scale.clear();
  EXPECT_NO_THROW(simulate(sched, t));
}

}  // namespace
}  // namespace zero::pipeline
