// Runs every stage's instruction list of a Schedule together, on a clock: what the pipeline
// engine would do with ideal compute and links. It proves a schedule executable (every receive
// meets its send, in order, and nothing waits forever) and measures the step's makespan, each
// stage's idle (bubble) fraction and the activations each stage holds at its peak.
//
// The model: a stage runs its list in order, one instruction at a time. Forward and Backward
// take their durations; a send posts the message and goes on (an isend: it costs the sender
// nothing and arrives send_latency later); a receive waits for its message. Each ordered pair
// of stages is one link that delivers in the order of sending, activations and gradients alike,
// as NCCL's point-to-point matches messages (gloo could tell them apart by tag; NCCL cannot), so
// a receive must take the oldest message on its link, whatever it carries. Every schedule here
// passes that test, interleaved ones included (P = 2 sends both kinds both ways).
#pragma once

#include <stdexcept>
#include <vector>

#include "zero/pipeline/schedule.hpp"

namespace zero::pipeline {

// Seconds (or any unit) per instruction, for one chunk: with v chunks per stage, a chunk's
// forward is the stage's forward time / v.
struct OpTimes {
  double forward = 1.0;
  double backward = 2.0;  // the usual 2× forward: two matrix products per one of the forward
  double send_latency = 0.0;
  double reduce_grads = 0.0;
  double optimizer_step = 0.0;
  // Stage s's Forward and Backward take stage_scale[s] times the above: unequal stages (a
  // partition by parameter count that cannot split a layer). Empty: all 1.
  std::vector<double> stage_scale;
  // Per virtual stage, P·v entries each (chunk c of stage s is virtual stage c·P + s): that
  // chunk's Forward and Backward, in place of forward / backward (and stage_scale, which must
  // then be empty). Chunks of unequal cost: the interleaved schedule over a partition by compute
  // or parameters, whose P·v chunks differ within a stage as well as between stages. Empty:
  // forward / backward × stage_scale, as before.
  std::vector<double> chunk_forward, chunk_backward;
};

// A schedule that cannot run: a receive that meets another message, a wait that never ends, an
// instruction before what it needs, a micro-batch left out or run twice.
class ScheduleError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct TimedInstruction {
  Instruction ins;
  double start = 0;
  double end = 0;  // a receive ends when its message arrives
};

struct StageResult {
  double busy = 0;           // time spent in Forward, Backward, ReduceGrads, OptimizerStep
  double idle_fraction = 0;  // 1 - busy / makespan: this stage's bubble
  int peak_in_flight = 0;    // most (micro-batch, chunk) forwarded and not yet backwarded at once
  std::vector<TimedInstruction> timeline;
};

struct SimulationResult {
  double makespan = 0;         // when the last stage finishes
  double bubble_fraction = 0;  // 1 - all stages' busy time / (P · makespan)
  std::vector<StageResult> stages;
};

// Throws ScheduleError naming the stage, the instruction and the micro-batch for a schedule
// that cannot run; std::invalid_argument for negative durations.
SimulationResult simulate(const Schedule& schedule, const OpTimes& times = {});

}  // namespace zero::pipeline
