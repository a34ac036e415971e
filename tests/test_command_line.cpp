// The public parser of --config and --set (zero/command_line.hpp): the options taken out of argv
// in order and the rest left for the program, the config read with the overrides applied as
// Config::from_file applies them, and each malformed option refused naming it and the form.
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "zero/command_line.hpp"

namespace zero {
namespace {

namespace fs = std::filesystem;

// A mutable argv as main gets it (null-terminated).
struct Argv {
  explicit Argv(std::vector<std::string> args) : strings(std::move(args)) {
    for (auto& s : strings) ptrs.push_back(s.data());
    ptrs.push_back(nullptr);
    argc = static_cast<int>(strings.size());
  }
  std::vector<std::string> rest() const { return {ptrs.begin(), ptrs.begin() + argc}; }
  std::vector<std::string> strings;
  std::vector<char*> ptrs;
  int argc;
};

std::string error_of(std::vector<std::string> args) {
  Argv a(std::move(args));
  try {
    take_config_args(a.argc, a.ptrs.data());
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

TEST(CommandLine, TakesConfigAndSetsLeavingTheRest) {
  Argv a({"train", "--steps", "10", "--config", "c.yaml", "--set", "optimizer.lr=0.1",
          "--set=zero_optimization.stage=2", "--verbose"});
  const ConfigArgs c = take_config_args(a.argc, a.ptrs.data());
  EXPECT_EQ(c.config_path, "c.yaml");
  EXPECT_EQ(c.overrides, (std::vector<std::string>{"optimizer.lr=0.1", "zero_optimization.stage=2"}));
  EXPECT_EQ(a.rest(), (std::vector<std::string>{"train", "--steps", "10", "--verbose"}));
  EXPECT_EQ(a.ptrs[a.argc], nullptr);
}

TEST(CommandLine, MalformedOptionsAreNamed) {
  EXPECT_NE(error_of({"t", "--set"}).find("--set needs a value: the form is --set KEY=VALUE"),
            std::string::npos);
  EXPECT_NE(error_of({"t", "--set", "optimizer.lr"}).find("--set optimizer.lr has no '='"),
            std::string::npos);
  EXPECT_NE(error_of({"t", "--config"}).find("--config needs a value"), std::string::npos);
  EXPECT_NE(error_of({"t", "--config", "a.yaml", "--config=b.yaml"})
                .find("--config is given twice ('a.yaml' and 'b.yaml')"),
            std::string::npos);
}

TEST(CommandLine, ConfigFromArgsAppliesTheOverridesLikeFromFile) {
  const fs::path file = fs::temp_directory_path() / ("zero_cli_" + std::to_string(::getpid()) + ".yaml");
  std::ofstream(file) << "zero_optimization: {stage: 1}\noptimizer: {type: AdamW, params: {lr: 0.001}}\n";
  Argv a({"t", "--config", file.string(), "--set", "zero_optimization.stage=2", "--set",
          "optimizer.params.lr=0.5"});
  const Config cfg = config_from_args(a.argc, a.ptrs.data());
  const Config want = Config::from_file(file.string(), {"zero_optimization.stage=2", "optimizer.params.lr=0.5"});
  EXPECT_EQ(cfg.zero_optimization.stage, 2);
  EXPECT_EQ(cfg.optimizer.lr, 0.5);
  EXPECT_EQ(want.zero_optimization.stage, cfg.zero_optimization.stage);
  EXPECT_EQ(want.optimizer.lr, cfg.optimizer.lr);
  EXPECT_EQ(a.argc, 1);
  // A key the schema does not know is refused as from_file refuses it, naming it.
  Argv bad({"t", "--config", file.string(), "--set", "zero_optimizaton.stage=2"});
  try {
    config_from_args(bad.argc, bad.ptrs.data());
    ADD_FAILURE() << "an unknown key was accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("zero_optimizaton"), std::string::npos) << e.what();
  }
  Argv none({"t"});
  EXPECT_THROW(config_from_args(none.argc, none.ptrs.data()), ConfigError);
  fs::remove(file);
}

}  // namespace
}  // namespace zero
