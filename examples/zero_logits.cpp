// zero-logits: the example GPT's logits for given token sequences, from Hugging Face weights or
// from a zero checkpoint, written as a safetensors file ("logits", fp32 [batch, seq, vocab]).
// What an evaluation needs, and what the transformers round-trip test compares against.
//
//   zero-logits --model hf:DIR [--checkpoint ckpt/ [--tag step20]] --tokens tokens.txt \
//       --out logits.safetensors
// tokens.txt: one sequence per line, token ids separated by spaces, all lines of one length.
#include <ATen/ATen.h>
#include <torch/nn/module.h>
#include <boost/program_options.hpp>

#include <cstdio>
#include <fstream>
#include <iostream>
#include <sstream>

#include "zero/checkpoint_io.hpp"
#include "zero/errors.hpp"
#include "zero/models/gpt.hpp"
#include "zero/models/hf_llama.hpp"

namespace po = boost::program_options;
namespace models = zero::models;

namespace {

at::Tensor read_tokens(const std::string& path) {
  std::ifstream f(path);
  if (!f) throw std::invalid_argument(path + ": cannot open the token file");
  std::vector<std::vector<int64_t>> rows;
  for (std::string line; std::getline(f, line);) {
    std::istringstream is(line);
    std::vector<int64_t> row;
    for (int64_t t; is >> t;) row.push_back(t);
    if (!row.empty()) rows.push_back(std::move(row));
  }
  if (rows.empty()) throw std::invalid_argument(path + ": no token sequences");
  at::Tensor out = at::empty(
      {static_cast<int64_t>(rows.size()), static_cast<int64_t>(rows[0].size())}, at::kLong);
  for (size_t i = 0; i < rows.size(); ++i) {
    if (rows[i].size() != rows[0].size()) {
      throw std::invalid_argument(path + ": line " + std::to_string(i + 1) +
                                  " has another length than line 1");
    }
    for (size_t j = 0; j < rows[i].size(); ++j) out[i][j] = rows[i][j];
  }
  return out;
}

int run(int argc, char** argv) {
  std::string model_spec, ckpt, tag, tokens_path, out;
  po::options_description desc("zero-logits options");
  desc.add_options()("help,h", "show this help")(
      "model", po::value(&model_spec)->required(),
      "hf:DIR (a Hugging Face LLaMA: shape and, without --checkpoint, weights) or a GPT preset")(
      "checkpoint", po::value(&ckpt), "take the weights from this zero checkpoint directory")(
      "tag", po::value(&tag), "checkpoint tag (default: the one DIR/latest names)")(
      "tokens", po::value(&tokens_path)->required(), "token file: one sequence per line")(
      "out", po::value(&out)->required(), "safetensors file to write the logits to");
  po::variables_map vm;
  po::store(po::parse_command_line(argc, argv, desc), vm);
  if (vm.count("help")) {
    std::cout << desc << "\n";
    return 0;
  }
  po::notify(vm);

  const bool hf = model_spec.rfind("hf:", 0) == 0;
  if (!hf && ckpt.empty()) {
    throw std::invalid_argument("--model " + model_spec + " has no weights: give --checkpoint");
  }
  models::Gpt model(hf ? models::hf_llama_config(model_spec.substr(3))
                       : models::gpt_preset(model_spec));
  if (!ckpt.empty()) {
    at::NoGradGuard no_grad;
    auto params = model->named_parameters();
    // A tensor-parallel run's save (ckpt/tp0, tp1, ...) is put together from its blocks.
    std::vector<std::string> dirs = zero::checkpoint_dirs(ckpt, tag);
    if (dirs.empty()) dirs = {ckpt};
    const auto tensors = zero::read_consolidated(dirs, tag);
    if (tensors.size() != params.size()) {
      throw zero::CheckpointError(ckpt + ": " + std::to_string(tensors.size()) +
                                  " parameters, the model has " + std::to_string(params.size()));
    }
    for (const auto& [name, t] : tensors) {
      at::Tensor* p = params.find(name);
      if (!p || p->sizes() != t.sizes()) {
        throw zero::CheckpointError(ckpt + ": parameter '" + name +
                                    "' is not in the model or has another shape");
      }
      p->copy_(t);
    }
  } else {
    models::load_hf_llama(*model, model_spec.substr(3));
  }
  model->eval();
  at::NoGradGuard no_grad;
  const at::Tensor tokens = read_tokens(tokens_path);
  const at::Tensor logits = model->forward(tokens).to(at::kFloat);
  zero::write_safetensors(out, {{"logits", logits}}, at::kFloat, {{"format", "pt"}});
  std::printf("zero-logits: %lld x %lld tokens -> %s\n", (long long)tokens.size(0),
              (long long)tokens.size(1), out.c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return zero::run_main("zero-logits", [&] { return run(argc, argv); });
}
