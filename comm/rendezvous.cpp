// Group::from_env: the TCP store, the liveness heartbeat, every rank's arrival, the backend and a
// first barrier, all under one start-up deadline (of comm_timeout_s, counted from the call). Each
// step says what it waits for, so the rank that runs out of time can tell the user what to check.
// The deadline bounds start-up only: the process group and the store it keeps are given the
// whole comm_timeout_s for what comes after (collectives, their watchdog, store waits), never
// what was left of start-up, which for a rank that arrived first can be seconds.
#include <signal.h>

#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <csignal>
#include <cstdlib>
#include <iostream>
#include <thread>

#include "comm/arrivals.hpp"
#include "comm/backend.hpp"
#include "comm/c10d_group.hpp"
#include "comm/group.hpp"
#include "comm/launcher_env.hpp"
#include "comm/liveness.hpp"
#include "comm/startup.hpp"
#include "zero/errors.hpp"

namespace zero::comm {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

bool is_loopback(const std::string& addr) {
  return addr == "localhost" || addr.rfind("127.", 0) == 0 || addr == "::1";
}

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

std::string join(const std::vector<int>& v) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s;
}

// What the helper thread builds; shared because the helper may outlive from_env.
struct Parts {
  c10::intrusive_ptr<c10d::Store> store;
  std::shared_ptr<Liveness> live;
  c10::intrusive_ptr<c10d::Backend> backend;
};

// Rank 0 serves the store: had it exited at once on a WORLD_SIZE mismatch, a rank that had not
// polled since would report "the store stopped answering" instead of the mismatch (1 run in 10
// of e2e.hostile_inputs). So each rank counts itself as told, and rank 0 waits until every rank
// that has arrived so far has been: 3 s at most, and not into the last second before the
// start-up deadline. A store that fails meanwhile changes nothing: the caller names the mismatch.
void tell_of_world_size_mismatch(c10d::Store& store, bool server, Clock::time_point deadline) {
  const std::string told = "told_of_world_size_mismatch";
  try {
    store.add(told, 1);
    if (!server) return;
    const auto until =
        std::min(deadline - std::chrono::seconds(1), Clock::now() + std::chrono::seconds(3));
    while (Clock::now() < until &&
           store.add(told, 0) < parse_arrivals(store.get("arrivals"), 0).entries) {
      std::this_thread::sleep_for(milliseconds(20));
    }
  } catch (const std::exception&) {
  }
}

}  // namespace

