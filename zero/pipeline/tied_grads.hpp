// When a stage holding a copy of a tied weight (DeepSpeed's TiedLayerSpec: the embedding and the
// head) sends the copy's gradient to the weight's owner, derived from the schedule rather than
// assumed of it.
//
// The owner receives the gradient at the start of its last Backward (it joins that backward as
// the weight's own root). Each ordered pair of stages is one link that delivers in the order of
// sending (NCCL's point-to-point; simulate.hpp), so the sender must put the gradient on its link
// to the owner right after the messages the owner takes from it before that point, and not
// before its own last Backward (only then is the copy's gradient complete).
#pragma once

#include "zero/pipeline/schedule.hpp"

namespace zero::pipeline {

// The index in `sender`'s list after which it posts the tied gradient for `owner`. Throws
// std::logic_error naming the stages and instructions when no position works: the owner takes
// more messages from the sender before its last Backward than the sender sends; the sender sends
// the owner a message the owner takes after the gradient before its own last Backward; or the
// sender waits in a receive between its last Backward and the position (the owner, waiting for
// the gradient, might be the one it waits for).
int tied_grad_send_after(const Schedule& schedule, int sender, int owner);

// The stage on the other side of a send or receive of `stage` (the ring of virtual stages:
// chunk c's last stage sends to stage 0's chunk c + 1); -1 for ReduceGrads and OptimizerStep.
int peer_of(const Instruction& ins, int stage, int stages);

}  // namespace zero::pipeline
