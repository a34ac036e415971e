// PipelineRuntime's construction (runtime.hpp): the stage's schedule, device, groups and tied
// weights, and the connection of every pair of stages that will exchange messages. The step
// itself is in train_step.cpp, its messages in p2p.cpp, the tensor-parallel split of what they
// carry in partitioned.cpp, the tied weights' exchange in tied_weights.cpp.
#include "zero/pipeline/runtime/runtime.hpp"

#include <algorithm>
#include <set>
#include <stdexcept>
#include <utility>

#include "comm/group.hpp"
#include "comm/p2p_batch.hpp"
#include "zero/pipeline/runtime/early_recvs.hpp"
#include "zero/pipeline/runtime/in_flight.hpp"
#include "zero/pipeline/runtime/p2p_batches.hpp"
#include "zero/pipeline/runtime/p2p_queue.hpp"
#include "zero/pipeline/simulate.hpp"
#include "zero/pipeline/tied_grads.hpp"

namespace zero::pipeline {
namespace {

// A schedule handed in (RuntimeOptions::custom_schedule): the run's shape, and executable.
const Schedule& checked_custom(const Schedule& s, int stages, int micro_batches, int v) {
  if (s.stages != stages || static_cast<int>(s.per_stage.size()) != stages ||
      s.micro_batches != micro_batches || s.virtual_stages != v)
    throw std::invalid_argument(
        "pipeline: RuntimeOptions::custom_schedule is for " + std::to_string(s.stages) +
        " stages (" + std::to_string(s.per_stage.size()) + " lists), " +
        std::to_string(s.micro_batches) + " micro-batches, " + std::to_string(s.virtual_stages) +
        " virtual stages; the run has " + std::to_string(stages) + ", " +
        std::to_string(micro_batches) + ", " + std::to_string(v));
  simulate(s);  // ScheduleError names the stage and instruction
  return s;
}

}  // namespace

PipelineRuntime::PipelineRuntime(StageLayers layers, LossFn loss, std::shared_ptr<comm::Group> pp,
                                 std::unique_ptr<StageOptimizer> optimizer, RuntimeOptions opts,
                                 std::shared_ptr<comm::Group> dp)
    : layers_(std::move(layers)),
      loss_(std::move(loss)),
      pp_(std::move(pp)),
      dp_(std::move(dp)),
      optimizer_(std::move(optimizer)),
      opts_(opts),
      stage_(layers_.stage()),
      stages_(layers_.stages()) {
  queue_ = std::make_unique<P2PQueue>();  // one by one, unless the stages batch (below)
  if (!pp_) throw std::invalid_argument("pipeline: no pipeline group");
  if (pp_->size() != stages_ || pp_->rank() != stage_)
    throw std::invalid_argument("pipeline: the layers were cut for stage " +
                                std::to_string(stage_) + " of " + std::to_string(stages_) +
                                " but this rank is rank " + std::to_string(pp_->rank()) +
                                " of a pipeline group of " + std::to_string(pp_->size()) +
                                " (pipeline.stages must equal the pipeline group's size)");
  if (!optimizer_) throw std::invalid_argument("pipeline: no stage optimizer");
  if (!loss_ && stage_ == stages_ - 1)
    throw std::invalid_argument("pipeline: the last stage needs a loss function");
  const int v = opts_.virtual_stages;
  if (v != layers_.virtual_stages())
    throw std::invalid_argument(where(
        "the layers were cut into " + std::to_string(layers_.virtual_stages()) +
        " chunks per stage but the runtime runs pipeline.virtual_stages " + std::to_string(v) +
        "; cut them with the same virtual_stages"));
  if (v > 1 && stages_ < 2)
    throw std::invalid_argument(
        "pipeline.virtual_stages " + std::to_string(v) +
        " needs pipeline.stages of at least 2 (the interleaved schedule passes chunks between "
        "stages); with one stage use pipeline.virtual_stages: 1");
  // Before any rank connects: a shape the schedule refuses (interleaved with micro-batches not a
  // multiple of the stages) fails alike on every stage.
  recv_shape_.resize(v);
  sent_shape_.resize(v);
  grad_checked_.assign(v, false);
  const Schedule all = opts_.custom_schedule
                           ? checked_custom(*opts_.custom_schedule, stages_, opts_.micro_batches, v)
                           : make_schedule(opts_.schedule, stages_, opts_.micro_batches, v);
  instructions_ = all.per_stage[stage_];
  delivered_ = delivered_sends(all, stage_);
  // The stage's device: its parameters' (a stage without any keeps the host).
  std::vector<at::Tensor> held = layers_.parameters();
  for (const auto& t : layers_.foreign_tied()) held.push_back(t);
  if (!held.empty()) device_ = held.front().device();
  if (stages_ > 1) {
    down_ = pp_->split(0, stage_, pp_->name() + "/to-earlier-stages");
    // Decided from the whole schedule and the groups' kind: the same on every stage, as it must
    // be (a batched message travels on another NCCL communicator than a lone one).
    queue_ = std::make_unique<P2PQueue>(opts_.batch_p2p && !opts_.dynamic_shape &&
                                        comm::coalesces_p2p(*pp_) && comm::coalesces_p2p(*down_) &&
                                        batching_safe(all));
    connect_pairs();
  }
  auto last_backward = [](const std::vector<Instruction>& list) {
    int at = -1;
    for (size_t i = 0; i < list.size(); ++i)
      if (list[i].op == Op::Backward) at = static_cast<int>(i);
    return at;
  };
  last_backward_ = last_backward(instructions_);
  for (const auto& [key, holders] : layers_.tie_stages()) {
    if (holders.size() < 2) continue;
    if (std::find(holders.begin(), holders.end(), stage_) == holders.end()) continue;
    Tie tie{key, holders.front(), {holders.begin() + 1, holders.end()}, {}, -1};
    for (const auto& l : layers_.layers()) {
      auto it = l.tied.find(key);
      if (it == l.tied.end()) continue;
      const bool seen = std::any_of(tie.weights.begin(), tie.weights.end(), [&](const auto& w) {
        return w.unsafeGetTensorImpl() == it->second.unsafeGetTensorImpl();
      });
      if (!seen) tie.weights.push_back(it->second);
    }
    // Stages exchange the weight and its gradient one tensor per key: each stage's layers must
    // name a key by one tensor (they share it).
    if (tie.weights.size() != 1)
      throw std::invalid_argument(where(
          "the layers name the tied key '" + key + "' by " + std::to_string(tie.weights.size()) +
          " different tensors; layers tying a weight must share one"));
    // The owner adds the others' gradients in its last backward: theirs must be complete by
    // then, which holds when every stage's list ends with the same micro-batch (GPipe, 1F1B,
    // interleaved: micro-batch m - 1 through chunk 0).
    const int mine = instructions_[last_backward_].micro_batch;
    for (int t : holders) {
      const auto& other = all.per_stage[t];
      const int theirs = other[last_backward(other)].micro_batch;
      if (theirs != mine)
        throw std::logic_error(where("the schedule ends stage " + std::to_string(t) +
                                     " with another micro-batch; tied weights need the same"));
    }
    // A copy's gradient goes on the link to the owner where the owner takes it (refused here,
    // on every stage alike, for a schedule where no place works).
    if (tie.owner != stage_) {
      try {
        tie.send_after = tied_grad_send_after(all, stage_, tie.owner);
      } catch (const std::logic_error& e) {
        throw std::logic_error(where(std::string("tied weight '") + key + "': " + e.what()));
      }
    }
    ties_.push_back(std::move(tie));
  }
  // Receives are posted early across neither the owner's last backward (it receives the tied
  // gradients) nor the instruction after which a copy sends its tied gradient: those messages
  // share the channels, whose order must stay the schedule's.
  std::vector<bool> fenced(instructions_.size(), false);
  for (const auto& tie : ties_) {
    if (tie.owner == stage_ && last_backward_ >= 0) fenced[last_backward_] = true;
    if (tie.send_after >= 0) fenced[tie.send_after] = true;
  }
  auto channel_of = [this](const Instruction& ins) {
    const bool to_next = ins.op == Op::SendActivation || ins.op == Op::RecvGrad;
    const int peer = to_next ? next_stage() : prev_stage();
    const bool sending = ins.op == Op::SendActivation || ins.op == Op::SendGrad;
    return &channel(sending ? stage_ : peer, sending ? peer : stage_) == pp_.get() ? 0 : 1;
  };
  if (stages_ > 1) early_ = early_receives(instructions_, channel_of, fenced);
  // A copy takes the dtype this stage computes in (an engine may have cast the stage's
  // parameters to bf16), then the owner's values, as DeepSpeed's _synchronize_tied_weights (a
  // program that seeds each stage differently stays correct).
  at::ScalarType dtype = at::kFloat;
  bool found = false;
  for (const auto& p : layers_.parameters()) {
    if (!found && p.is_floating_point()) {
      dtype = p.scalar_type();
      found = true;
    }
  }
  for (auto& tie : ties_) {
    if (tie.owner == stage_ || !found) continue;
    for (auto& w : tie.weights) {
      at::NoGradGuard no_grad;
      if (w.scalar_type() != dtype) w.set_data(w.detach().to(dtype));
    }
  }
  exchange_tied_weights();
  wait_sends();
}

PipelineRuntime::~PipelineRuntime() = default;

bool PipelineRuntime::batching_safe(const Schedule& all) const {
  PlanOptions o;
  o.early_receives = opts_.early_receives;
  o.check_activations = split_activations();
  o.check_grads = split_grads();
  for (const auto& [key, holders] : layers_.tie_stages())
    if (holders.size() >= 2) o.ties.push_back(holders);
  try {
    return batching_is_safe(all, o);
  } catch (const std::logic_error&) {
    return false;  // a tie the schedule cannot carry: the constructor refuses it below
  }
}

std::string PipelineRuntime::where(const std::string& what) const {
  return "pipeline stage " + std::to_string(stage_) + " of " + std::to_string(stages_) + ": " +
         what;
}

// Every pair of stages that will exchange messages, connected now (comm/group.hpp,
// connect_peer) rather than at its first message in step 1: adjacent stages (activations go up
// on pp_, gradients down on down_) and a tied weight's owner with each other holder (the weight
// up, its gradient down). In one sorted order on every stage, so the two ranks of a pair reach
// it having finished every earlier pair either takes part in: no cycle of waits.
void PipelineRuntime::connect_pairs() {
  std::set<std::pair<int, int>> pairs;
  for (int s = 0; s + 1 < stages_; ++s) pairs.insert({s, s + 1});
  // Interleaved: the last stage's chunk c sends to the first stage's chunk c + 1.
  if (opts_.virtual_stages > 1) pairs.insert({0, stages_ - 1});
  for (const auto& [key, holders] : layers_.tie_stages()) {
    for (size_t i = 1; i < holders.size(); ++i) {
      if (holders[i] != holders[0])
        pairs.insert({std::min(holders[0], holders[i]), std::max(holders[0], holders[i])});
    }
  }
  for (const auto& [a, b] : pairs) {
    if (stage_ != a && stage_ != b) continue;
    const int other = stage_ == a ? b : a;
    const std::string what =
        where("connecting stages " + std::to_string(a) + " and " + std::to_string(b));
    if (queue_->batched()) {
      comm::connect_peer_batched(*pp_, other, stage_ == a, what);
      comm::connect_peer_batched(*down_, other, stage_ == b, what);
    } else {
      pp_->connect_peer(other, stage_ == a, what);
      down_->connect_peer(other, stage_ == b, what);
    }
  }
}

}  // namespace zero::pipeline
