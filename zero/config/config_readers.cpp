// Value checks the section readers share.
#include <algorithm>
#include <cmath>
#include <iterator>
#include <sstream>
#include <string>
#include <vector>

#include "zero/config/config_sections.hpp"

namespace zero::config_detail {

std::vector<std::string> words(const char* s) {
  std::istringstream in(s);
  return {std::istream_iterator<std::string>(in), std::istream_iterator<std::string>()};
}

Field only_bool(Loader& l, std::string name, bool neutral, std::string why, bool listed) {
  return {std::move(name),
          [&l, neutral, why = std::move(why)](const Entry& e) {
            if (l.boolean(e) != neutral) {
              l.fail(e, "'" + e.path + "' " + why + "; only " + (neutral ? "true" : "false") +
                            " is supported");
            }
          },
          listed};
}

int64_t batch_value(const Loader& l, const Entry& e, Config& c) {
  if (Loader::is_auto(e)) {
    c.auto_batch_keys.push_back(e.path);
    return 0;
  }
  const int64_t v = l.integer(e);
  l.require(e, v >= 1, "a positive integer (or \"auto\" to derive it)");
  return v;
}

double non_negative(const Loader& l, const Entry& e) {
  const double v = l.number(e);
  l.require(e, v >= 0, "a number >= 0");
  return v;
}

double ratio(const Loader& l, const Entry& e) {
  const double v = l.number(e);
  l.require(e, v >= 0 && v <= 1, "a number in [0, 1]");
  return v;
}

int64_t count(const Loader& l, const Entry& e, int64_t lo) {
  const int64_t v = l.integer(e);
  l.require(e, v >= lo, "an integer >= " + std::to_string(lo));
  return v;
}

}  // namespace zero::config_detail