std::shared_ptr<Group> Group::from_env(const GroupOptions& opts) {
  const LaunchInfo info = read_launch_env();
  if (info.world_size == 1) {
    // A lone rank under torchrun (its agent sets TORCHELASTIC_RUN_ID) is supervised by it too:
    // if the launcher dies, the rank must notice rather than train on to the end.
    if (std::getenv("TORCHELASTIC_RUN_ID") != nullptr) remember_launcher();
    return single(opts);
  }
  ignore_sigpipe();
  remember_launcher();
  // unsetenv races getenv on other threads (glibc): drop the NCCL blocking-wait variables here,
  // before the heartbeat and helper threads start; make_nccl then finds them gone.
  if (opts.device == c10::DeviceType::CUDA) {
    if (const std::string w = drop_nccl_blocking_wait(); !w.empty() && info.rank == 0) {
      std::cerr << w << "\n";
    }
  }

  const auto deadline = Clock::now() + opts.timeout;
  auto remaining = [deadline] {
    return std::max(milliseconds(1),
                    std::chrono::duration_cast<milliseconds>(deadline - Clock::now()));
  };
  const int rank = info.rank, size = info.world_size;
  const std::string who = "rank " + std::to_string(rank) + " of " + std::to_string(size);
  const std::string port = std::to_string(info.master_port);
  const std::string where = "MASTER_ADDR=" + info.master_addr + " MASTER_PORT=" + port;
  const bool server = rank == 0 && !info.agent_store;
  const std::string owner = info.agent_store ? "the launcher's agent" : "rank 0";
  auto stage = std::make_shared<StartupStage>();
  auto parts = std::make_shared<Parts>();

  auto steps = [=] {
    // 1. The store. A client's connect retries past its timeout, and the handshake after it has
    // none: the outer deadline bounds both, and a probe then tells which it was.
    const std::string at = info.master_addr + ":" + port;
    const std::string foreign =
        "something at " + at +
        " accepted the connection but never answered like a rendezvous store: another program "
        "probably holds port " +
        port + " (check `ss -ltnp 'sport = :" + port +
        "'`); pick a free MASTER_PORT, or correct MASTER_ADDR";
    const std::string nobody =
        "nothing accepts connections at " + at + ": check that " +
        (info.agent_store ? std::string("the launcher is running")
                          : std::string("rank 0 was launched and is running")) +
        ", that MASTER_ADDR is its address and that MASTER_PORT is the same on every rank";
    stage->set(server ? "starting the rendezvous store on MASTER_PORT=" + port
                      : "connecting to the rendezvous store at " + where,
               foreign);
    if (!server) {
      stage->set_explainer([=] {
        return accepts_connections(info.master_addr, info.master_port, milliseconds(500)) ? foreign
                                                                                          : nobody;
      });
    }
    c10d::TCPStoreOptions so;
    so.port = static_cast<uint16_t>(info.master_port);
    so.isServer = server;
    so.numWorkers = info.agent_store ? std::nullopt : std::optional<size_t>(size);
    so.waitWorkers = false;
    so.timeout = remaining();
    c10::intrusive_ptr<c10d::Store> store, beat_store;
    try {
      store = c10::make_intrusive<c10d::TCPStore>(info.master_addr, so);
      // The heartbeat's own connection: the backend's long store waits must not delay it.
      so.isServer = false;
      beat_store = c10::make_intrusive<c10d::TCPStore>(info.master_addr, so);
    } catch (const std::exception& e) {
      const std::string m = c10d_message(e);
      if (server &&
          (m.find("EADDRINUSE") != std::string::npos || m.find("in use") != std::string::npos)) {
        throw LaunchError(who + ": cannot serve the rendezvous store: MASTER_PORT=" + port +
                          " is already in use by another program (check `ss -ltnp 'sport = :" +
                          port + "'`); pick a free MASTER_PORT (" + m + ")");
      }
      throw LaunchError(
          who + ": cannot reach the rendezvous store at " + where + " within " +
          format_seconds(so.timeout) + " (" + m + "): check that " +
          (info.agent_store ? "the launcher is running" : "rank 0 was launched and is running") +
          ", that MASTER_ADDR is its address and MASTER_PORT the same on every rank");
    }
    // A restarted job reuses the agent's store; a fresh prefix keeps old keys out of the way.
    const std::string prefix = "zero/" + std::to_string(info.restart_count);
    parts->store = c10::make_intrusive<c10d::PrefixStore>(prefix, store);
    parts->live = std::make_shared<Liveness>(
        c10::make_intrusive<c10d::PrefixStore>(prefix, beat_store), rank, size, owner);

    // 2. Every rank arrives: each appends its rank to one key, so one read per poll tells which
    // ranks are missing, whatever the world size.
    const std::string waiting = "waiting for every rank to reach the rendezvous at " + where;
    const std::string check_them =
        " launched (and its log), with the same MASTER_ADDR/MASTER_PORT "
        "and WORLD_SIZE=" +
        std::to_string(size);
    stage->set(waiting, "");
    parts->live->announce();
    const std::string mine = arrival_entry(rank, size);
    parts->store->append("arrivals", std::vector<uint8_t>(mine.begin(), mine.end()));
    for (;;) {
      const Arrivals a = parse_arrivals(parts->store->get("arrivals"), size);
      if (!a.other_sizes.empty()) {
        tell_of_world_size_mismatch(*parts->store, server, deadline);
        throw LaunchError(who + ": " + world_size_mismatch(rank, size, a));
      }
      const std::vector<int>& missing = a.missing;
      if (missing.empty()) break;
      stage->set(waiting, "rank" + std::string(missing.size() > 1 ? "s " : " ") + join(missing) +
                              " never arrived: check that " +
                              (missing.size() > 1 ? "they were" : "it was") + check_them);
      // Bounded even if this thread was abandoned: it stops polling after the deadline.
      if (Clock::now() > deadline + std::chrono::seconds(1)) return;
      std::this_thread::sleep_for(milliseconds(100));
    }
    parts->live->watch_peers();

    // 3. The backend's own rendezvous and connections, with what is left of the budget.
    auto live = parts->live;
    stage->set("connecting the process group to every rank",
               "every rank arrived, but not every one connected: check the other ranks' logs; "
               "across machines, check that GLOO_SOCKET_IFNAME (NCCL_SOCKET_IFNAME) names an "
               "interface the others can reach");
    stage->set_explainer([live] {
      const std::string d = live->diagnose(milliseconds(0));
      return d.rfind("every other rank", 0) == 0 ? "" : d;
    });
    // The backend keeps these options for its whole life (NCCL's watchdog times every
    // collective with Options::timeout), and the store keeps its timeout for every later wait:
    // both get comm_timeout_s in full. Creating them still ends at the start-up deadline,
    // which run_before_deadline enforces whatever c10d does meanwhile.
    parts->store->setTimeout(opts.timeout);
    try {
      parts->backend = opts.device == c10::DeviceType::CUDA
                           ? make_nccl(parts->store, rank, size, opts)
                           : make_gloo(parts->store, rank, size, opts,
                                       is_loopback(info.master_addr) ? "127.0.0.1" : "");
    } catch (const zero::LaunchError&) {
      throw;
    } catch (const std::exception& e) {
      const std::string d = live->diagnose(std::min(remaining(), milliseconds(4000)));
      throw CommError(who + ": setting up the process group failed (" + c10d_message(e) +
                      "): " + d + "; every rank must start within comm_timeout_s");
    }

    // 4. A first barrier: every rank got this far. Gloo only: NCCL's barrier runs on the calling
    // thread's current CUDA device, which this helper thread does not share; there the group's
    // connect() on the caller's thread, on the right device and under comm_timeout_s, stands in.
    if (opts.device != c10::DeviceType::CPU) return;
    stage->set("the first barrier across all ranks",
               "a rank connected but did not reach the first barrier: check its log");
    c10d::BarrierOptions bo;
    bo.timeout = remaining();
    try {
      parts->backend->barrier(bo)->wait(bo.timeout);
    } catch (const std::exception& e) {
      const std::string d = live->diagnose(std::min(remaining(), milliseconds(4000)));
      throw CommError(who + ": the first barrier failed (" + c10d_message(e) + "): " + d);
    }
  };
  // A store call that fails outright (its server closed the connection) names the stage too.
  auto body = [=] {
    try {
      steps();
    } catch (const zero::LaunchError&) {
      throw;
    } catch (const zero::CommError&) {
      throw;
    } catch (const std::exception& e) {
      const std::string known = stage->hint();
      throw LaunchError(who + ": " + stage->what() + " failed (" + c10d_message(e) +
                        "): the rendezvous store served by " + owner +
                        " stopped answering: it gave up or is gone; check its log" +
                        (known.empty() ? "" : "; " + known));
    }
  };
  const QuietC10dLog quiet;
  run_before_deadline(body, deadline, opts.timeout, who, stage);
  // The group was built on the helper thread; the caller's current GPU becomes its GPU too.
  if (opts.device == c10::DeviceType::CUDA) nccl_use_bound_device(*parts->backend);
  C10dGroup::Parts g;
  g.backend = parts->backend;
  g.store = parts->store;  // kept for split()
  g.rank = rank;
  g.size = size;
  g.opts = opts;
  g.interface_hint = is_loopback(info.master_addr) ? "127.0.0.1" : "";
  g.liveness = parts->live;
  auto group = std::make_shared<C10dGroup>(std::move(g));
  // NCCL's communicator now, on this (the caller's) thread and its GPU, not at the first
  // collective of step 1 (comm/group.hpp, connect()).
  group->connect("start-up");
  return group;
}

}  // namespace zero::comm
