#include "comm/liveness.hpp"

#include <unistd.h>

#include <c10/util/Exception.h>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <mutex>
#include <optional>
#include <sstream>
#include <thread>
#include <vector>

namespace zero::comm {
namespace {

using Clock = std::chrono::steady_clock;
constexpr auto kBeat = std::chrono::milliseconds(500);
// A heartbeat older than this means the rank is gone: six beats, so a busy machine that delays
// a thread by a second or two does not get a live rank blamed.
constexpr auto kStale = std::chrono::milliseconds(3000);

std::atomic<int> g_parent{0};

std::string key(int rank) { return "alive/" + std::to_string(rank); }

std::vector<uint8_t> bytes(const std::string& s) { return {s.begin(), s.end()}; }

std::string short_message(const std::exception& e) {
  std::string m = e.what();
  if (const auto* c = dynamic_cast<const c10::Error*>(&e)) m = c->what_without_backtrace();
  const auto nl = m.find('\n');
  return nl == std::string::npos ? m : m.substr(0, nl);
}

}  // namespace

struct Liveness::State {
  c10::intrusive_ptr<c10d::Store> store;
  std::string owner;
  int rank = 0;
  int size = 1;

  std::mutex mu;
  std::condition_variable cv;
  bool stop = false;
  bool running = false;  // the heartbeat thread was started
  bool exited = false;
  bool watching = false;
  bool failed_here = false;  // this rank saw a failure: its heartbeat says so
  int64_t beats = 0;
  // Per peer: the last heartbeat value seen, when it last changed, whether it reports a failure.
  std::vector<std::string> last;
  std::vector<Clock::time_point> changed;
  std::vector<bool> failed;
  std::string store_error;                   // the store stopped answering
  Clock::time_point last_ok = Clock::now();  // the last round trip to the store that finished

  void loop();
  void beat();
};

void Liveness::State::beat() {
  std::string value;
  bool watch = false;
  {
    std::lock_guard<std::mutex> lock(mu);
    value = std::to_string(++beats) + (failed_here ? " failed" : "");
    watch = watching;
  }
  store->set(key(rank), bytes(value));
  if (!watch) return;
  std::vector<std::string> keys;
  for (int r = 0; r < size; ++r) keys.push_back(key(r));
  const auto values = store->multiGet(keys);
  const auto now = Clock::now();
  std::lock_guard<std::mutex> lock(mu);
  last_ok = now;
  for (int r = 0; r < size; ++r) {
    std::string v(values[r].begin(), values[r].end());
    if (v != last[r]) {
      last[r] = v;
      changed[r] = now;
    }
    failed[r] = v.find(" failed") != std::string::npos;
  }
  cv.notify_all();
}

void Liveness::State::loop() {
  std::unique_lock<std::mutex> lock(mu);
  while (!stop) {
    if (store_error.empty()) {
      lock.unlock();
      try {
        beat();
      } catch (const std::exception& e) {
        std::lock_guard<std::mutex> l(mu);
        store_error = short_message(e);
        cv.notify_all();
      }
      lock.lock();
    }
    cv.wait_for(lock, kBeat, [&] { return stop; });
  }
  exited = true;
  cv.notify_all();
}

Liveness::Liveness(c10::intrusive_ptr<c10d::Store> store, int rank, int size,
                   std::string store_owner)
    : state_(std::make_shared<State>()), rank_(rank), size_(size) {
  state_->store = std::move(store);
  state_->owner = std::move(store_owner);
  state_->rank = rank;
  state_->size = size;
  state_->last.assign(size, "");
  state_->changed.assign(size, Clock::now());
  state_->failed.assign(size, false);
}

Liveness::~Liveness() {
  std::unique_lock<std::mutex> lock(state_->mu);
  state_->stop = true;
  state_->cv.notify_all();
  // A store that stopped answering can keep the thread in a socket read; it holds its own
  // reference to the state, so it is left to finish (or die with the process) on its own.
  state_->cv.wait_for(lock, std::chrono::seconds(2),
                      [&] { return !state_->running || state_->exited; });
}

void Liveness::announce() {
  state_->store->set(key(rank_), bytes("0"));
  {
    std::lock_guard<std::mutex> lock(state_->mu);
    state_->running = true;
  }
  std::thread([s = state_] { s->loop(); }).detach();
}

bool Liveness::arrived(int peer) { return state_->store->check({key(peer)}); }

void Liveness::watch_peers() {
  std::lock_guard<std::mutex> lock(state_->mu);
  state_->changed.assign(size_, Clock::now());
  state_->last_ok = Clock::now();
  state_->watching = true;
}

std::string Liveness::gone_now() {
  State& s = *state_;
  std::lock_guard<std::mutex> lock(s.mu);
  if (!s.watching) return "";
  const auto now = Clock::now();
  if (!s.store_error.empty())
    return "the rendezvous store served by " + s.owner + " stopped answering (" + s.store_error +
           "): " + s.owner + " is gone";
  if (now - s.last_ok >= kStale) return "";  // this rank's own view is stale: no verdict
  std::string out;
  for (int r = 0; r < size_; ++r) {
    if (r == rank_ || s.failed[r] || now - s.changed[r] < kStale) continue;
    char buf[160];
    std::snprintf(buf, sizeof buf,
                  "%srank %d is gone (no heartbeat for %.1f s: killed, crashed or stopped)",
                  out.empty() ? "" : "; ", r,
                  std::chrono::duration<double>(now - s.changed[r]).count());
    out += buf;
  }
  return out;
}

std::string Liveness::diagnose(std::chrono::milliseconds max_wait) {
  State& s = *state_;
  std::unique_lock<std::mutex> lock(s.mu);
  s.failed_here = true;
  s.cv.notify_all();
  if (!s.watching) return "";
  // Gone: a peer whose heartbeat is stale and that reported no failure of its own.
  // Heartbeats only count while this rank's own view of the store is fresh.
  auto store_silent = [&] { return Clock::now() - s.last_ok >= kStale; };
  auto gone = [&] {
    std::vector<int> g;
    const auto now = Clock::now();
    if (now - s.last_ok >= kStale) return g;
    for (int r = 0; r < size_; ++r) {
      if (r != rank_ && !s.failed[r] && now - s.changed[r] >= kStale) g.push_back(r);
    }
    return g;
  };
  s.cv.wait_for(lock, max_wait,
                [&] { return !gone().empty() || !s.store_error.empty() || store_silent(); });
  const auto now = Clock::now();
  std::string out;
  for (int r : gone()) {
    char buf[160];
    std::snprintf(
        buf, sizeof buf, "%srank %d is gone (no heartbeat for %.1f s: killed, crashed or stopped)",
        out.empty() ? "" : "; ", r, std::chrono::duration<double>(now - s.changed[r]).count());
    out += buf;
  }
  if (!s.store_error.empty()) {
    out += (out.empty() ? "" : "; ") + std::string("the rendezvous store served by ") + s.owner +
           " stopped answering (" + s.store_error + "): " + s.owner + " is gone";
  }
  if (s.store_error.empty() && store_silent()) {
    char buf[64];
    std::snprintf(buf, sizeof buf, " for %.1f s",
                  std::chrono::duration<double>(now - s.last_ok).count());
    out += (out.empty() ? "" : "; ") + std::string("the rendezvous store served by ") + s.owner +
           " does not answer" + buf + ": " + s.owner + " is stopped or gone";
  }
  if (out.empty()) {
    out = "every other rank still answers the store";
    std::string failed;
    for (int r = 0; r < size_; ++r) {
      if (r != rank_ && s.failed[r]) failed += (failed.empty() ? "" : ", ") + std::to_string(r);
    }
    out += failed.empty() ? " (a stall inside the collective, or the network between ranks)"
                          : ", ranks that saw the failure too: " + failed;
  }
  return out;
}

namespace {

struct ProcStat {
  int ppid = 0;
  char state = '?';
  unsigned long long start = 0;  // clock ticks after boot: tells a reused pid apart
};

// /proc/<pid>/stat; nullopt where there is none (the process is gone, or no /proc).
std::optional<ProcStat> proc_stat(int pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!f || !std::getline(f, line)) return std::nullopt;
  // The command name (field 2) is in parentheses and may hold spaces and ')': the fields
  // after it start after the last ')'.
  const auto close = line.rfind(')');
  if (close == std::string::npos) return std::nullopt;
  std::istringstream rest(line.substr(close + 1));
  ProcStat st;
  std::string field;
  rest >> st.state >> st.ppid;
  for (int i = 5; i <= 21; ++i) rest >> field;  // pgrp .. itrealvalue
  if (!(rest >> st.start)) return std::nullopt;
  return st;
}

// Whether /proc/<pid>/environ (the environment the process started with) holds `entry`
// ("NAME=value"). False where it cannot be read (another user's process).
bool started_with(int pid, const std::string& entry) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/environ", std::ios::binary);
  std::string var;
  while (f && std::getline(f, var, '\0')) {
    if (var == entry) return true;
  }
  return false;
}

