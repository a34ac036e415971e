#include "zero/pipeline/runtime/runtime.hpp"

#include <torch/csrc/autograd/autograd.h>

#include <algorithm>
#include <stdexcept>

#include "comm/group.hpp"

namespace zero::pipeline {
namespace {

// An activation's shape and dtype travel before its first micro-batch of a step (DeepSpeed's
// _send_tensor_meta): [dtype, ndim, sizes..., 0 padding]. Gradients take the shape of the
// activation they belong to, so only activations carry it.
constexpr int64_t kMaxDims = 8;
constexpr int64_t kMetaLen = 2 + kMaxDims;

}  // namespace

// A posted send: the Work and the tensor it reads, alive until the Work was waited on.
struct PipelineRuntime::Pending {
  comm::Work work;
  at::Tensor buffer;
};

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
  if (opts_.schedule == ScheduleKind::Interleaved)
    throw std::invalid_argument(
        "pipeline.schedule: the runtime runs 1f1b and gpipe; interleaved (virtual stages) is "
        "simulated only so far");
  instructions_ = opts_.schedule == ScheduleKind::GPipe
                      ? gpipe_schedule(stages_, opts_.micro_batches, stage_)
                      : one_f_one_b_schedule(stages_, opts_.micro_batches, stage_);
  // One group per tied key held by two stages or more, split by every pipeline rank in the
  // same (key) order: the split is collective.
  for (const auto& [key, owners] : layers_.tie_stages()) {
    if (owners.size() < 2) continue;
    const bool mine = std::find(owners.begin(), owners.end(), stage_) != owners.end();
    auto g = pp_->split(mine ? 0 : -1, stage_, "tied " + key);
    if (!mine) continue;
    Tie tie{key, g, {}};
    for (const auto& l : layers_.layers()) {
      auto it = l.tied.find(key);
      if (it == l.tied.end()) continue;
      const bool seen = std::any_of(tie.weights.begin(), tie.weights.end(), [&](const auto& w) {
        return w.unsafeGetTensorImpl() == it->second.unsafeGetTensorImpl();
      });
      if (!seen) tie.weights.push_back(it->second);
    }
    // The copies start equal: the first owner's values, as DeepSpeed's
    // _synchronize_tied_weights (a program that seeds each stage differently stays correct).
    at::NoGradGuard no_grad;
    for (auto& w : tie.weights) {
      at::Tensor d = w.detach();
      tie.group->broadcast(d, 0, where("broadcast of tied weight '" + key + "'")).wait();
    }
    ties_.push_back(std::move(tie));
  }
}

PipelineRuntime::~PipelineRuntime() = default;

std::string PipelineRuntime::where(const std::string& what) const {
  return "pipeline stage " + std::to_string(stage_) + " of " + std::to_string(stages_) + ": " +
         what;
}

at::Tensor PipelineRuntime::recv_activation(int mb) {
  const int prev = stage_ - 1;
  const std::string from = " from stage " + std::to_string(prev);
  if (mb == 0) {
    at::Tensor meta = at::zeros({kMetaLen}, at::kLong);
    pp_->recv(meta, prev, where("recv of the activation's shape" + from)).wait();
    auto m = meta.accessor<int64_t, 1>();
    recv_dtype_ = static_cast<c10::ScalarType>(m[0]);
    recv_shape_.assign(m.data() + 2, m.data() + 2 + m[1]);
  }
  at::Tensor x = at::empty(recv_shape_, at::TensorOptions().dtype(recv_dtype_));
  pp_->recv(x, prev, where("recv of micro-batch " + std::to_string(mb) + "'s activation" + from))
      .wait();
  return x;
}

void PipelineRuntime::send_activation(int mb, const at::Tensor& y) {
  const int next = stage_ + 1;
  const std::string to = " to stage " + std::to_string(next);
  if (mb == 0) {
    if (y.dim() > kMaxDims)
      throw std::invalid_argument(where("an activation of " + std::to_string(y.dim()) +
                                        " dimensions (at most " + std::to_string(kMaxDims) + ")"));
    at::Tensor meta = at::zeros({kMetaLen}, at::kLong);
    meta[0] = static_cast<int64_t>(y.scalar_type());
    meta[1] = y.dim();
    for (int64_t d = 0; d < y.dim(); ++d) meta[2 + d] = y.size(d);
    auto p = std::make_unique<Pending>();
    p->buffer = meta;
    p->work = pp_->send(p->buffer, next, where("send of the activation's shape" + to));
    sends_.push_back(std::move(p));
  }
  auto p = std::make_unique<Pending>();
  p->buffer = y.detach().contiguous();
  p->work = pp_->send(p->buffer, next,
                      where("send of micro-batch " + std::to_string(mb) + "'s activation" + to));
  sends_.push_back(std::move(p));
}

