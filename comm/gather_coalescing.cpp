#include "comm/gather_coalescing.hpp"

#include <ATen/ATen.h>

#include <exception>
#include <utility>

#include "comm/c10d_group.hpp"
#include "comm/counting_group.hpp"

namespace zero::comm {

Work all_gather_pairs(Group& g, std::vector<at::Tensor>& outs, std::vector<at::Tensor>& ins,
                      const std::string& what) {
  TORCH_CHECK(outs.size() == ins.size(), "zero: ", what, ": ", outs.size(), " outputs for ",
              ins.size(), " inputs");
  auto works = std::make_shared<std::vector<Work>>();
  for (size_t i = 0; i < outs.size(); ++i) {
    works->push_back(g.all_gather(outs[i], ins[i], what));
  }
  return Work([works] {
    for (auto& w : *works) w.wait();
  });
}

Work all_gather_coalesced(Group& g, std::vector<at::Tensor>& outs, std::vector<at::Tensor>& ins,
                          const std::string& what) {
  // The two groups that can do better than pair by pair; the interface stays as it is (a
  // virtual here would rebuild everything that includes comm/group.hpp for two callers).
  if (auto* c = dynamic_cast<C10dGroup*>(&g)) return c->all_gather_coalesced(outs, ins, what);
  if (auto* c = dynamic_cast<CountingGroup*>(&g)) return c->all_gather_coalesced(outs, ins, what);
  return all_gather_pairs(g, outs, ins, what);
}

// The calls queued together, and once sent the collective that serves them. Shared by the Works
// handed out for them: whichever is waited on first sends it (if the window has not) and waits;
// the others find it done.
struct GatherCoalescingGroup::Batch {
  std::shared_ptr<Group> inner;
  std::vector<at::Tensor> outs, ins;
  int64_t out_numel = 0;
  std::string first_what, last_what;
  bool sent = false, done = false;
  std::exception_ptr error;  // the collective's failure, for every Work of the batch
  Work work;

  bool fits(const at::Tensor& out, int64_t bound) const {
    return out.scalar_type() == outs.front().scalar_type() &&
           out.device() == outs.front().device() && out_numel + out.numel() <= bound;
  }

  void send() {
    sent = true;
    if (outs.size() == 1) {  // nothing to coalesce: the call as it came
      work = inner->all_gather(outs[0], ins[0], first_what);
      return;
    }
    const std::string what =
        first_what + " .. " + last_what + " (" + std::to_string(outs.size()) + " coalesced)";
    work = all_gather_coalesced(*inner, outs, ins, what);
  }

  void finish() {
    if (!sent) send();
    if (error) std::rethrow_exception(error);
    if (done) return;
    try {
      work.wait();
    } catch (...) {
      error = std::current_exception();
      throw;
    }
    done = true;
    outs.clear();
    ins.clear();
  }
};

GatherCoalescingGroup::GatherCoalescingGroup(std::shared_ptr<Group> inner, int64_t bound)
    : inner_(std::move(inner)), bound_(bound) {
  TORCH_CHECK(inner_, "zero: GatherCoalescingGroup needs a group");
  TORCH_CHECK(bound_ > 0, "zero: the all-gather bound must be positive, got ", bound_);
}

GatherCoalescingGroup::~GatherCoalescingGroup() = default;

void GatherCoalescingGroup::open() { open_ = true; }

void GatherCoalescingGroup::close() {
  open_ = false;
  send_queued();
}

void GatherCoalescingGroup::send_queued() {
  std::shared_ptr<Batch> b = std::move(queued_);
  queued_ = nullptr;
  if (!b || b->sent) return;
  // One gather in flight at a time: what the bound promises to hold is one gather's buffers.
  if (in_flight_ && !in_flight_->done) in_flight_->finish();
  b->send();
  in_flight_ = std::move(b);
}

Work GatherCoalescingGroup::all_gather(at::Tensor& out, at::Tensor& in, const std::string& what) {
  const bool queueable = open_ && inner_->size() > 1 && out.is_contiguous() && in.is_contiguous() &&
                         out.numel() == in.numel() * inner_->size() &&
                         in.scalar_type() == out.scalar_type();
  // A Work of the queue was waited on, which sent it.
  if (queued_ && queued_->sent) queued_ = nullptr;
  if (!queueable) {
    send_queued();
    return inner_->all_gather(out, in, what);
  }
  if (queued_ && !queued_->fits(out, bound_)) send_queued();
  if (!queued_) {
    queued_ = std::make_shared<Batch>();
    queued_->inner = inner_;
    queued_->first_what = what;
  }
  queued_->outs.push_back(out);
  queued_->ins.push_back(in);
  queued_->out_numel += out.numel();
  queued_->last_what = what;
  return Work([b = queued_] { b->finish(); });
}

Work GatherCoalescingGroup::all_reduce_sum(at::Tensor& t, const std::string& what) {
  send_queued();
  return inner_->all_reduce_sum(t, what);
}

Work GatherCoalescingGroup::reduce_scatter_sum(at::Tensor& out, at::Tensor& in,
                                               const std::string& what) {
  send_queued();
  return inner_->reduce_scatter_sum(out, in, what);
}

Work GatherCoalescingGroup::all_to_all(at::Tensor& out, at::Tensor& in, const std::string& what) {
  send_queued();
  return inner_->all_to_all(out, in, what);
}

Work GatherCoalescingGroup::broadcast(at::Tensor& t, int root, const std::string& what) {
  send_queued();
  return inner_->broadcast(t, root, what);
}

void GatherCoalescingGroup::barrier(const std::string& what) {
  send_queued();
  inner_->barrier(what);
}

Work GatherCoalescingGroup::send(at::Tensor& t, int dst, const std::string& what, int tag) {
  send_queued();
  return inner_->send(t, dst, what, tag);
}

Work GatherCoalescingGroup::recv(at::Tensor& t, int src, const std::string& what, int tag) {
  send_queued();
  return inner_->recv(t, src, what, tag);
}

CoalescingWindow::~CoalescingWindow() {
  if (!g_) return;
  try {
    g_->close();
  } catch (...) {
    // Only on a path that is already failing (the step waits for its gathers before the window
    // closes): a queued call is sent when its Work is waited on.
  }
}

}  // namespace zero::comm
