// A process group: the few collectives the engine needs, point-to-point send/recv for pipeline
// stages, and split() into subgroups (tensor, data, pipeline parallel; see comm/mesh.hpp).
//
// comm::Group is an interface, so a test can script a fake group; the real one is C10dGroup
// (comm/c10d_group.hpp), a c10d backend (gloo on CPU, NCCL on CUDA) over a rendezvous store.
// Every operation is asynchronous and returns a Work; Work::wait() rethrows a backend failure as
// zero::CommError naming this rank, the operation (and for send/recv the peer) and the timeout,
// so a dead or stalled peer ends the run with a message instead of a hang. A group of size 1 has
// no backend and no network: its collectives complete at once (reduce-scatter and all-gather
// copy).
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/intrusive_ptr.h>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "zero/group.hpp"

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
  // copies: each operation copies its input to the host, and wait() copies the result back.
  c10::DeviceType device = c10::DeviceType::CPU;
};

class Work {
 public:
  Work() = default;  // already complete
  // `who` names this rank in errors ("rank 0 of 2", "rank 1 of 2 in group tp (global rank 3)").
  Work(c10::intrusive_ptr<c10d::Work> work, std::string what, std::string who,
       std::chrono::milliseconds timeout, c10::DeviceType device,
       std::shared_ptr<Liveness> liveness = nullptr,
       std::shared_ptr<std::atomic<bool>> failed = nullptr);
  // Pending until wait() runs `wait_fn` once: what a fake group returns to complete an operation
  // when the test decides (scripted arrival orders).
  explicit Work(std::function<void()> wait_fn);
  // Runs `then` once the operation finished (the copy of a host-staged result to its device).
  Work& then(std::function<void()> f);
  // CPU (gloo): blocks until the operation finished, at most comm_timeout. CUDA (NCCL): makes
  // the current stream wait for it and returns without blocking the host; the group's watchdog
  // enforces comm_timeout (comm/backend.hpp says why).
  void wait();
  bool pending() const { return static_cast<bool>(work_) || static_cast<bool>(wait_fn_); }
  // Keeps `t` alive until the operation completed, whether or not wait() runs: the owner of a
  // view the operation got from unowned_view (comm/unowned_view.hpp). A c10d gloo work releases
  // it on its own thread as it completes, before wait() returns; any other Work keeps it until
  // it is waited on or destroyed.
  Work& hold(at::Tensor t);

 private:
  c10::intrusive_ptr<c10d::Work> work_;
  std::function<void()> wait_fn_;
  std::string what_;
  std::string who_;
  std::chrono::milliseconds timeout_{0};
  c10::DeviceType device_ = c10::DeviceType::CPU;
  std::shared_ptr<Liveness> liveness_;         // names the gone rank after a failure; may be null
  std::shared_ptr<std::atomic<bool>> failed_;  // the group's: set when this wait fails
  std::function<void()> then_;
  std::vector<at::Tensor> held_;
};

class Group : public zero::Group {
 public:
  // From the launcher's environment (torchrun, Open MPI, Slurm); world size 1 needs nothing.
  static std::shared_ptr<Group> from_env(const GroupOptions& opts);
  // Size 1: every collective is a local no-op.
  static std::shared_ptr<Group> single(const GroupOptions& opts = {});
  // Over an existing store (tests run N ranks as N threads over one HashStore).
  static std::shared_ptr<Group> over_store(const c10::intrusive_ptr<c10d::Store>& store, int rank,
                                           int size, const GroupOptions& opts);

  ~Group() override = default;

  virtual const GroupOptions& options() const = 0;
  // What the backend and the store it keeps were built with, for tests: both must be
  // comm_timeout_s, not what was left of start-up. 0 where unknown (size 1; NCCL's store; fakes).
  struct Timeouts {
    std::chrono::milliseconds backend{0}, store{0};
  };
  virtual Timeouts timeouts() const { return {}; }
  // The device the backend is bound to (an NCCL group: LOCAL_RANK's GPU, see nccl.cpp), whose
  // collectives run there whatever device a tensor is on; nullopt when it is bound to none.
  virtual std::optional<c10::Device> bound_device() const { return std::nullopt; }

