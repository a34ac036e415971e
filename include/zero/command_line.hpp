// The config options of a command line, read as zero-train reads them, for a program of one's
// own:
//
//   --config FILE      (or --config=FILE) a YAML or DeepSpeed JSON config
//   --set KEY=VALUE    (or --set=KEY=VALUE) any number, applied in order over the file's keys,
//                      checked like them (Config::from_file's overrides)
//
//   int main(int argc, char** argv) {
//     return zero::run_main("train", [&] {
//       zero::Config cfg = zero::config_from_args(argc, argv);  // argv keeps the other options
//       ...
//     });
//   }
#pragma once

#include <string>
#include <vector>

#include "zero/config.hpp"

namespace zero {

struct ConfigArgs {
  std::string config_path;             // "" when no --config was given
  std::vector<std::string> overrides;  // "KEY=VALUE", in command-line order
};

// Takes --config and --set out of argv (argc shrinks; the other arguments keep their order, so
// the program parses them after). Throws ConfigError naming the option for --config or --set
// without a value, a --set value without '=', or --config given twice.
ConfigArgs take_config_args(int& argc, char** argv);

// Config::from_file(config_path, overrides) of take_config_args(argc, argv); ConfigError when
// no --config was given.
Config config_from_args(int& argc, char** argv);

}  // namespace zero
