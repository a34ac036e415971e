// zero-train: trains the example GPT with the ZeRO engine, on the built-in synthetic corpus, a
// text file (bytes) or a pre-tokenized uint16 .bin file. The command line is read here; the run
// itself is examples/trainer.hpp's Trainer.
//
//   torchrun --no-python --nproc-per-node 2 build/examples/zero-train \
//       --config configs/zero2.yaml --summary-json out/summary.json
#include <boost/program_options.hpp>

#include <iostream>
#include <string>
#include <vector>

#include "trainer.hpp"
#include "zero/errors.hpp"
#include "zero/zero.hpp"

namespace po = boost::program_options;
using namespace zero;
using namespace zero::examples;

namespace {

int run(int argc, char** argv) {
  po::options_description desc("zero-train options");
  std::string config_path, summary_path;
  std::vector<std::string> sets;
  desc.add_options()("help,h", "show this help")("config", po::value(&config_path)->required(),
                                                 "YAML or DeepSpeed JSON config file")(
      "set", po::value(&sets)->composing(), "override a key: --set zero_optimization.stage=1")(
      "summary-json", po::value(&summary_path), "rank 0 writes a JSON summary here")(
      "device-memory", po::value<std::string>(),
      "per-rank memory budget for \"auto\" values (24GB, 24GiB): sets "
      "zero_optimization.auto_device_memory");
  po::variables_map vm;
  const po::parsed_options parsed = po::command_line_parser(argc, argv).options(desc).run();
  // A word without an option name was a mistake (a missing --set, a stray path): refuse it
  // instead of training with the config it was meant to change.
  for (const auto& o : parsed.options) {
    if (o.position_key >= 0 || o.string_key.empty()) {
      throw ConfigError("unexpected argument '" +
                        (o.original_tokens.empty() ? std::string() : o.original_tokens[0]) +
                        "': every argument is an option (--config FILE, --set key=value, "
                        "--summary-json FILE); see --help");
    }
  }
  po::store(parsed, vm);
  if (vm.count("help")) {
    std::cout << desc << "\n";
    return 0;
  }
  po::notify(vm);
  if (vm.count("device-memory")) {
    sets.push_back("zero_optimization.auto_device_memory=" + vm["device-memory"].as<std::string>());
  }
  Trainer trainer({config_path, summary_path, sets});
  trainer.build();
  trainer.prepare_outputs();
  trainer.resume();
  trainer.train();
  trainer.finish();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return zero::run_main("zero-train", [&] { return run(argc, argv); });
}
