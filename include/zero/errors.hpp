// Every error zero throws on purpose, in one place: catch these by type. Each message is meant to
// be read by the user as it is (it names the key, file, rank or call, and the fix). This header
// depends on nothing of zero's, so every layer includes it, the communication layer at the
// bottom too. Anything else escaping zero is a bug or LibTorch's own error.
#pragma once

#include <functional>
#include <stdexcept>
#include <string>

namespace zero {

// Bad configuration (a key, a value, a combination): names the file, the line and the fix.
class ConfigError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A checkpoint could not be written or read: the message names the file and what to do. Engine
// checkpoint calls raise it on every rank together, never on one rank alone.
class CheckpointError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A collective failed or timed out: the message names this rank, the collective and the likely
// cause (a peer that died or stalled, a rank that did not enter the call), so survivors can exit
// instead of hanging.
class CommError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// The launcher's environment (RANK, WORLD_SIZE, MASTER_ADDR, ...) is missing or inconsistent.
class LaunchError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A start-up step (rendezvous, process-group creation, first barrier) did not finish within
// comm_timeout_s, or the launcher exited meanwhile. A helper thread is still blocked inside c10d
// and cannot be joined, so the process must not run its normal exit: run_main reports the
// message and ends the process with _exit(1).
class StartupTimeout : public LaunchError {
 public:
  using LaunchError::LaunchError;
};

// The message of `e` as a user should see it: c10::Error's C++ backtrace is dropped.
std::string error_message(const std::exception& e);

// The body of a command-line tool's main(): runs `body`, and turns an exception into one line
// "program[ rank R]: error: message" on stderr and exit status 1, on every rank that failed.
int run_main(const char* program, const std::function<int()>& body);

}  // namespace zero
