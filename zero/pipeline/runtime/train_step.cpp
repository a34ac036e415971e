// PipelineRuntime::train_batch (runtime.hpp): the stage's instruction list executed, each
// instruction's wall time charged to its kind, and the loss brought to every stage.
#include <chrono>
#include <stdexcept>
#include <string>
#include <vector>

#include "comm/group.hpp"
#include "zero/pipeline/runtime/in_flight.hpp"
#include "zero/pipeline/runtime/p2p_queue.hpp"
#include "zero/pipeline/runtime/runtime.hpp"

namespace zero::pipeline {
namespace {

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

at::Tensor PipelineRuntime::train_batch(const std::vector<at::Tensor>& inputs,
                                        const std::vector<at::Tensor>& targets) {
  const int m = opts_.micro_batches;
  ++steps_;
  auto count = [&](const std::vector<at::Tensor>& list, const char* what) {
    if (static_cast<int>(list.size()) != m)
      throw std::invalid_argument(where(std::to_string(list.size()) + " " + what + " for " +
                                        std::to_string(m) +
                                        " micro-batches (gradient_accumulation_steps)"));
  };
  if (stage_ == 0) count(inputs, "inputs");
  if (stage_ == stages_ - 1) count(targets, "targets");
  if (!queue_->failure().empty()) note_failure("an earlier call");
  if (!broken_.empty()) {
    posted_.clear();
    throw std::runtime_error(broken_);
  }
  posted_.clear();  // a step that failed on the host may have left some (gloo)
  queue_->clear();
  failed_recvs_ = 0;
  issued_ = 0;
  try {
    return run_instructions(inputs, targets);
  } catch (...) {
    note_failure("train_batch (step " + std::to_string(steps_) + ")");
    throw;
  }
}

void PipelineRuntime::note_failure(const std::string& during) {
  if (!broken_.empty()) return;
  const std::string restart =
      ". This pipeline cannot train any more: restart the job (resume from the last checkpoint)";
  if (queue_->batched()) {
    // A batch that threw may have gone out in part, the groups queued after it not at all
    // (p2p_queue.hpp), and a neighbour whose wait on this stage failed left its own batches
    // posted: the operations on the groups' communicators no longer pair up between the ranks,
    // and nothing here can take a posted operation back (review 2026-12-07b L1, L2). Every rank
    // of the run gets here (its step fails too, at the latest when its wait runs out), so every
    // rank refuses alike.
    const std::string& failed = queue_->failure();
    broken_ = where(during +
                    " failed in a run whose point-to-point messages travel in coalesced "
                    "batches (RuntimeOptions::batch_p2p): a batch of this stage or of a "
                    "neighbour may have gone out in part or not at all, and the groups' next "
                    "messages would pair with the wrong operations" +
                    (failed.empty() ? "" : " (" + failed + ")") + restart);
    return;
  }
  // On a device, an operation posted and not known complete stays queued on its pair
  // communicator however its Work is dropped: a receive posted early (or one whose wait failed)
  // would take the next message sent on its channel, a send not known delivered would be taken
  // by the next receive there, so every later tensor would land one message off (same shapes:
  // wrong values, silently) or hang (review 2026-12-07a L5). Nothing here can cancel a posted
  // NCCL operation, so the pipeline refuses to go on. Nor can this rank see what its neighbours
  // posted for this step: on NCCL their waits only order their streams and do not fail, so a
  // neighbour goes on with the step and has already posted its next sends and receives. Once
  // this step posted anything, a step retried here would pair its first messages with the
  // neighbours' later ones (review 2026-12-07c M1): so on a device any failed step that posted
  // a point-to-point operation stops the pipeline. On the host (gloo) the runtime goes on as it
  // did: the neighbours' waits fail too, the next step drops the receives left over, and its
  // waits are bounded.
  const size_t receives = posted_.size() + queue_->queued_receives() + failed_recvs_;
  if (!device_.is_cpu() && (issued_ > 0 || receives + sends_.size() > 0))
    broken_ = where(during + " failed after this step posted " + std::to_string(issued_) +
                    " point-to-point operation(s) (" + std::to_string(receives) +
                    " receive(s) and " + std::to_string(sends_.size()) +
                    " send(s) not known complete): on the device's communicators they, and "
                    "what the neighbouring stages posted for this step, would pair with the "
                    "next step's messages and shift every later one" +
                    restart);
}

at::Tensor PipelineRuntime::run_instructions(const std::vector<at::Tensor>& inputs,
                                             const std::vector<at::Tensor>& targets) {
  const int m = opts_.micro_batches, v = opts_.virtual_stages;
  const bool first = stage_ == 0, last = stage_ == stages_ - 1;
  // Per chunk and micro-batch: what arrived, what the chunk produced (kept for its backward),
  // the gradient of that output. The first virtual stage reads `inputs`, the last one ends in
  // the loss.
  using PerChunk = std::vector<std::vector<at::Tensor>>;
  PerChunk in(v, std::vector<at::Tensor>(m)), out = in, grad_out = in;
  auto is_first = [&](int chunk) { return first && chunk == 0; };
  auto is_last = [&](int chunk) { return last && chunk == v - 1; };
  at::Tensor loss_sum = at::zeros({1}, at::TensorOptions(at::kFloat).device(device_));
  times_ = {};
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
        "micro-batch " + std::to_string(mb) + (v > 1 ? " (chunk " + std::to_string(c) + ")" : "");
    switch (ins.op) {
      case Op::RecvActivation:
        in[c][mb] = take_posted(idx);
        in[c][mb] = in[c][mb].defined() ? whole_of(in[c][mb], recv_shape_[c].sizes,
                                                   split_activations(), recv_activation_what(mb, c))
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

}  // namespace zero::pipeline
