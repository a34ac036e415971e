#include "zero/pipeline/runtime/runtime.hpp"

#include <c10/util/accumulate.h>
#include <torch/csrc/autograd/autograd.h>

#include <algorithm>
#include <chrono>
#include <set>
#include <utility>
#include <stdexcept>

#include "comm/group.hpp"
#include "comm/p2p_batch.hpp"
#include "zero/pipeline/runtime/early_recvs.hpp"
#include "zero/pipeline/runtime/p2p_batches.hpp"
#include "zero/pipeline/runtime/p2p_queue.hpp"
#include "zero/pipeline/simulate.hpp"
#include "zero/pipeline/tied_grads.hpp"

namespace zero::pipeline {
namespace {

// An activation's shape and dtype travel before the first activation (before every one under
// dynamic_shape; DeepSpeed's _send_tensor_meta): [dtype, ndim, sizes..., 0 padding]. Gradients
// take the shape of the activation they belong to, so only activations carry it.
constexpr int64_t kMaxDims = 8;
constexpr int64_t kMetaLen = 2 + kMaxDims;

// Adds the wall time from its construction to its end to `to` (StepTimes), however the scope
// is left.
class Charge {
 public:
  explicit Charge(double& to) : to_(to), start_(std::chrono::steady_clock::now()) {}
  Charge(const Charge&) = delete;
  Charge& operator=(const Charge&) = delete;
  ~Charge() {
    to_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  }

