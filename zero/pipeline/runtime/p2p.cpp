// PipelineRuntime's messages (runtime.hpp): sends and receives posted through the queue
// (p2p_queue.hpp), the receives posted early and taken at their instruction, the sends settled
// once delivered, and the activation's shape sent before the activation.
#include <c10/util/accumulate.h>

#include <stdexcept>
#include <string>
#include <utility>

#include "comm/group.hpp"
#include "zero/pipeline/runtime/in_flight.hpp"
#include "zero/pipeline/runtime/p2p_queue.hpp"
#include "zero/pipeline/runtime/runtime.hpp"

namespace zero::pipeline {
namespace {

// An activation's shape and dtype travel before the first activation (before every one under
// dynamic_shape; DeepSpeed's _send_tensor_meta): [dtype, ndim, sizes..., 0 padding]. Gradients
// take the shape of the activation they belong to, so only activations carry it.
constexpr int64_t kMaxDims = 8;
constexpr int64_t kMetaLen = 2 + kMaxDims;

}  // namespace

void PipelineRuntime::issue(comm::Group& g, bool send, const at::Tensor& t, int peer,
                            const std::string& what, comm::Work* out) {
  ++issued_;
  queue_->issue(g, send, t, peer, what, out);
}

void PipelineRuntime::flush() { queue_->flush(); }

bool PipelineRuntime::batches_p2p() const { return queue_->batched(); }

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

at::Tensor PipelineRuntime::wire_buffer(c10::IntArrayRef sizes, c10::ScalarType dtype,
                                        bool split) const {
  const auto options = at::TensorOptions(dtype).device(device_);
  if (!split) return at::empty(sizes, options);
  const int64_t T = opts_.partition_group->size(), n = c10::multiply_integers(sizes);
  return at::empty({(n + T - 1) / T}, options);
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
  flush();
  // Bounded by comm_timeout_s; its error names the peer. Kept in posted_ until it completed: a
  // receive whose wait failed is still posted (note_failure counts it).
  it->second->work.wait();
  at::Tensor buffer = std::move(it->second->buffer);
  posted_.erase(it);
  return buffer;
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
  try {
    w.wait();
  } catch (...) {
    ++failed_recvs_;  // still posted (note_failure)
    throw;
  }
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

}  // namespace zero::pipeline
