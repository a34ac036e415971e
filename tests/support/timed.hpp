// How a call ended and how long it took: the tests that a collective fails fast (a rank that
// did not enter it is named within seconds) time each rank's call.
#pragma once

#include <chrono>
#include <exception>
#include <functional>
#include <string>

namespace zero::testing {

struct Outcome {
  std::string error;  // "" = returned
  double seconds = 0;
};

inline Outcome timed(const std::function<void()>& fn) {
  Outcome o;
  const auto t0 = std::chrono::steady_clock::now();
  try {
    fn();
  } catch (const std::exception& e) {
    o.error = e.what();
  }
  o.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return o;
}

}  // namespace zero::testing
