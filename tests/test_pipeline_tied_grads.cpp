// Where a tied weight's copy sends its gradient to the owner (zero/pipeline/tied_grads.hpp), read
// against the link model the runtime depends on, worked out here from the lists alone: each
// ordered pair of stages is one link delivering in the order of sending, and the owner takes
// the gradient right before its last Backward. So the sender's messages to the owner, with the
// gradient put where tied_grad_send_after says, must be exactly the owner's receives from the
// sender, with the gradient before its last Backward; the gradient must leave after the sender's
// last Backward, and no receive may stand between the two (the owner waits for it).
//
// The runtime used to assume the instruction right after the last Backward is a SendGrad and
// sent nothing otherwise (the owner then waited out comm_timeout): the reordered schedules below
// break that assumption and must still get a place that matches.
#include <gtest/gtest.h>

#include <algorithm>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include "zero/pipeline/schedule.hpp"
#include "zero/pipeline/simulate.hpp"
#include "zero/pipeline/tied_grads.hpp"

namespace zero::pipeline {
namespace {

// A message on one link: the tied gradient, or an activation / gradient of (micro-batch, the
// sender's chunk).
using Message = std::tuple<bool /*tied*/, bool /*gradient*/, int /*mb*/, int /*chunk*/>;
const Message kTied{true, false, -1, -1};

int last_backward(const std::vector<Instruction>& list) {
  int at = -1;
  for (size_t i = 0; i < list.size(); ++i)
    if (list[i].op == Op::Backward) at = static_cast<int>(i);
  return at;
}

// Virtual stage vs = chunk * P + stage; its neighbours vs +- 1 live on stage (vs +- 1) % P.
struct Ends {
  int stage, chunk;
};
Ends virtual_stage(int vs, int P) { return {vs % P, vs / P}; }

std::vector<Message> sent(const Schedule& s, int sender, int owner, int after) {
  std::vector<Message> out;
  const auto& list = s.per_stage[sender];
  const int P = s.stages;
  for (int i = 0; i < static_cast<int>(list.size()); ++i) {
    const Instruction& ins = list[i];
    const int vs = ins.chunk * P + sender;
    if (ins.op == Op::SendActivation && virtual_stage(vs + 1, P).stage == owner)
      out.emplace_back(false, false, ins.micro_batch, ins.chunk);
    if (ins.op == Op::SendGrad && virtual_stage(vs - 1, P).stage == owner)
      out.emplace_back(false, true, ins.micro_batch, ins.chunk);
    if (i == after) out.push_back(kTied);
  }
  return out;
}

std::vector<Message> taken(const Schedule& s, int owner, int sender) {
  std::vector<Message> out;
  const auto& list = s.per_stage[owner];
  const int P = s.stages, last = last_backward(list);
  for (int i = 0; i < static_cast<int>(list.size()); ++i) {
    const Instruction& ins = list[i];
    if (i == last) out.push_back(kTied);
    const int vs = ins.chunk * P + owner;
    if (ins.op == Op::RecvActivation && virtual_stage(vs - 1, P).stage == sender)
      out.emplace_back(false, false, ins.micro_batch, virtual_stage(vs - 1, P).chunk);
    if (ins.op == Op::RecvGrad && virtual_stage(vs + 1, P).stage == sender)
      out.emplace_back(false, true, ins.micro_batch, virtual_stage(vs + 1, P).chunk);
  }
  return out;
}

void expect_place_matches(const Schedule& s, int sender, int owner, const std::string& what) {
  int after = -1;
  ASSERT_NO_THROW(after = tied_grad_send_after(s, sender, owner)) << what;
  const auto& list = s.per_stage[sender];
  const int last = last_backward(list);
  EXPECT_GE(after, last) << what << ": the gradient leaves before it is complete";
  ASSERT_LT(after, static_cast<int>(list.size())) << what;
  for (int i = last + 1; i <= after; ++i)
    EXPECT_TRUE(list[i].op != Op::RecvActivation && list[i].op != Op::RecvGrad)
        << what << ": a receive at " << i << " before the gradient leaves";
  EXPECT_EQ(sent(s, sender, owner, after), taken(s, owner, sender)) << what;
}

// Every pair of stages of every schedule the runtime runs: the embedding's owner is the first
// holder (the lower stage), but the place is worked out for either direction.
TEST(PipelineTiedGrads, EveryScheduleGivesAPlaceTheOwnerTakesItFrom) {
  for (int P = 2; P <= 4; ++P) {
    for (int m = 1; m <= 8; ++m) {
      for (ScheduleKind kind : {ScheduleKind::GPipe, ScheduleKind::OneFOneB}) {
        const Schedule s = make_schedule(kind, P, m);
        for (int a = 0; a < P; ++a)
          for (int b = 0; b < P; ++b)
            if (a != b)
              expect_place_matches(s, a, b,
                                   std::string(schedule_name(kind)) + " P=" + std::to_string(P) +
                                       " m=" + std::to_string(m) + " " + std::to_string(a) +
                                       "->" + std::to_string(b));
      }
      for (int v = 2; v <= 3 && m % P == 0; ++v) {
        const Schedule s = make_schedule(ScheduleKind::Interleaved, P, m, v);
        for (int a = 0; a < P; ++a)
          for (int b = 0; b < P; ++b)
            if (a != b)
              expect_place_matches(s, a, b,
                                   "interleaved P=" + std::to_string(P) + " m=" +
                                       std::to_string(m) + " v=" + std::to_string(v) + " " +
                                       std::to_string(a) + "->" + std::to_string(b));
      }
    }
  }
}

// Schedules that run (the simulator accepts them) in which the instruction after a copy
// holder's last Backward is not its SendGrad: what a reordering such as Megatron's batched
// send/recv pairs would produce.
TEST(PipelineTiedGrads, AReorderedScheduleStillGetsAPlace) {
  auto move_before = [](std::vector<Instruction>& l, Instruction what, Instruction where) {
    l.erase(std::find(l.begin(), l.end(), what));
    l.insert(std::find(l.begin(), l.end(), where), what);
  };
  // 1F1B, P = 2: the last stage's ReduceGrads between its last Backward and that SendGrad.
  {
    Schedule s = make_schedule(ScheduleKind::OneFOneB, 2, 4);
    move_before(s.per_stage[1], {Op::ReduceGrads}, {Op::SendGrad, 3});
    ASSERT_NO_THROW(simulate(s));
    const int last = last_backward(s.per_stage[1]);
    ASSERT_NE(s.per_stage[1][last + 1].op, Op::SendGrad);
    expect_place_matches(s, 1, 0, "1F1B P=2, ReduceGrads first");
    EXPECT_EQ(s.per_stage[1][tied_grad_send_after(s, 1, 0)], (Instruction{Op::SendGrad, 3}));
  }
  // Interleaved, P = 2, v = 2: stage 1's last SendGrad (chunk 0, to the owner) after ReduceGrads.
  {
    Schedule s = make_schedule(ScheduleKind::Interleaved, 2, 4, 2);
    move_before(s.per_stage[1], {Op::ReduceGrads}, {Op::SendGrad, 3, 0});
    ASSERT_NO_THROW(simulate(s));
    const int last = last_backward(s.per_stage[1]);
    ASSERT_NE(s.per_stage[1][last + 1].op, Op::SendGrad);
    expect_place_matches(s, 1, 0, "interleaved P=2 v=2, ReduceGrads first");
  }
  // 1F1B, P = 3, the copy on stage 2 and the owner on stage 0 (no link between them but the
  // gradient's): the place is the last Backward itself.
  {
    Schedule s = make_schedule(ScheduleKind::OneFOneB, 3, 6);
    move_before(s.per_stage[2], {Op::ReduceGrads}, {Op::SendGrad, 5});
    ASSERT_NO_THROW(simulate(s));
    expect_place_matches(s, 2, 0, "1F1B P=3, ReduceGrads first");
    EXPECT_EQ(tied_grad_send_after(s, 2, 0), last_backward(s.per_stage[2]));
  }
}

// Lists where no place works are refused, naming the stages and instructions.
TEST(PipelineTiedGrads, NoPlaceIsRefusedClearly) {
  auto message = [](const Schedule& s, int sender, int owner) {
    try {
      tied_grad_send_after(s, sender, owner);
    } catch (const std::logic_error& e) {
      return std::string(e.what());
    }
    return std::string("(no error)");
  };
  const Schedule good = make_schedule(ScheduleKind::OneFOneB, 2, 2);
  // The owner takes the second gradient only after its last Backward, but the sender sends it
  // before its own: the tied gradient would have to overtake it.
  {
    Schedule s = good;
    s.per_stage[0] = {{Op::Forward, 0},  {Op::SendActivation, 0}, {Op::Forward, 1},
                      {Op::SendActivation, 1}, {Op::RecvGrad, 0},   {Op::Backward, 0},
                      {Op::Backward, 1}, {Op::RecvGrad, 1},       {Op::ReduceGrads},
                      {Op::OptimizerStep}};
    s.per_stage[1] = {{Op::RecvActivation, 0}, {Op::Forward, 0},  {Op::RecvActivation, 1},
                      {Op::Forward, 1},        {Op::Backward, 0}, {Op::SendGrad, 0},
                      {Op::SendGrad, 1},       {Op::Backward, 1}, {Op::ReduceGrads},
                      {Op::OptimizerStep}};
    const std::string e = message(s, 1, 0);
    EXPECT_NE(e.find("to its owner, stage 0"), std::string::npos) << e;
    EXPECT_NE(e.find("stage 1's SendGrad(micro-batch 1) (instruction 6)"), std::string::npos) << e;
    EXPECT_NE(e.find("stage 0's Backward(micro-batch 1) (instruction 6)"), std::string::npos) << e;
  }
  // The sender waits in a receive after its last Backward, before the place.
  {
    Schedule s = good;
    s.per_stage[1] = {{Op::RecvActivation, 0}, {Op::Forward, 0}, {Op::Backward, 0},
                      {Op::Forward, 1},        {Op::Backward, 1}, {Op::RecvActivation, 1},
                      {Op::SendGrad, 0},       {Op::SendGrad, 1}, {Op::ReduceGrads},
                      {Op::OptimizerStep}};
    const std::string e = message(s, 1, 0);
    EXPECT_NE(e.find("waits behind stage 1's RecvActivation(micro-batch 1) (instruction 5)"),
              std::string::npos)
        << e;
  }
  EXPECT_THROW(tied_grad_send_after(good, 1, 1), std::invalid_argument);
}

}  // namespace
}  // namespace zero::pipeline
