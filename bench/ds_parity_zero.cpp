// zero's side of bench/ds_parity.py: trains the MLP that ds_parity.py defines, from the initial
// weights and batches it wrote, with the DeepSpeed JSON in the same folder, and writes per-step
// losses and the final parameters. Launch with torch.distributed.run (2 ranks).
//
//   ds-parity-zero DIR    (reads DIR/ds_config.json, meta.txt, init.bin, x.bin, y.bin;
//                          writes DIR/zero_losses.txt and DIR/zero_params.bin on rank 0)
#include <ATen/ATen.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>

#include <cstdio>
#include <fstream>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "zero/zero.hpp"

namespace {

// Same layers, names, order and forward as Mlp in bench/ds_parity.py.
struct MlpImpl : torch::nn::Module {
  MlpImpl(int64_t in, int64_t hidden, int64_t out) {
    fc1 = register_module("fc1", torch::nn::Linear(in, hidden));
    norm = register_module("norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({hidden})));
    fc2 = register_module("fc2", torch::nn::Linear(hidden, hidden));
    head = register_module("head", torch::nn::Linear(hidden, out));
  }
  at::Tensor forward(const at::Tensor& x) {
    auto h = at::tanh(norm->forward(fc1->forward(x)));
    h = at::tanh(fc2->forward(h));
    return head->forward(h);
  }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr}, head{nullptr};
  torch::nn::LayerNorm norm{nullptr};
};

at::Tensor read_floats(const std::string& path, int64_t n) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw std::runtime_error("ds-parity-zero: cannot read " + path);
  at::Tensor t = at::empty({n}, at::kFloat);
  f.read(reinterpret_cast<char*>(t.data_ptr<float>()), n * static_cast<int64_t>(sizeof(float)));
  if (f.gcount() != n * static_cast<int64_t>(sizeof(float))) {
    throw std::runtime_error("ds-parity-zero: " + path + " is shorter than expected");
  }
  return t;
}

int run(const std::string& dir) {
  int64_t steps, acc, world, mb, in, hidden, out;
  {
    std::ifstream meta(dir + "/meta.txt");
    if (!(meta >> steps >> acc >> world >> mb >> in >> hidden >> out)) {
      throw std::runtime_error("ds-parity-zero: cannot read " + dir + "/meta.txt");
    }
  }
  zero::Config cfg = zero::Config::from_file(dir + "/ds_config.json");
  auto model = std::make_shared<MlpImpl>(in, hidden, out);
  {
    at::NoGradGuard g;
    int64_t n = 0;
    for (auto& p : model->parameters()) n += p.numel();
    at::Tensor flat = read_floats(dir + "/init.bin", n);
    int64_t off = 0;
    for (auto& p : model->parameters()) {
      p.copy_(flat.narrow(0, off, p.numel()).view(p.sizes()));
      off += p.numel();
    }
  }
  const at::Tensor x =
      read_floats(dir + "/x.bin", steps * acc * world * mb * in).view({steps, acc, world, mb, in});
  const at::Tensor y = read_floats(dir + "/y.bin", steps * acc * world * mb * out)
                           .view({steps, acc, world, mb, out});
  auto engine = zero::initialize(model, cfg);
  const int rank = engine.rank();
  const at::ScalarType dtype = model->parameters()[0].scalar_type();
  std::vector<double> losses;
  for (int64_t s = 0; s < steps; ++s) {
    double total = 0;
    for (int64_t m = 0; m < acc; ++m) {
      at::Tensor pred = model->forward(x[s][m][rank].to(dtype));
      at::Tensor loss = (pred.to(at::kFloat) - y[s][m][rank]).square().mean();
      total += engine.all_reduce_mean(loss.item<double>());
      engine.backward(loss);
      engine.step();
    }
    losses.push_back(total / static_cast<double>(acc));
  }
  if (rank == 0) {
    std::FILE* f = std::fopen((dir + "/zero_losses.txt").c_str(), "w");
    for (double l : losses) std::fprintf(f, "%.17g\n", l);
    std::fclose(f);
    std::vector<at::Tensor> parts;
    for (auto& p : model->parameters()) parts.push_back(p.detach().to(at::kFloat).reshape({-1}));
    const at::Tensor flat = at::cat(parts).contiguous();
    std::ofstream pf(dir + "/zero_params.bin", std::ios::binary);
    pf.write(reinterpret_cast<const char*>(flat.data_ptr<float>()),
             flat.numel() * static_cast<int64_t>(sizeof(float)));
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::cerr << "usage: ds-parity-zero DIR (run by bench/ds_parity.py)\n";
    return 2;
  }
  try {
    return run(argv[1]);
  } catch (const std::exception& e) {
    std::cerr << e.what() << "\n";
    return 1;
  }
}
