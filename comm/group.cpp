#include "comm/group.hpp"

#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>

#include <exception>

#include "comm/backend.hpp"
#include "comm/launcher_env.hpp"
#include "comm/liveness.hpp"
#include "comm/startup.hpp"
#include "zero/comm_errors.hpp"

namespace zero::comm {
Work::Work(c10::intrusive_ptr<c10d::Work> work, std::string what, int rank, int size,
           std::chrono::milliseconds timeout, c10::DeviceType device,
           std::shared_ptr<Liveness> liveness, std::shared_ptr<std::atomic<bool>> failed)
    : work_(std::move(work)),
      what_(std::move(what)),
      rank_(rank),
      size_(size),
      timeout_(timeout),
      device_(device),
      liveness_(std::move(liveness)),
      failed_(std::move(failed)) {}

Work& Work::then(std::function<void()> f) {
  then_ = std::move(f);
  return *this;
}

void Work::wait() {
  if (!work_) return;
  auto work = std::move(work_);
  auto then = std::move(then_);
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
    throw CommError("rank " + std::to_string(rank_) + " of " + std::to_string(size_) + ": " +
                    what_ + " failed (" + c10d_message(e) + "): " + gone +
                    "; collectives give up after comm_timeout_s = " + format_seconds(timeout_));
  }
  if (then) then();
}

Group::Group(c10::intrusive_ptr<c10d::Backend> backend, int rank, int size, GroupOptions opts)
    : backend_(std::move(backend)), rank_(rank), size_(size), opts_(opts) {}

Group::~Group() {
  // An NCCL group is shut down (or, after a failure or while an exception unwinds, aborted)
  // here, not left to c10d's destructor. Gloo needs nothing: dropping it closes its sockets,
  // which is how its peers learn at once that this rank is gone.
  if (backend_ && opts_.device == c10::DeviceType::CUDA) {
    nccl_close(*backend_, *failed_ || std::uncaught_exceptions() > 0);
  }
}

Group::Timeouts Group::timeouts() const {
  if (!backend_) return {};
  return {backend_->getBackendOptions()->timeout, gloo_store_timeout(*backend_)};
}

std::shared_ptr<Group> Group::single(const GroupOptions& opts) {
  return std::make_shared<Group>(nullptr, 0, 1, opts);
}

std::shared_ptr<Group> Group::over_store(const c10::intrusive_ptr<c10d::Store>& store, int rank,
                                         int size, const GroupOptions& opts) {
  if (size == 1) return single(opts);
  auto backend = opts.device == c10::DeviceType::CUDA
                     ? make_nccl(store, rank, size, opts)
                     : make_gloo(store, rank, size, opts, "127.0.0.1");
  return std::make_shared<Group>(std::move(backend), rank, size, opts);
}

void Group::check_device(const at::Tensor& t, const std::string& what) const {
  TORCH_CHECK(t.device().type() == opts_.device, "zero: ", what, " got a tensor on ", t.device(),
              " but this process group moves ", c10::DeviceTypeName(opts_.device), " tensors");
  TORCH_CHECK(t.is_contiguous(), "zero: ", what, " needs contiguous tensors");
}

bool Group::staged() const {
  return opts_.device != c10::DeviceType::CPU && opts_.device != c10::DeviceType::CUDA;
}

namespace {

// The host copy a staged collective runs on; `t` itself when it is on the host already.
at::Tensor on_host(const at::Tensor& t) { return t.is_cpu() ? t : t.cpu(); }

}  // namespace

Work Group::wrap(c10::intrusive_ptr<c10d::Work> w, const std::string& what) const {
  return Work(std::move(w), what, rank_, size_, opts_.timeout, opts_.device, liveness_, failed_);
}

Work Group::all_reduce_sum(at::Tensor& t, const std::string& what) {
  if (size_ == 1) return {};
  check_device(t, what);
  std::vector<at::Tensor> ts{t};
  c10d::AllreduceOptions o;
  o.reduceOp = c10d::ReduceOp::SUM;
  o.timeout = opts_.timeout;
  if (staged()) {
    std::vector<at::Tensor> host{on_host(t)};
    return wrap(backend_->allreduce(host, o), what).then([t, h = host[0]]() mutable {
      t.copy_(h);
    });
  }
  return wrap(backend_->allreduce(ts, o), what);
}

Work Group::reduce_scatter_sum(at::Tensor& out, at::Tensor& in, const std::string& what) {
  TORCH_CHECK(in.numel() == out.numel() * size_, "zero: ", what, ": input has ", in.numel(),
              " elements, expected ", out.numel(), " x ", size_);
  if (size_ == 1) {
    out.copy_(in);
    return {};
  }
  check_device(in, what);
  check_device(out, what);
  c10d::ReduceScatterOptions o;
  o.reduceOp = c10d::ReduceOp::SUM;
  o.timeout = opts_.timeout;
  if (staged()) {
    at::Tensor host_in = on_host(in),
               host_out = at::empty_like(out, out.options().device(at::kCPU));
    return wrap(backend_->_reduce_scatter_base(host_out, host_in, o), what)
        .then([out, host_out, host_in]() mutable { out.copy_(host_out); });
  }
  return wrap(backend_->_reduce_scatter_base(out, in, o), what);
}

Work Group::all_gather(at::Tensor& out, at::Tensor& in, const std::string& what) {
  TORCH_CHECK(out.numel() == in.numel() * size_, "zero: ", what, ": output has ", out.numel(),
              " elements, expected ", in.numel(), " x ", size_);
  if (size_ == 1) {
    out.copy_(in);
    return {};
  }
  check_device(in, what);
  check_device(out, what);
  c10d::AllgatherOptions o;
  o.timeout = opts_.timeout;
  if (staged()) {
    at::Tensor host_in = on_host(in),
               host_out = at::empty_like(out, out.options().device(at::kCPU));
    return wrap(backend_->_allgather_base(host_out, host_in, o), what)
        .then([out, host_out, host_in]() mutable { out.copy_(host_out); });
  }
  return wrap(backend_->_allgather_base(out, in, o), what);
}

Work Group::broadcast(at::Tensor& t, int root, const std::string& what) {
  if (size_ == 1) return {};
  check_device(t, what);
  std::vector<at::Tensor> ts{t};
  c10d::BroadcastOptions o;
  o.rootRank = root;
  o.timeout = opts_.timeout;
  if (staged()) {
    std::vector<at::Tensor> host{on_host(t)};
    return wrap(backend_->broadcast(host, o), what).then([t, h = host[0]]() mutable {
      t.copy_(h);
    });
  }
  return wrap(backend_->broadcast(ts, o), what);
}

void Group::barrier(const std::string& what) {
  if (size_ == 1) return;
  c10d::BarrierOptions o;
  o.timeout = opts_.timeout;
  wrap(backend_->barrier(o), what).wait();
}

}  // namespace zero::comm
