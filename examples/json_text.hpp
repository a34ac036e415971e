// The two pieces of JSON text the --summary-json writers (train_summary.cpp, pp_summary.cpp)
// need beyond numbers: a quoted string and a number that may be NaN.
#pragma once

#include <cmath>
#include <ostream>
#include <string>

namespace zero::examples {

// A JSON string literal: the data description may hold a user's path.
inline std::string quoted(const std::string& s) {
  std::string out = "\"";
  for (char ch : s) {
    if (ch == '"' || ch == '\\') out += '\\';
    out += ch;
  }
  return out + "\"";
}

// JSON has no NaN or infinity: a run that trained no step has no loss, which is null.
struct Num {
  double v;
};
inline std::ostream& operator<<(std::ostream& os, Num n) {
  if (std::isfinite(n.v)) return os << n.v;
  return os << "null";
}

}  // namespace zero::examples
