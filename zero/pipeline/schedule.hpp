// A pipeline schedule as data: for each of P stages, the ordered list of instructions it runs in
// one training step (DeepSpeed's PipeSchedule, Megatron-LM's forward_backward_* functions, here
// as plain lists). The engine executes a list; tests and the planner read it without a model.
//
// Stage s holds layers s of P (one chunk) or, interleaved, the v chunks s, s+P, ..., s+(v-1)P of
// the model cut into v·P virtual stages (Megatron's virtual pipeline, model chunk = chunk here).
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace zero::pipeline {

enum class Op {
  Forward,   // run micro-batch mb through chunk c (virtual stage 0 loads the batch itself)
  Backward,  // back-propagate micro-batch mb through chunk c (the last one starts at the loss)
  SendActivation,  // chunk c's output of micro-batch mb to the next virtual stage
  RecvActivation,  // chunk c's input of micro-batch mb from the previous virtual stage
  SendGrad,       // the gradient of chunk c's input of micro-batch mb to the previous virtual stage
  RecvGrad,       // the gradient of chunk c's output of micro-batch mb from the next virtual stage
  ReduceGrads,    // the data-parallel gradient reduction of this stage, once per step
  OptimizerStep,  // once per step, after ReduceGrads
};

struct Instruction {
  Op op;
  int micro_batch = -1;  // -1 for ReduceGrads and OptimizerStep
  int chunk = 0;         // the model chunk on this stage: 0 unless interleaved
  bool operator==(const Instruction&) const = default;
};

enum class ScheduleKind {
  GPipe,        // all forwards, then all backwards: every micro-batch's activations held at once
  OneFOneB,     // PipeDream-Flush: P-s-1 warm-up forwards, then one forward one backward
  Interleaved,  // Megatron's interleaved 1F1B over v chunks per stage: bubble / v
};

// The names `pipeline.schedule` will take: "gpipe", "1f1b", "interleaved".
std::string_view schedule_name(ScheduleKind kind);
ScheduleKind parse_schedule_kind(std::string_view name);  // invalid_argument names the choices

struct Schedule {
  ScheduleKind kind = ScheduleKind::OneFOneB;
  int stages = 1;                                   // P
  int micro_batches = 1;                            // m: gradient_accumulation_steps
  int virtual_stages = 1;                           // v: chunks per stage (1 unless interleaved)
  std::vector<std::vector<Instruction>> per_stage;  // per_stage[s]: stage s's list, in order
};

// One stage's list. Each throws std::invalid_argument naming the numbers for P < 1, m < 1,
// s outside [0, P), v < 1, and (interleaved with v > 1) m not a multiple of P.
std::vector<Instruction> gpipe_schedule(int stages, int micro_batches, int stage);
std::vector<Instruction> one_f_one_b_schedule(int stages, int micro_batches, int stage);
std::vector<Instruction> interleaved_schedule(int stages, int micro_batches, int stage,
                                              int virtual_stages);

// Every stage's list. virtual_stages must be 1 for GPipe and 1F1B.
Schedule make_schedule(ScheduleKind kind, int stages, int micro_batches, int virtual_stages = 1);

// When each send of `stage`'s list is known to have arrived: delivered[i] lists the sends
// (SendActivation, SendGrad) of that list whose message the neighbour had received before it
// sent what instruction i (a receive) gets, each send once, at the first such receive. Once the
// receive completed, waiting on those sends returns at once and waits on nothing the schedule
// has not done yet: the runtime frees a send's buffer there instead of at the step's end (in
// 1F1B the next stage's gradient for micro-batch j arrives after it received activation
// j + P - s - 2). Sends no later message vouches for (1F1B's cool-down gradients, GPipe's
// gradients) are left to the step's end.
std::vector<std::vector<Instruction>> delivered_sends(const Schedule& schedule, int stage);

std::string_view op_name(Op op);
// "Forward(micro-batch 3)", with ", chunk 1" when show_chunk.
std::string to_string(const Instruction& ins, bool show_chunk = false);

}  // namespace zero::pipeline
