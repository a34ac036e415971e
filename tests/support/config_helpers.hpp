// Helpers of the config tests (test_config.cpp, test_config_features.cpp): a config loaded
// with the example trainer's keys, and the message of the error a load throws.
#pragma once

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "zero/config.hpp"

namespace zero::testing {

inline const std::string kSrc = ZERO_SOURCE_DIR;

// The example trainer's keys, as examples/trainer.cpp declares them (a subset).
inline Config::Extension trainer_ext() {
  using T = Config::Extension::Type;
  Config::Extension ext;
  ext.section = "trainer";
  ext.keys = {{"model", T::kString, "small", ""},
              {"steps", T::kInt, "100", ""},
              {"seq_len", T::kInt, "64", ""},
              {"data", T::kString, "synthetic", ""}};
  return ext;
}

// The message of the ConfigError `f` throws; fails the test if it throws nothing.
template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const ConfigError& e) {
    return e.what();
  }
  ADD_FAILURE() << "no ConfigError thrown";
  return "";
}

inline std::string load_error(const std::string& yaml, const std::vector<std::string>& sets = {}) {
  const auto ext = trainer_ext();
  return error_of([&] { Config::from_string(yaml, "t.yaml", sets, &ext); });
}

inline Config load(const std::string& yaml, const std::vector<std::string>& sets = {}) {
  const auto ext = trainer_ext();
  return Config::from_string(yaml, "t.yaml", sets, &ext);
}

}  // namespace zero::testing

#define EXPECT_HAS(msg, part) EXPECT_NE((msg).find(part), std::string::npos) << (msg)
