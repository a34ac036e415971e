#include "zero/errors.hpp"

#include <c10/util/Exception.h>

#include <cstdio>
#include <cstdlib>

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
    std::fprintf(stderr, "%s%s%s: error: %s\n", program, rank ? " rank " : "", rank ? rank : "",
                 error_message(e).c_str());
    return 1;
  }
}

}  // namespace zero