void PipelineRuntime::wait_sends() {
  for (auto& p : sends_) p->work.wait();
  sends_.clear();
}

void PipelineRuntime::reduce_tied_grads() {
  for (auto& tie : ties_) {
    for (auto& w : tie.weights) {
      at::Tensor g = w.mutable_grad();
      if (!g.defined()) {
        w.mutable_grad() = at::zeros_like(w);
        g = w.mutable_grad();
      }
      tie.group->all_reduce_sum(g, where("all-reduce of tied weight '" + tie.key + "'")).wait();
    }
  }
}

float PipelineRuntime::train_batch(const std::vector<at::Tensor>& inputs,
                                   const std::vector<at::Tensor>& targets) {
  const int m = opts_.micro_batches;
  const bool first = stage_ == 0, last = stage_ == stages_ - 1;
  auto count = [&](const std::vector<at::Tensor>& v, const char* what) {
    if (static_cast<int>(v.size()) != m)
      throw std::invalid_argument(where(std::to_string(v.size()) + " " + what + " for " +
                                        std::to_string(m) +
                                        " micro-batches (gradient_accumulation_steps)"));
  };
  if (first) count(inputs, "inputs");
  if (last) count(targets, "targets");

  std::vector<at::Tensor> in(m), out(m), grad_out(m);
  at::Tensor loss_sum = at::zeros({1}, at::kFloat);
  for (const Instruction& ins : instructions_) {
    const int mb = ins.micro_batch;
    switch (ins.op) {
      case Op::RecvActivation:
        in[mb] = recv_activation(mb);
        if (in[mb].is_floating_point()) in[mb].requires_grad_(true);
        break;
      case Op::Forward: {
        at::Tensor x = first ? inputs[mb] : in[mb];
        at::Tensor y = layers_.forward(x);
        if (last) {
          y = loss_(y, targets[mb]);
          loss_sum += y.detach().to(at::kFloat).reshape({1});
        }
        out[mb] = y;
        break;
      }
      case Op::SendActivation:
        send_activation(mb, out[mb]);
        break;
      case Op::RecvGrad: {
        grad_out[mb] = at::empty_like(out[mb], at::MemoryFormat::Contiguous);
        pp_->recv(grad_out[mb], stage_ + 1,
                  where("recv of micro-batch " + std::to_string(mb) + "'s gradient from stage " +
                        std::to_string(stage_ + 1)))
            .wait();
        break;
      }
      case Op::Backward:
        if (last) {
          (out[mb] / m).backward();
        } else {
          torch::autograd::backward({out[mb]}, {grad_out[mb]});
        }
        out[mb] = at::Tensor();  // the graph and this micro-batch's activations go now
        grad_out[mb] = at::Tensor();
        break;
      case Op::SendGrad: {
        auto p = std::make_unique<Pending>();
        p->buffer = in[mb].grad().defined() ? in[mb].grad().contiguous() : at::zeros_like(in[mb]);
        p->work = pp_->send(p->buffer, stage_ - 1,
                            where("send of micro-batch " + std::to_string(mb) +
                                  "'s gradient to stage " + std::to_string(stage_ - 1)));
        sends_.push_back(std::move(p));
        in[mb] = at::Tensor();
        break;
      }
      case Op::ReduceGrads:
        wait_sends();
        reduce_tied_grads();
        optimizer_->reduce_grads();
        break;
      case Op::OptimizerStep:
        optimizer_->step();
        break;
    }
  }

  // The loss lives on the last stage: averaged over micro-batches (and data-parallel replicas),
  // then broadcast to every stage, as DeepSpeed's _aggregate_total_loss.
  at::Tensor loss = last ? loss_sum / m : at::zeros({1}, at::kFloat);
  if (last && dp_ && dp_->size() > 1) {
    dp_->all_reduce_sum(loss, where("all-reduce of the loss over data parallel")).wait();
    loss /= dp_->size();
  }
  if (stages_ > 1)
    pp_->broadcast(loss, stages_ - 1, where("broadcast of the loss from the last stage")).wait();
  return loss.item<float>();
}

}  // namespace zero::pipeline
