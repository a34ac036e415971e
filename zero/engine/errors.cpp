#include "zero/errors.hpp"

#include <c10/util/Exception.h>

#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <string>

namespace zero {

std::string error_message(const std::exception& e) {
  // c10::Error carries a C++ backtrace after the message: the first part is the useful one.
  if (const auto* ce = dynamic_cast<const c10::Error*>(&e)) return ce->what_without_backtrace();
  return e.what();
}

int run_main(const char* program, const std::function<int()>& body) {
  try {
    return body();
  } catch (const std::exception& e) {
    const char* rank = std::getenv("RANK");
    // The program's prefix replaces the library's own "zero: ": one prefix per line.
    std::string msg = error_message(e);
    if (msg.rfind("zero: ", 0) == 0) msg.erase(0, 6);
    std::fprintf(stderr, "%s%s%s: error: %s\n", program, rank ? " rank " : "", rank ? rank : "",
                 msg.c_str());
    if (dynamic_cast<const StartupTimeout*>(&e) != nullptr) {
      // A c10d call is still blocked on a helper thread: static destructors must not run
      // under it.
      std::cout.flush();
      std::fflush(nullptr);
      std::_Exit(1);
    }
    return 1;
  }
}

}  // namespace zero