  // `what` names the call in errors ("reduce_scatter of bucket 3").
  virtual Work all_reduce_sum(at::Tensor& t, const std::string& what) = 0;
  // in.numel() == out.numel() * size(); rank r receives the sum of chunk r.
  virtual Work reduce_scatter_sum(at::Tensor& out, at::Tensor& in, const std::string& what) = 0;
  // out.numel() == in.numel() * size(); chunk r of out is rank r's in.
  virtual Work all_gather(at::Tensor& out, at::Tensor& in, const std::string& what) = 0;
  // Equal-split all-to-all: in.numel() == out.numel(), both a multiple of size(); chunk s of
  // rank r's `in` becomes chunk r of rank s's `out` (compressed gradient reduction: each rank
  // sends every other rank only the blocks of that rank's shard, zero/compress/).
  virtual Work all_to_all(at::Tensor& out, at::Tensor& in, const std::string& what) = 0;
  virtual Work broadcast(at::Tensor& t, int root, const std::string& what) = 0;
  virtual void barrier(const std::string& what) = 0;

  // Point to point, ranks of this group. Sends and receives between two ranks with the same tag
  // match in the order they were posted. `t` must stay alive and untouched until the Work was
  // waited on; a receive whose sender never sends fails after comm_timeout_s naming the peer.
  virtual Work send(at::Tensor& t, int dst, const std::string& what, int tag = 0) = 0;
  virtual Work recv(at::Tensor& t, int src, const std::string& what, int tag = 0) = 0;

  // Eager connection. NCCL creates a group's communicator at its first collective and a pair's
  // point-to-point channel at its first message: lazily, in the middle of step 1 with kernels in
  // flight, each rank reaching them in its own order (NCCL's maintainers warn that this can
  // deadlock). So every group is connected as it is made (from_env, over_store and split call
  // connect() before they return: in the order the ranks make their groups, which split already
  // requires to be the same everywhere), and whoever will send point to point connects its pairs
  // at construction in one global order (the pipeline runtime).
  //
  // connect(): a collective over the group. NCCL: the bound device's communicator
  // (ProcessGroupNCCL::eagerConnectSingleDevice, what init_process_group(device_id=) does), then
  // one one-element all-reduce; gloo, which connects every pair when it is built: the
  // all-reduce, so a rank that never gets here fails now, not in step 1. No-op for a group of
  // one or without a backend of its own.
  virtual void connect(const std::string& what) { (void)what; }
  // Whether connect() completed (true for a group of one or without a backend).
  virtual bool connected() const { return true; }
  // This rank and `peer` call it together, `sender` true on the side whose messages will go to
  // the other: one one-element message that way (NCCL: the pair's channel is made now).
  virtual void connect_peer(int peer, bool sender, const std::string& what) {
    (void)peer, (void)sender, (void)what;
  }

  // MPI_Comm_split / MLX's Group::split: every rank of this group calls it (in the same order
  // as its other splits); the ranks that pass the same `color` form a new group, ordered by
  // `key` (ties by their rank here). A negative color takes no part: that rank gets nullptr.
  // `name` names the new group in errors ("tp"); empty: "<this name>/split N color C".
  virtual std::shared_ptr<Group> split(int color, int key, const std::string& name = "") = 0;

 protected:
  Group() = default;
};

// The interface behind a public handle (every zero::Group is a comm::Group).
inline Group& of(zero::Group& g) { return static_cast<Group&>(g); }
inline std::shared_ptr<Group> of(const std::shared_ptr<zero::Group>& g) {
  return std::static_pointer_cast<Group>(g);
}

}  // namespace zero::comm
