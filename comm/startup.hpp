// Start-up under one deadline.
//
// c10d's start-up calls do not all honour a timeout: a TCPStore client whose peer accepted the
// connection but never answers waits in the handshake forever, and gloo's connect retries for
// several timeouts. So the steps run on a helper thread while the calling thread waits for the
// deadline, and also watches for the launcher's exit. When the deadline passes first, the
// helper is abandoned where it is blocked (c10d offers no way to cancel it) and
// zero::StartupTimeout is thrown; run_main then ends the process with _exit.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <string>

namespace zero::comm {

// What the start-up is waiting for right now, for the message when time runs out.
class StartupStage {
 public:
  void set(std::string what, std::string hint) {
    std::lock_guard<std::mutex> lock(mu_);
    what_ = std::move(what);
    hint_ = std::move(hint);
    explain_ = nullptr;
  }
  // Computed when time runs out (a probe, the heartbeats); replaces the hint unless empty. It
  // runs on the waiting thread, so it must be quick and bounded.
  void set_explainer(std::function<std::string()> f) {
    std::lock_guard<std::mutex> lock(mu_);
    explain_ = std::move(f);
  }
  std::string what() const {
    std::lock_guard<std::mutex> lock(mu_);
    return what_;
  }
  std::string hint() const;

 private:
  mutable std::mutex mu_;
  std::string what_ = "starting";
  std::string hint_;
  std::function<std::string()> explain_;
};

// Runs `body` on a helper thread and returns once it is done (rethrowing what it threw). Throws
// zero::StartupTimeout "<prefix>: <stage> did not finish within <budget>: <hint>" when
// `deadline` passes first, or when the launcher exits meanwhile.
void run_before_deadline(const std::function<void()>& body,
                         std::chrono::steady_clock::time_point deadline,
                         std::chrono::milliseconds budget, const std::string& prefix,
                         const std::shared_ptr<StartupStage>& stage);

// Whether something accepts a TCP connection at host:port within `timeout` (a probe made only
// to explain a start-up that ran out of time: it sends nothing).
bool accepts_connections(const std::string& host, int port, std::chrono::milliseconds timeout);

// While alive, c10d's own log lines (a retry warning with a C++ backtrace per connect attempt)
// are off, unless ZERO_DEBUG is set: start-up failures are reported in one line of ours.
class QuietC10dLog {
 public:
  QuietC10dLog();
  ~QuietC10dLog();
  QuietC10dLog(const QuietC10dLog&) = delete;
  QuietC10dLog& operator=(const QuietC10dLog&) = delete;

 private:
  int saved_;
  bool active_;
};

// Whether ZERO_DEBUG is set to a non-empty value other than 0.
bool debug_enabled();

// "10 s", "2.5 s".
std::string format_seconds(std::chrono::milliseconds ms);

// The first line of a c10d error without its C++ backtrace; the whole text when ZERO_DEBUG is
// set to a non-empty value other than 0.
std::string c10d_message(const std::exception& e);

}  // namespace zero::comm
