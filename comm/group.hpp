// A process group: the few collectives the engine needs, over a c10d backend.
//
// Every collective is asynchronous and returns a Work; Work::wait() rethrows a backend failure
// as zero::CommError naming this rank, the collective and the timeout, so a dead or stalled
// peer ends the run with a message instead of a hang. A group of size 1 has no backend, no store
// and no network: its collectives complete at once (reduce-scatter and all-gather copy).
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/intrusive_ptr.h>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <string>

namespace c10d {
class Backend;
class Store;
}  // namespace c10d

namespace zero::comm {

class Liveness;

struct GroupOptions {
  std::chrono::milliseconds timeout{std::chrono::seconds(1800)};  // comm_timeout_s's default
  // Device of the tensors this group moves: CPU -> gloo, CUDA -> NCCL. Any other device type
  // (one with no collective backend here, e.g. the tests' fake accelerator) -> gloo through host
  // copies: each collective copies its input to the host, and wait() copies the result back.
  c10::DeviceType device = c10::DeviceType::CPU;
};

class Work {
 public:
  Work() = default;  // already complete
  Work(c10::intrusive_ptr<c10d::Work> work, std::string what, int rank, int size,
       std::chrono::milliseconds timeout, c10::DeviceType device,
       std::shared_ptr<Liveness> liveness = nullptr,
       std::shared_ptr<std::atomic<bool>> failed = nullptr);
  // Runs `then` once the collective finished (the copy of a host-staged result to its device).
  Work& then(std::function<void()> f);
  // CPU (gloo): blocks until the collective finished, at most comm_timeout. CUDA (NCCL): makes
  // the current stream wait for it and returns without blocking the host; the group's watchdog
  // enforces comm_timeout (comm/backend.hpp says why).
  void wait();
  bool pending() const { return static_cast<bool>(work_); }

 private:
  c10::intrusive_ptr<c10d::Work> work_;
  std::string what_;
  int rank_ = 0;
  int size_ = 1;
  std::chrono::milliseconds timeout_{0};
  c10::DeviceType device_ = c10::DeviceType::CPU;
  std::shared_ptr<Liveness> liveness_;         // names the gone rank after a failure; may be null
  std::shared_ptr<std::atomic<bool>> failed_;  // the group's: set when this wait fails
  std::function<void()> then_;
};

class Group {
 public:
  // From the launcher's environment (torchrun, Open MPI, Slurm); world size 1 needs nothing.
  static std::shared_ptr<Group> from_env(const GroupOptions& opts);
  // Size 1: every collective is a local no-op.
  static std::shared_ptr<Group> single(const GroupOptions& opts = {});
  // Over an existing store (tests run N ranks as N threads over one HashStore).
  static std::shared_ptr<Group> over_store(const c10::intrusive_ptr<c10d::Store>& store, int rank,
                                           int size, const GroupOptions& opts);

  int rank() const { return rank_; }
  int size() const { return size_; }
  const GroupOptions& options() const { return opts_; }
  // What the backend and the store it keeps were built with, for tests: both must be
  // comm_timeout_s, not what was left of start-up. 0 where unknown (size 1; NCCL's store).
  struct Timeouts {
    std::chrono::milliseconds backend{0}, store{0};
  };
  Timeouts timeouts() const;

  // `what` names the call in errors ("reduce_scatter of bucket 3").
  Work all_reduce_sum(at::Tensor& t, const std::string& what);
  // in.numel() == out.numel() * size(); rank r receives the sum of chunk r.
  Work reduce_scatter_sum(at::Tensor& out, at::Tensor& in, const std::string& what);
  // out.numel() == in.numel() * size(); chunk r of out is rank r's in.
  Work all_gather(at::Tensor& out, at::Tensor& in, const std::string& what);
  Work broadcast(at::Tensor& t, int root, const std::string& what);
  void barrier(const std::string& what);

  Group(c10::intrusive_ptr<c10d::Backend> backend, int rank, int size, GroupOptions opts);
  ~Group();

 private:
  Work wrap(c10::intrusive_ptr<c10d::Work> w, const std::string& what) const;
  void check_device(const at::Tensor& t, const std::string& what) const;
  // Gloo on tensors of a device it cannot read: the collective runs on host copies.
  bool staged() const;

  c10::intrusive_ptr<c10d::Backend> backend_;  // null when size_ == 1
  int rank_;
  int size_;
  GroupOptions opts_;
  std::shared_ptr<Liveness> liveness_;  // set by from_env: heartbeats through the TCP store
  // A collective of this group failed: closing it then aborts instead of flushing.
  std::shared_ptr<std::atomic<bool>> failed_ = std::make_shared<std::atomic<bool>>(false);
};

}  // namespace zero::comm
