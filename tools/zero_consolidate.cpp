// zero-consolidate: one safetensors file with the full model from a sharded checkpoint, read
// straight from the shard files (no process group, any number of ranks wrote it).
//
//   zero-consolidate --checkpoint ckpt/ [--tag step200] --out model.safetensors [--dtype bf16]
#include <ATen/ATen.h>
#include <boost/program_options.hpp>

#include <cstdio>
#include <iostream>

#include "zero/checkpoint_io.hpp"
#include "zero/errors.hpp"

namespace po = boost::program_options;

namespace {

int run(int argc, char** argv) {
  std::string dir, tag, out, dtype = "fp32", state = "master";
  po::options_description desc("zero-consolidate options");
  desc.add_options()("help,h", "show this help")("checkpoint", po::value(&dir)->required(),
                                                 "checkpoint directory (trainer.save_dir)")(
      "tag", po::value(&tag), "checkpoint tag (default: the one DIR/latest names)")(
      "out", po::value(&out)->required(), "safetensors file to write")(
      "dtype", po::value(&dtype)->default_value("fp32"), "fp32 or bf16")(
      "state", po::value(&state)->default_value("master"),
      "master (the parameters) or an optimizer state, e.g. exp_avg");
  po::variables_map vm;
  po::store(po::parse_command_line(argc, argv, desc), vm);
  if (vm.count("help")) {
    std::cout << desc << "\n";
    return 0;
  }
  po::notify(vm);
  if (dtype != "fp32" && dtype != "bf16") {
    throw std::invalid_argument("--dtype must be fp32 or bf16, got '" + dtype + "'");
  }
  const zero::CheckpointInfo info = zero::read_checkpoint_info(dir, tag);
  const auto tensors = zero::read_consolidated(dir, info.tag, state);
  int64_t numel = 0;
  for (const auto& t : tensors) numel += t.second.numel();
  zero::write_safetensors(out, tensors, dtype == "bf16" ? at::kBFloat16 : at::kFloat,
                          {{"format", "pt"},
                           {"zero.tag", info.tag},
                           {"zero.state", state},
                           {"zero.optimizer_steps", std::to_string(info.optimizer_steps)},
                           {"zero.saved_world_size", std::to_string(info.world_size)},
                           {"zero.fingerprint", info.fingerprint}});
  std::printf(
      "zero-consolidate: %s (%s, %d ranks, step %lld): %zu tensors, %lld elements -> %s (%s)\n",
      info.dir.c_str(), state.c_str(), info.world_size, (long long)info.optimizer_steps,
      tensors.size(), (long long)numel, out.c_str(), dtype.c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return zero::run_main("zero-consolidate", [&] { return run(argc, argv); });
}
