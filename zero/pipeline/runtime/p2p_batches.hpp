// Which point-to-point operations of a pipeline step the runtime posts together, and whether
// posting them so can hang a GPU.
//
// Megatron-LM posts each schedule step's sends and receives as one batch
// (torch.distributed.batch_isend_irecv; on NCCL one ncclGroupStart/End). The runtime does the
// same where its groups coalesce (comm::coalesces_p2p in comm/p2p_batch.hpp, NCCL; gloo has no
// point-to-point coalescing and keeps posting one by one): every send or receive is queued, and the
// queue is posted before anything that waits or computes (a receive's wait, a Forward or Backward,
// the step's reduction), one batch per group with the group's operations in the order they were
// queued. So a step's operations on one group go together: on a middle stage of 1F1B the send
// of micro-batch i's activation and the early receive of micro-batch i + 1's, or the send of a
// gradient and the receive of the next one. No receive is posted earlier than without batching
// (early receives are placed by early_recvs.hpp, unchanged), and no send later than the next
// wait or compute, so nothing that could block the host (review 2026-12-07a M1) sits between a
// send and its batch.
//
// What batching changes on NCCL is the stream: c10d runs a coalesced batch on the group's own
// communicator and stream, where a lone send or receive gets a communicator and stream per pair
// of ranks. Batched, a stage's operations on one group run one after another on one stream (a
// batch at a time), receives from the stage before and sends to the stage after alike; and the
// compute stream waits for a whole batch where it waited for one receive. device_deadlock()
// checks a plan on a model of that: per stage one compute stream and one stream per
// communicator, a batch starting when its stream's previous batch finished and the compute work
// queued before it did (c10d makes the NCCL stream wait on the compute stream), finishing when
// every batch holding one of its messages' other ends has started; a wait on the compute stream
// finishing with its batch, a host read (the activation's shape in step 1) holding back
// everything posted after it. The runtime batches only plans this model finds free of cycles,
// for the first step and a later one (their orders differ: step 1 learns the shapes), and
// otherwise posts one by one on the pair communicators as before.
#pragma once

#include <string>
#include <vector>

#include "zero/pipeline/schedule.hpp"

namespace zero::pipeline {

// The groups a message travels on (runtime.hpp): messages to later stages on the pipeline group,
// to earlier ones on its split.
constexpr int kUpGroup = 0, kDownGroup = 1;
inline int group_of(int from, int to) { return to > from ? kUpGroup : kDownGroup; }

struct PlannedOp {
  bool send = true;
  int peer = -1;      // stage
  int index = -1;     // the instruction it belongs to in the stage's list; -1: a tied weight's
  bool meta = false;  // the activation's shape (step 1)
};

struct PlannedBatch {
  int group = kUpGroup;
  std::vector<PlannedOp> ops;  // in the order they were queued
  bool collective = false;     // the loss's broadcast over the pipeline group (no ops)
  int step = 0;                // 0: the first step, 1: a later one
};

struct PlanItem {
  enum Kind { Post, Wait, HostRead, Compute } kind = Compute;
  int batch = -1;  // Post, Wait, HostRead: index in StagePlan::batches
};

struct StagePlan {
  std::vector<PlannedBatch> batches;
  std::vector<PlanItem> items;  // in the order the stage's host issues them
};

struct PlanOptions {
  // true: each flush posts one batch per group (NCCL batched); false: every operation alone.
  bool batched = true;
  bool early_receives = true;
  // Each tied weight's holders, in stage order (the first owns it).
  std::vector<std::vector<int>> ties;
  // Steps planned: 1 (steady state only, shapes known) or 2 (the first step, then a later one).
  int steps = 2;
  // pipe_partitioned / grad_partitioned in effect (RuntimeOptions): the first activation and
  // gradient of each chunk are checked with a collective, before which the queue is posted.
  bool check_activations = false, check_grads = false;
};

// Every stage's plan of `steps` steps of `schedule`. Throws what tied_grad_send_after throws for
// a tie the schedule cannot carry.
std::vector<StagePlan> p2p_plan(const Schedule& schedule, const PlanOptions& opts);

// "" when every item of every stage's plan finishes on the device model above (batched: one
// stream per stage and group; else one per stage, group and peer); otherwise the first stuck
// item of each stage that has one.
std::string device_deadlock(const std::vector<StagePlan>& plans, bool batched);

// Whether the runtime batches this run's point-to-point operations (where its groups coalesce):
// device_deadlock of the batched plan is "" (the same answer on every stage).
bool batching_is_safe(const Schedule& schedule, const PlanOptions& opts);

}  // namespace zero::pipeline
