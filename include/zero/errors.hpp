// Errors zero throws on purpose; every message is meant to be read by the user as it is.
#pragma once

#include <functional>
#include <stdexcept>
#include <string>

#include "zero/comm_errors.hpp"

namespace zero {

// The message of `e` as a user should see it: c10::Error's C++ backtrace is dropped.
std::string error_message(const std::exception& e);

// The body of a command-line tool's main(): runs `body`, and turns an exception into one line
// "program[ rank R]: error: message" on stderr and exit status 1, on every rank that failed.
int run_main(const char* program, const std::function<int()>& body);

}  // namespace zero
