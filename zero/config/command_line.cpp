// take_config_args, config_from_args (include/zero/command_line.hpp).
#include "zero/command_line.hpp"

#include <cstring>

namespace zero {

namespace {

const char* const kForm = "the form is --set KEY=VALUE with a dotted key, e.g. --set "
                          "zero_optimization.stage=2";

}  // namespace

ConfigArgs take_config_args(int& argc, char** argv) {
  ConfigArgs out;
  bool have_config = false;
  int kept = argc > 0 ? 1 : 0;  // argv[0], the program
  for (int i = kept; i < argc; ++i) {
    const std::string arg = argv[i];
    std::string option, value;
    bool has_value = false;
    for (const char* name : {"--config", "--set"}) {
      if (arg == name) {
        option = name;
        if (i + 1 < argc) {
          value = argv[++i];
          has_value = true;
        }
      } else if (arg.rfind(std::string(name) + "=", 0) == 0) {
        option = name;
        value = arg.substr(std::strlen(name) + 1);
        has_value = true;
      }
    }
    if (option.empty()) {
      argv[kept++] = argv[i];
      continue;
    }
    if (!has_value || value.empty())
      throw ConfigError(option + " needs a value" +
                        (option == "--set" ? std::string(": ") + kForm
                                           : std::string(": --config FILE (YAML or DeepSpeed "
                                                         "JSON)")));
    if (option == "--config") {
      if (have_config)
        throw ConfigError("--config is given twice ('" + out.config_path + "' and '" + value +
                          "'); give one file and change its keys with --set KEY=VALUE");
      have_config = true;
      out.config_path = value;
    } else {
      if (value.find('=') == std::string::npos)
        throw ConfigError("--set " + value + " has no '='; " + kForm);
      out.overrides.push_back(value);
    }
  }
  argc = kept;
  if (argc >= 0) argv[argc] = nullptr;  // as main's argv ends
  return out;
}

Config config_from_args(int& argc, char** argv) {
  ConfigArgs args = take_config_args(argc, argv);
  if (args.config_path.empty())
    throw ConfigError("no --config FILE on the command line: give the YAML or DeepSpeed JSON "
                      "config to train with (keys changed with --set KEY=VALUE)");
  return Config::from_file(args.config_path, args.overrides);
}

}  // namespace zero
