#include "comm/group.hpp"

#include "comm/backend.hpp"
#include "comm/c10d_group.hpp"
#include "comm/liveness.hpp"
#include "comm/startup.hpp"
#include "zero/errors.hpp"

namespace zero::comm {
Work::Work(c10::intrusive_ptr<c10d::Work> work, std::string what, std::string who,
           std::chrono::milliseconds timeout, c10::DeviceType device,
           std::shared_ptr<Liveness> liveness, std::shared_ptr<std::atomic<bool>> failed)
    : work_(std::move(work)),
      what_(std::move(what)),
      who_(std::move(who)),
      timeout_(timeout),
      device_(device),
      liveness_(std::move(liveness)),
      failed_(std::move(failed)) {}

Work::Work(std::function<void()> wait_fn) : wait_fn_(std::move(wait_fn)) {}

Work& Work::then(std::function<void()> f) {
  then_ = std::move(f);
  return *this;
}

Work& Work::hold(at::Tensor t) {
  if (work_ && device_ != c10::DeviceType::CUDA) {
    // Completion runs, then destroys, the callback (and so this reference) on the backend's
    // thread before the waiter wakes; if the work completed already it runs here, at once.
    work_->getFuture()->addCallback([t = std::move(t)](c10::ivalue::Future&) {});
  } else {
    held_.push_back(std::move(t));
  }
  return *this;
}

void Work::wait() {
  auto then = std::move(then_);
  then_ = nullptr;
  if (wait_fn_) {
    auto fn = std::move(wait_fn_);
    wait_fn_ = nullptr;
    fn();
    held_.clear();
    if (then) then();
    return;
  }
  if (!work_) return;
  auto work = std::move(work_);
  try {
    if (device_ == c10::DeviceType::CUDA) {
      nccl_wait(*work);
    } else {
      gloo_wait(*work, timeout_);
    }
  } catch (const std::exception& e) {
    if (failed_) *failed_ = true;
    // Which peer is gone shows in the heartbeats a few seconds after it stopped.
    const std::string gone =
        liveness_ ? liveness_->diagnose(std::chrono::milliseconds(4000))
                  : "a peer rank most likely exited or stalled (check its log above)";
    throw CommError(who_ + ": " + what_ + " failed (" + c10d_message(e) + "): " + gone +
                    "; collectives give up after comm_timeout_s = " + format_seconds(timeout_));
  }
  held_.clear();
  if (then) then();
}

std::shared_ptr<Group> Group::single(const GroupOptions& opts) {
  C10dGroup::Parts p;
  p.opts = opts;
  return std::make_shared<C10dGroup>(std::move(p));
}

std::shared_ptr<Group> Group::over_store(const c10::intrusive_ptr<c10d::Store>& store, int rank,
                                         int size, const GroupOptions& opts) {
  C10dGroup::Parts p;
  p.store = store;
  p.rank = rank;
  p.size = size;
  p.opts = opts;
  p.interface_hint = "127.0.0.1";
  if (size > 1) {
    p.backend = opts.device == c10::DeviceType::CUDA
                    ? make_nccl(store, rank, size, opts)
                    : make_gloo(store, rank, size, opts, p.interface_hint);
  }
  auto g = std::make_shared<C10dGroup>(std::move(p));
  g->connect("over_store");
  return g;
}

}  // namespace zero::comm
