#include "comm/group.hpp"

#include <signal.h>

#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <csignal>
#include <sstream>

#include "comm/backend.hpp"
#include "comm/launcher_env.hpp"
#include "zero/comm_errors.hpp"

namespace zero::comm {
namespace {

std::string seconds(std::chrono::milliseconds ms) {
  std::ostringstream os;
  os << ms.count() / 1000.0 << " s";
  return os.str();
}

bool is_loopback(const std::string& addr) {
  return addr == "localhost" || addr.rfind("127.", 0) == 0 || addr == "::1";
}

}  // namespace

Work::Work(c10::intrusive_ptr<c10d::Work> work, std::string what, int rank, int size,
           std::chrono::milliseconds timeout)
    : work_(std::move(work)), what_(std::move(what)), rank_(rank), size_(size), timeout_(timeout) {}

void Work::wait() {
  if (!work_) return;
  auto work = std::move(work_);
  try {
    work->wait(timeout_);
  } catch (const std::exception& e) {
    throw CommError("rank " + std::to_string(rank_) + " of " + std::to_string(size_) + ": " +
                    what_ + " failed: " + e.what() +
                    "\n  A peer rank most likely exited or stalled (check its log above). "
                    "Collectives give up after comm_timeout_s = " +
                    seconds(timeout_) + ".");
  }
}

Group::Group(c10::intrusive_ptr<c10d::Backend> backend, int rank, int size, GroupOptions opts)
    : backend_(std::move(backend)), rank_(rank), size_(size), opts_(opts) {}

Group::~Group() = default;

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

namespace {

// A write to a socket whose peer died raises SIGPIPE, which kills the process before the
// collective can fail with a message naming the rank: rank 0, which serves the store, died
// that way in our kill test. Python ignores SIGPIPE at start-up, so torch never sees it there;
// a C++ program must do the same. A handler the application installed is left alone.
void ignore_sigpipe() {
  struct sigaction current {};
  if (sigaction(SIGPIPE, nullptr, &current) == 0 && current.sa_handler == SIG_DFL) {
    std::signal(SIGPIPE, SIG_IGN);
  }
}

}  // namespace

std::shared_ptr<Group> Group::from_env(const GroupOptions& opts) {
  const LaunchInfo info = read_launch_env();
  if (info.world_size == 1) return single(opts);
  ignore_sigpipe();

  c10d::TCPStoreOptions so;
  so.port = static_cast<uint16_t>(info.master_port);
  // Under torchrun the agent already serves the store on MASTER_PORT.
  so.isServer = info.rank == 0 && !info.agent_store;
  so.numWorkers = info.agent_store ? std::nullopt : std::optional<size_t>(info.world_size);
  so.waitWorkers = false;
  so.timeout = opts.timeout;
  c10::intrusive_ptr<c10d::Store> store;
  try {
    store = c10::make_intrusive<c10d::TCPStore>(info.master_addr, so);
  } catch (const std::exception& e) {
    throw LaunchError("rank " + std::to_string(info.rank) + ": cannot reach the rendezvous at " +
                      "MASTER_ADDR=" + info.master_addr + " MASTER_PORT=" +
                      std::to_string(info.master_port) + " within " + seconds(opts.timeout) + " (" +
                      e.what() + "). Check that rank 0 is running and the address/port are right.");
  }
  // A restarted job reuses the agent's store; a fresh prefix keeps old keys out of the way.
  auto prefixed =
      c10::make_intrusive<c10d::PrefixStore>("zero/" + std::to_string(info.restart_count), store);
  std::string hint = is_loopback(info.master_addr) ? "127.0.0.1" : "";
  try {
    auto backend = opts.device == c10::DeviceType::CUDA
                       ? make_nccl(prefixed, info.rank, info.world_size, opts)
                       : make_gloo(prefixed, info.rank, info.world_size, opts, hint);
    return std::make_shared<Group>(std::move(backend), info.rank, info.world_size, opts);
  } catch (const zero::LaunchError&) {
    throw;
  } catch (const std::exception& e) {
    throw CommError("rank " + std::to_string(info.rank) + " of " + std::to_string(info.world_size) +
                    ": setting up the process group failed: " + e.what() +
                    "\n  Every rank must start within comm_timeout_s = " + seconds(opts.timeout) +
                    "; check that all ranks were launched.");
  }
}

void Group::check_device(const at::Tensor& t, const std::string& what) const {
  TORCH_CHECK(t.device().type() == opts_.device, "zero: ", what, " got a tensor on ", t.device(),
              " but this process group moves ", c10::DeviceTypeName(opts_.device), " tensors");
  TORCH_CHECK(t.is_contiguous(), "zero: ", what, " needs contiguous tensors");
}

Work Group::wrap(c10::intrusive_ptr<c10d::Work> w, const std::string& what) const {
  return Work(std::move(w), what, rank_, size_, opts_.timeout);
}

Work Group::all_reduce_sum(at::Tensor& t, const std::string& what) {
  if (size_ == 1) return {};
  check_device(t, what);
  std::vector<at::Tensor> ts{t};
  c10d::AllreduceOptions o;
  o.reduceOp = c10d::ReduceOp::SUM;
  o.timeout = opts_.timeout;
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
  return wrap(backend_->_allgather_base(out, in, o), what);
}

Work Group::broadcast(at::Tensor& t, int root, const std::string& what) {
  if (size_ == 1) return {};
  check_device(t, what);
  std::vector<at::Tensor> ts{t};
  c10d::BroadcastOptions o;
  o.rootRank = root;
  o.timeout = opts_.timeout;
  return wrap(backend_->broadcast(ts, o), what);
}

void Group::barrier(const std::string& what) {
  if (size_ == 1) return;
  c10d::BarrierOptions o;
  o.timeout = opts_.timeout;
  wrap(backend_->barrier(o), what).wait();
}

}  // namespace zero::comm
