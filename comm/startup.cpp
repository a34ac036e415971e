#include "comm/startup.hpp"

#include <c10/util/Exception.h>
#include <c10/util/Logging.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <condition_variable>
#include <cstdlib>
#include <exception>
#include <sstream>
#include <thread>

#include "comm/liveness.hpp"
#include "zero/errors.hpp"

namespace zero::comm {

std::string StartupStage::hint() const {
  std::function<std::string()> explain;
  std::string hint;
  {
    std::lock_guard<std::mutex> lock(mu_);
    explain = explain_;
    hint = hint_;
  }
  if (explain) {
    std::string e = explain();
    if (!e.empty()) return e;
  }
  return hint;
}

std::string format_seconds(std::chrono::milliseconds ms) {
  std::ostringstream os;
  os << static_cast<double>(ms.count()) / 1000.0 << " s";
  return os.str();
}

bool debug_enabled() {
  const char* debug = std::getenv("ZERO_DEBUG");
  return debug != nullptr && *debug != '\0' && std::string(debug) != "0";
}

QuietC10dLog::QuietC10dLog() : saved_(FLAGS_caffe2_log_level), active_(!debug_enabled()) {
  if (active_) FLAGS_caffe2_log_level = 3;  // FATAL only
}

QuietC10dLog::~QuietC10dLog() {
  if (active_) FLAGS_caffe2_log_level = saved_;
}

bool accepts_connections(const std::string& host, int port, std::chrono::milliseconds timeout) {
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found) != 0) return false;
  bool accepted = false;
  for (addrinfo* a = found; a != nullptr && !accepted; a = a->ai_next) {
    const int fd =
        ::socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    if (::connect(fd, a->ai_addr, a->ai_addrlen) == 0) {
      accepted = true;
    } else if (errno == EINPROGRESS) {
      pollfd p{fd, POLLOUT, 0};
      int err = 0;
      socklen_t len = sizeof err;
      accepted = ::poll(&p, 1, static_cast<int>(timeout.count())) == 1 &&
                 ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) == 0 && err == 0;
    }
    ::close(fd);
  }
  ::freeaddrinfo(found);
  return accepted;
}

std::string c10d_message(const std::exception& e) {
  std::string m = e.what();
  if (debug_enabled()) return m;
  if (const auto* c = dynamic_cast<const c10::Error*>(&e)) m = c->what_without_backtrace();
  const auto nl = m.find('\n');
  if (nl != std::string::npos) m = m.substr(0, nl);
  return m;
}

namespace {

struct Outcome {
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  std::exception_ptr error;
};

}  // namespace

void run_before_deadline(const std::function<void()>& body,
                         std::chrono::steady_clock::time_point deadline,
                         std::chrono::milliseconds budget, const std::string& prefix,
                         const std::shared_ptr<StartupStage>& stage) {
  auto outcome = std::make_shared<Outcome>();
  // The helper owns copies of everything it touches: it may outlive this call.
  std::thread([outcome, body] {
    std::exception_ptr error;
    try {
      body();
    } catch (...) {
      error = std::current_exception();
    }
    std::lock_guard<std::mutex> lock(outcome->mu);
    outcome->done = true;
    outcome->error = error;
    outcome->cv.notify_all();
  }).detach();

  auto launcher_left = [&] {
    return prefix + ": the launcher (pid " + std::to_string(launcher_pid()) +
           ") exited while this rank was " + stage->what() +
           "; stopping (check why the launcher ended: its log, or a kill)";
  };
  std::unique_lock<std::mutex> lock(outcome->mu);
  for (;;) {
    // Short waits: the launcher's exit is noticed within a fraction of a second.
    const auto until =
        std::min(deadline, std::chrono::steady_clock::now() + std::chrono::milliseconds(200));
    if (outcome->cv.wait_until(lock, until, [&] { return outcome->done; })) break;
    if (launcher_gone()) throw StartupTimeout(launcher_left());
    if (std::chrono::steady_clock::now() >= deadline) {
      lock.unlock();
      throw StartupTimeout(prefix + ": " + stage->what() +
                           " did not finish within comm_timeout_s = " + format_seconds(budget) +
                           ": " + stage->hint());
    }
  }
  // A peer that left because the launcher died can fail this rank's store calls first: the
  // launcher's exit is the cause worth reporting.
  if (outcome->error && launcher_gone()) throw LaunchError(launcher_left());
  if (outcome->error) std::rethrow_exception(outcome->error);
}

}  // namespace zero::comm