std::atomic<int> g_direct_parent{0};
std::atomic<unsigned long long> g_launcher_start{0};

}  // namespace

int find_launcher() {
  const int parent = static_cast<int>(getppid());
  // torchrun hands its workers TORCHELASTIC_RUN_ID, which its own process (the elastic agent)
  // did not start with; a wrapper between the agent and this rank (torchrun --no-python run.sh,
  // the script starting the trainer) inherits it. The launcher is the nearest ancestor that did
  // not start with it: the agent itself, however many wrappers deep.
  const char* run = std::getenv("TORCHELASTIC_RUN_ID");
  if (run == nullptr || *run == '\0') return parent;
  const std::string entry = std::string("TORCHELASTIC_RUN_ID=") + run;
  int pid = parent;
  for (int depth = 0; depth < 64 && pid > 1; ++depth) {
    if (!started_with(pid, entry)) return pid;
    const auto st = proc_stat(pid);
    if (!st) break;
    pid = st->ppid;
  }
  return parent;  // no /proc, or the agent was not found below init: the parent, as before
}

void remember_launcher() {
  int expected = 0;
  const int launcher = find_launcher();
  if (!g_parent.compare_exchange_strong(expected, launcher)) return;
  g_direct_parent.store(static_cast<int>(getppid()));
  if (const auto st = proc_stat(launcher)) g_launcher_start.store(st->start);
}

bool launcher_gone() {
  const int p = g_parent.load();
  if (p == 0) return false;
  // This process was re-parented: its parent (the launcher, or a wrapper under it) exited.
  if (static_cast<int>(getppid()) != g_direct_parent.load()) return true;
  if (p == g_direct_parent.load()) return false;
  // The launcher further up: gone when its pid is, names another process (reused), or is a
  // zombie its own parent has not reaped yet.
  const auto st = proc_stat(p);
  const unsigned long long start = g_launcher_start.load();
  return !st || st->state == 'Z' || st->state == 'X' || (start != 0 && st->start != start);
}

int launcher_pid() { return g_parent.load(); }

}  // namespace zero::comm
