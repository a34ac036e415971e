// Where a stage posts each receive of its instruction list: as early as the schedule allows,
// before the compute of the step before the one that needs it, as Megatron-LM's interleaved
// schedule does with overlap_p2p_comm (the receive for the next forward posted before this
// forward, waited on after it). The message then travels while this stage computes, and the
// receive's instruction only waits for what is still missing.
//
// A receive at index r is posted before instruction e <= r, the earliest index such that the
// instructions e .. r - 1 it is moved over are
//  - communication on other channels (a channel: the group and direction a message takes,
//    runtime.hpp), posted in the same order as before;
//  - and at most one Forward or Backward that is not fenced.
// It is never moved over a message on its own channel (each channel keeps the schedule's order
// of its operations, which NCCL's in-order point-to-point execution needs to stay free of
// deadlocks, runtime.hpp), over ReduceGrads / OptimizerStep, or over a fenced instruction (one
// around which the runtime sends or receives outside the schedule: the tied weights' gradients).
// One compute step of look-ahead holds at most one more receive buffer per channel.
#pragma once

#include <functional>
#include <vector>

#include "zero/pipeline/schedule.hpp"

namespace zero::pipeline {

// For each instruction index i of `list`, the indices of the receives to post right before
// instruction i runs, in list order (a receive posted at its own index is listed there too).
// channel(ins): an id for a Send / Recv instruction's channel. fenced[i]: instruction i may not
// be moved over (empty: none).
std::vector<std::vector<int>> early_receives(const std::vector<Instruction>& list,
                                             const std::function<int(const Instruction&)>& channel,
                                             const std::vector<bool>& fenced = {});

}  // namespace zero::pipeline