 private:
  double& to_;
  std::chrono::steady_clock::time_point start_;
};

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

// A posted send: the Work and the tensor it reads, alive until the Work was waited on.
struct PipelineRuntime::Pending {
  comm::Work work;
  at::Tensor buffer;
  std::optional<Instruction> ins;
};

// A receive posted ahead of its instruction: the buffer it fills and its Work.
struct PipelineRuntime::Posted {
  comm::Work work;
  at::Tensor buffer;
};

namespace {

// Megatron's deallocate_output_tensor: the stage's output, once sent, is needed only as the root
// of its backward (its graph); the next stage holds its values. Its data becomes one element
// broadcast to the output's shape, so the output keeps its sizes (the engine's backward checks
// them against the gradient's) while its storage goes. Not for a view (its base holds the
// storage anyway) nor a tensor without a graph (a stage passing its input through: that data is
// the input's).
void release_data(at::Tensor& y) {
  if (!y.defined() || !y.grad_fn() || y.is_view()) return;
  at::Tensor one = at::empty({1}, y.options()).expand(y.sizes());
  y.set_data(one);
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

void PipelineRuntime::issue(comm::Group& g, bool send, const at::Tensor& t, int peer,
                            const std::string& what, comm::Work* out) {
  queue_->issue(g, send, t, peer, what, out);
}

void PipelineRuntime::flush() { queue_->flush(); }

bool PipelineRuntime::batches_p2p() const { return queue_->batched(); }

std::string PipelineRuntime::where(const std::string& what) const {
  return "pipeline stage " + std::to_string(stage_) + " of " + std::to_string(stages_) + ": " +
         what;
}

std::string PipelineRuntime::recv_activation_what(int mb, int chunk) const {
  return "recv of micro-batch " + std::to_string(mb) + "'s activation from stage " +
         std::to_string(prev_stage()) +
         (opts_.virtual_stages > 1 ? " (chunk " + std::to_string(chunk) + ")" : "");
}

std::string PipelineRuntime::recv_grad_what(int mb, int chunk) const {
  return "recv of micro-batch " + std::to_string(mb) +
         (opts_.virtual_stages > 1 ? " (chunk " + std::to_string(chunk) + ")" : "") +
         "'s gradient from stage " + std::to_string(next_stage());
}

bool PipelineRuntime::split_activations() const {
  return opts_.partition_activations && opts_.partition_group && opts_.partition_group->size() > 1;
}

bool PipelineRuntime::split_grads() const {
  return opts_.partition_grads && opts_.partition_group && opts_.partition_group->size() > 1;
}

at::Tensor PipelineRuntime::part_of(const at::Tensor& whole) const {
  const int64_t T = opts_.partition_group->size(), n = whole.numel(), k = (n + T - 1) / T;
  at::Tensor flat = whole.detach().reshape({-1});
  if (k * T != n) flat = at::cat({flat, at::zeros({k * T - n}, flat.options())});
  // A copy: the whole tensor's storage is not kept alive by the send of 1/T of it.
  return flat.narrow(0, opts_.partition_group->rank() * k, k).clone();
}

at::Tensor PipelineRuntime::wire_buffer(c10::IntArrayRef sizes, c10::ScalarType dtype,
                                        bool split) const {
  const auto options = at::TensorOptions(dtype).device(device_);
  if (!split) return at::empty(sizes, options);
  const int64_t T = opts_.partition_group->size(), n = c10::multiply_integers(sizes);
  return at::empty({(n + T - 1) / T}, options);
}

at::Tensor PipelineRuntime::whole_of(const at::Tensor& received, c10::IntArrayRef sizes, bool split,
                                     const std::string& what) {
  if (!split) return received;
  flush();  // nothing queued waits behind the collective
  comm::Group& g = *opts_.partition_group;
  const int64_t n = c10::multiply_integers(sizes);
  at::Tensor all = at::empty({received.numel() * g.size()}, received.options());
  at::Tensor part = received;
  g.all_gather(all, part, where("all-gather of the parts of " + what)).wait();
  if (all.numel() == n) return all.view(sizes);
  return all.narrow(0, 0, n).clone().view(sizes);  // the padding dropped
}

void PipelineRuntime::check_replicated(const at::Tensor& t, const std::string& what,
                                       const char* key) {
  flush();
  comm::Group& g = *opts_.partition_group;
  // Two sums in fp64: equal tensors give equal bits on every rank (the same data, the same
  // order); a rank holding its own shard (sequence parallelism, a layer leaving its output
  // split) differs in them. Bitwise on purpose (review 2026-12-07a L8): a replicated activation
  // is bit-identical where the ranks run the same kernels (NCCL's all-reduce gives every rank
  // the same bits); ranks on different GPU models or nondeterministic kernels may be refused, and
  // the message says so, since a tolerance of a few ulps of the sum would also pass two different
  // shards of a large bf16 activation.
  const at::Tensor d = t.detach().to(at::kDouble);
  at::Tensor mine = at::stack({d.sum(), (d * d).sum()});
  at::Tensor all = at::empty({2 * g.size()}, mine.options());
  g.all_gather(all, mine, where("all-gather of the checksums of " + what)).wait();
  const at::Tensor host = all.cpu().view({g.size(), 2});
  for (int r = 1; r < g.size(); ++r) {
    if (!at::equal(host[r], host[0]))
      throw std::invalid_argument(where(
          std::string("pipeline.") + key + " splits " + what +
          " over the tensor-parallel group, but its ranks hold different values (rank 0's sums " +
          std::to_string(host[0][0].item<double>()) + ", rank " + std::to_string(r) + "'s " +
          std::to_string(host[r][0].item<double>()) +
          "): only a tensor every tensor-parallel rank holds whole can be split; set pipeline." +
          key +
          ": false for layers whose outputs differ between the ranks (the check is bitwise: "
          "ranks on different GPU models or nondeterministic kernels differ by a few ulps "
          "and need it false too)"));
  }
}

void PipelineRuntime::post_early(size_t idx) {
  if (idx >= early_.size()) return;
  for (int r : early_[idx]) {
    if (static_cast<size_t>(r) == idx) continue;  // posted by its own instruction
    const Instruction& ins = instructions_[r];
    // A gradient has the shape of the activation this chunk sent; an activation the shape
    // announced before the chunk's first one. Unknown (first step) or changing: not early.
    const Shape& shape =
        ins.op == Op::RecvActivation ? recv_shape_[ins.chunk] : sent_shape_[ins.chunk];
    if (opts_.dynamic_shape || !shape.known) continue;
    const bool act = ins.op == Op::RecvActivation;
    auto p = std::make_unique<Posted>();
    p->buffer = wire_buffer(shape.sizes, shape.dtype, act ? split_activations() : split_grads());
    const int src = act ? prev_stage() : next_stage();
    const std::string what = act ? recv_activation_what(ins.micro_batch, ins.chunk)
                                 : recv_grad_what(ins.micro_batch, ins.chunk);
    issue(channel(src, stage_), false, p->buffer, src, where(what + " (posted early)"), &p->work);
    posted_[r] = std::move(p);
  }
}

at::Tensor PipelineRuntime::take_posted(size_t idx) {
  auto it = posted_.find(idx);
  if (it == posted_.end()) return {};
  std::unique_ptr<Posted> p = std::move(it->second);
  posted_.erase(it);
  flush();
  p->work.wait();  // bounded by comm_timeout_s; its error names the peer
  return p->buffer;
}

at::Tensor PipelineRuntime::recv_activation(int mb, int chunk) {
  const int prev = prev_stage();
  const std::string from =
      " from stage " + std::to_string(prev) +
      (opts_.virtual_stages > 1 ? " (chunk " + std::to_string(chunk) + ")" : "");
  Shape& shape = recv_shape_[chunk];
  if (opts_.dynamic_shape || !shape.known) {
    at::Tensor meta = at::zeros({kMetaLen}, at::TensorOptions(at::kLong).device(device_));
    recv(meta, prev, "recv of the activation's shape" + from);
    // The step's one host read (the first step's only, unless dynamic_shape): the copy runs
    // after the receive landed (NCCL's wait() only orders the stream).
    const at::Tensor host = meta.cpu();
    auto m = host.accessor<int64_t, 1>();
    if (m[1] < 0 || m[1] > kMaxDims)
      throw std::runtime_error(where("received an activation shape of " + std::to_string(m[1]) +
                                     " dimensions" + from +
                                     "; the stages disagree on the protocol (RuntimeOptions::"
                                     "dynamic_shape must be the same on every stage)"));
    shape.dtype = static_cast<c10::ScalarType>(m[0]);
    shape.sizes.assign(m.data() + 2, m.data() + 2 + m[1]);
    shape.known = true;
  }
  at::Tensor x = wire_buffer(shape.sizes, shape.dtype, split_activations());
  recv(x, prev, recv_activation_what(mb, chunk));
  return whole_of(x, shape.sizes, split_activations(), recv_activation_what(mb, chunk));
}

namespace {

std::string describe(c10::IntArrayRef shape, c10::ScalarType dtype) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "] " + c10::toString(dtype);
}

}  // namespace

void PipelineRuntime::send_activation(int mb, int chunk, const at::Tensor& y) {
  const int next = next_stage();
  const std::string to =
      " to stage " + std::to_string(next) +
      (opts_.virtual_stages > 1 ? " (from chunk " + std::to_string(chunk) + ")" : "");
  Shape& shape = sent_shape_[chunk];
  const Instruction ins{Op::SendActivation, mb, chunk};
  if (opts_.dynamic_shape || !shape.known) {
    if (y.dim() > kMaxDims)
      throw std::invalid_argument(where("an activation of " + std::to_string(y.dim()) +
                                        " dimensions (at most " + std::to_string(kMaxDims) + ")"));
    // Filled on the host, then one copy to the activation's device (an element-wise fill
    // there would be a copy per element).
    at::Tensor meta = at::zeros({kMetaLen}, at::kLong);
    auto m = meta.accessor<int64_t, 1>();
    m[0] = static_cast<int64_t>(y.scalar_type());
    m[1] = y.dim();
    for (int64_t d = 0; d < y.dim(); ++d) m[2 + d] = y.size(d);
    if (split_activations() && !shape.known)
      check_replicated(y, "chunk " + std::to_string(chunk) + "'s activation", "pipe_partitioned");
    post_send(meta.to(y.device()), next, "send of the activation's shape" + to, ins);
    // Batched, the shape goes without the activation: the next stage reads it on the host
    // before it posts the activation's receive (p2p_batches.hpp).
    flush();
    shape.sizes.assign(y.sizes().begin(), y.sizes().end());
    shape.dtype = y.scalar_type();
    shape.known = true;
  } else if (y.sizes() != c10::IntArrayRef(shape.sizes) || y.scalar_type() != shape.dtype) {
    // The next stage receives into a buffer of the announced shape: a message of another size
    // would hang it (NCCL) or fill it with the wrong values. Host metadata, no device read.
    throw std::invalid_argument(where(
        "step " + std::to_string(steps_) + ", micro-batch " + std::to_string(mb) +
        ": the activation" + to + " is " + describe(y.sizes(), y.scalar_type()) +
        ", but the shape sent once, before the first activation, was " +
        describe(shape.sizes, shape.dtype) + " and stage " + std::to_string(next) +
        " receives every activation as that. Keep every micro-batch's activation one shape (pad "
        "the sequences to one length) or run the pipeline with RuntimeOptions::dynamic_shape "
        "(the shape then travels before every micro-batch, one host read each; DeepSpeed's "
        "dynamic_shape, Megatron's variable_seq_lengths)"));
  }
  post_send(split_activations() ? part_of(y) : y.detach().contiguous(), next,
            "send of micro-batch " + std::to_string(mb) + "'s activation" + to, ins);
  // The caller releases y's data next (release_data): the send must hold another TensorImpl
  // over the storage (detach() makes one), which keeps the storage alive until settle() waited
  // on the send. Passing y itself would free the storage under a queued send on a GPU.
  TORCH_INTERNAL_ASSERT(sends_.back()->buffer.unsafeGetTensorImpl() != y.unsafeGetTensorImpl(),
                        "pipeline: the activation's send holds the output it releases");
}

comm::Group& PipelineRuntime::channel(int from, int to) const { return to > from ? *pp_ : *down_; }

void PipelineRuntime::recv(at::Tensor& t, int src, const std::string& what) {
  comm::Work w;
  issue(channel(src, stage_), false, t, src, where(what), &w);
  flush();
  w.wait();
}

void PipelineRuntime::wait_sends(bool schedule_only) {
  flush();
  for (auto it = sends_.begin(); it != sends_.end();) {
    if (schedule_only && !(*it)->ins) {
      ++it;
      continue;
    }
    (*it)->work.wait();
    it = sends_.erase(it);
  }
}

void PipelineRuntime::settle(const std::vector<Instruction>& sent) {
  flush();
  for (const auto& ins : sent) {
    for (auto it = sends_.begin(); it != sends_.end();) {
      if ((*it)->ins == ins) {
        (*it)->work.wait();
        it = sends_.erase(it);
      } else {
        ++it;
      }
    }
  }
}

void PipelineRuntime::post_send(at::Tensor t, int dst, const std::string& what,
                                std::optional<Instruction> ins) {
  auto p = std::make_unique<Pending>();
  p->buffer = std::move(t);
  p->ins = ins;
  issue(channel(stage_, dst), true, p->buffer, dst, where(what), &p->work);
  sends_.push_back(std::move(p));
}

// A stage holding a copy: after instruction `idx` of its list (Tie::send_after), the copy's
// gradient (this step's sum over micro-batches, with whatever factor the loss's backward
// applied) goes to the owner.
void PipelineRuntime::send_tied_grads(int idx) {
  for (auto& tie : ties_) {
    if (tie.owner == stage_ || tie.send_after != idx) continue;
    at::Tensor& w = tie.weights.front();
    at::Tensor g = w.grad().defined() ? w.grad().contiguous() : at::zeros_like(w);
    post_send(g, tie.owner,
              "send of the gradient of tied weight '" + tie.key + "' to stage " +
                  std::to_string(tie.owner));
    w.mutable_grad() = at::Tensor();  // the next step starts afresh
  }
}

// The owner, before its last backward: the other holders' gradients, summed.
std::vector<at::Tensor> PipelineRuntime::recv_tied_grads() {
  std::vector<at::Tensor> sums;
  for (auto& tie : ties_) {
    if (tie.owner != stage_) continue;
    const at::Tensor& w = tie.weights.front();
    at::Tensor sum = at::zeros_like(w, at::MemoryFormat::Contiguous);
    for (int t : tie.others) {
      at::Tensor g = at::empty_like(w, at::MemoryFormat::Contiguous);
      recv(g, t,
           "recv of the gradient of tied weight '" + tie.key + "' from stage " + std::to_string(t));
      sum.add_(g);
    }
    sums.push_back(sum);
  }
  return sums;
}

void PipelineRuntime::sync_tied_weights() {
  exchange_tied_weights();
  wait_sends();
}

// The owner's values to every copy: at start-up, and after each optimizer step.
void PipelineRuntime::exchange_tied_weights() {
  at::NoGradGuard no_grad;
  for (auto& tie : ties_) {
    at::Tensor& w = tie.weights.front();
    if (tie.owner == stage_) {
      for (int t : tie.others)
        post_send(w.detach().contiguous(), t,
                  "send of tied weight '" + tie.key + "' to stage " + std::to_string(t));
      continue;
    }
    at::Tensor v = at::empty_like(w, at::MemoryFormat::Contiguous);
    recv(v, tie.owner,
         "recv of tied weight '" + tie.key + "' from stage " + std::to_string(tie.owner));
    w.detach().copy_(v);
  }
}

at::Tensor PipelineRuntime::train_batch(const std::vector<at::Tensor>& inputs,
                                        const std::vector<at::Tensor>& targets) {
  const int m = opts_.micro_batches, v = opts_.virtual_stages;
  ++steps_;
  const bool first = stage_ == 0, last = stage_ == stages_ - 1;
  auto count = [&](const std::vector<at::Tensor>& list, const char* what) {
    if (static_cast<int>(list.size()) != m)
      throw std::invalid_argument(where(std::to_string(list.size()) + " " + what + " for " +
                                        std::to_string(m) +
                                        " micro-batches (gradient_accumulation_steps)"));
  };
  if (first) count(inputs, "inputs");
  if (last) count(targets, "targets");

  // Per chunk and micro-batch: what arrived, what the chunk produced (kept for its backward),
  // the gradient of that output. The first virtual stage reads `inputs`, the last one ends in
  // the loss.
  using PerChunk = std::vector<std::vector<at::Tensor>>;
  PerChunk in(v, std::vector<at::Tensor>(m)), out = in, grad_out = in;
  auto is_first = [&](int chunk) { return first && chunk == 0; };
  auto is_last = [&](int chunk) { return last && chunk == v - 1; };
  at::Tensor loss_sum = at::zeros({1}, at::TensorOptions(at::kFloat).device(device_));
  times_ = {};
  if (!posted_.empty() && !device_.is_cpu()) {
    // The previous step failed with receives posted early. Dropping their Works does not take
    // the receives back: on NCCL each stays queued on its pair communicator and would match the
    // next message sent on that channel, so every later tensor would land one message off
    // (same shapes: wrong values, silently) or hang (review 2026-12-07a L5). Nothing here can
    // cancel a posted NCCL receive, so the pipeline refuses to go on.
    broken_ = where("the previous train_batch failed with " + std::to_string(posted_.size()) +
                    " receive(s) posted early still queued on the pipeline's communicators; "
                    "they would take the next messages and shift every later one. This "
                    "pipeline cannot train any more: restart the job (resume from the last "
                    "checkpoint)");
  }
  if (!broken_.empty()) {
    posted_.clear();
    throw std::runtime_error(broken_);
  }
  posted_.clear();  // a step that failed on the host may have left some (gloo)
  queue_->clear();
  for (size_t idx = 0; idx < instructions_.size(); ++idx) {
    const Instruction& ins = instructions_[idx];
    const int mb = ins.micro_batch, c = ins.chunk;
    if (opts_.early_receives) {
      Charge posting(times_.comm_s);
      post_early(idx);
    }
    // A step's sends and receives join one batch, posted when something waits (a receive's
    // wait flushes) or computes.
    if (ins.op == Op::Forward || ins.op == Op::Backward || ins.op == Op::ReduceGrads ||
        ins.op == Op::OptimizerStep) {
      Charge posting(times_.comm_s);
      flush();
    }
    // Each instruction's wall time goes to its kind (StepTimes): the sends and receives are the
    // pipeline's communication, waiting for the neighbours included.
    Charge charge(ins.op == Op::Forward         ? times_.forward_s
                  : ins.op == Op::Backward      ? times_.backward_s
                  : ins.op == Op::OptimizerStep ? times_.step_s
                                                : times_.comm_s);
    const std::string of_mb =
        "micro-batch " + std::to_string(mb) +
        (v > 1 ? " (chunk " + std::to_string(c) + ")" : "");
    switch (ins.op) {
      case Op::RecvActivation:
        in[c][mb] = take_posted(idx);
        in[c][mb] = in[c][mb].defined()
                        ? whole_of(in[c][mb], recv_shape_[c].sizes, split_activations(),
                                   recv_activation_what(mb, c))
                        : recv_activation(mb, c);
        if (in[c][mb].is_floating_point()) in[c][mb].requires_grad_(true);
        settle(delivered_[idx]);
        break;
      case Op::Forward: {
        at::Tensor x = is_first(c) ? inputs[mb] : in[c][mb];
        at::Tensor y = layers_.forward(x, c);
        if (is_last(c)) {
          y = loss_(y, targets[mb]);
          loss_sum += y.detach().to(at::kFloat).reshape({1});
        }
        out[c][mb] = y;
        break;
      }
      case Op::SendActivation:
        send_activation(mb, c, out[c][mb]);
        release_data(out[c][mb]);
        break;
      case Op::RecvGrad: {
        at::Tensor g = take_posted(idx);
        if (!g.defined()) {
          g = wire_buffer(out[c][mb].sizes(), out[c][mb].scalar_type(), split_grads());
          recv(g, next_stage(), recv_grad_what(mb, c));
        }
        grad_out[c][mb] = whole_of(g, out[c][mb].sizes(), split_grads(), recv_grad_what(mb, c));
        settle(delivered_[idx]);
        break;
      }
      case Op::Backward:
        optimizer_->set_chunk(c);
        if (is_last(c)) {
          optimizer_->backward(out[c][mb], m);
        } else {
          std::vector<at::Tensor> roots{out[c][mb]}, grads{grad_out[c][mb]};
          if (static_cast<int>(idx) == last_backward_) {
            // The owner of a tied weight: the other holders' gradients join this last
            // backward as the weight's own root, so they are reduced and stepped with the rest.
            auto sums = recv_tied_grads();
            size_t k = 0;
            for (auto& tie : ties_) {
              if (tie.owner != stage_) continue;
              roots.push_back(tie.weights.front());
              grads.push_back(sums[k++]);
            }
          }
          optimizer_->backward(roots, grads);
        }
        out[c][mb] = at::Tensor();  // the graph and this micro-batch's activations go now
        grad_out[c][mb] = at::Tensor();
        break;
      case Op::SendGrad: {
        at::Tensor& x = in[c][mb];
        at::Tensor g = x.grad().defined() ? x.grad().contiguous() : at::zeros_like(x);
        if (split_grads()) {
          if (!grad_checked_[c]) {
            check_replicated(g, "chunk " + std::to_string(c) + "'s input gradient",
                             "grad_partitioned");
            grad_checked_[c] = true;
          }
          g = part_of(g);
        }
        post_send(g, prev_stage(),
                  "send of " + of_mb + "'s gradient to stage " + std::to_string(prev_stage()),
                  Instruction{Op::SendGrad, mb, c});
        x = at::Tensor();
        break;
      }
      case Op::ReduceGrads:
        // The schedule's sends only: the owner takes a tied gradient posted before this in its
        // last backward, which may wait for what this stage sends after ReduceGrads.
        wait_sends(/*schedule_only=*/true);
        optimizer_->reduce_grads();
        break;
      case Op::OptimizerStep:
        optimizer_->step();
        exchange_tied_weights();
        break;
    }
    send_tied_grads(static_cast<int>(idx));
  }

  // The loss lives on the last stage: averaged over micro-batches (and data-parallel replicas),
  // then broadcast to every stage, as DeepSpeed's _aggregate_total_loss.
  Charge charge(times_.comm_s);
  flush();
  at::Tensor loss = last ? loss_sum / m : at::zeros({1}, loss_sum.options());
  if (last && dp_ && dp_->size() > 1) {
    dp_->all_reduce_sum(loss, where("all-reduce of the loss over data parallel")).wait();
    loss /= dp_->size();
  }
  if (stages_ > 1)
    pp_->broadcast(loss, stages_ - 1, where("broadcast of the loss from the last stage")).wait();
  wait_sends();  // the tied weights sent after the step
  return loss.reshape({});
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
