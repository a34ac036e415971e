// zero's side of bench/ds_parity.py: trains the MLP that ds_parity.py defines, or the example GPT
// loaded from the LlamaForCausalLM it saved, from the initial weights and batches it wrote, with
// the DeepSpeed JSON in the same folder, and writes per-step losses and the final parameters.
// Launch with torch.distributed.run (2 ranks).
//
//   ds-parity-zero DIR [TAG]  (reads DIR/ds_config.json, meta.txt, and init.bin, x.bin, y.bin
//                              (MLP) or hf/, tokens.bin, names.txt (LLaMA); writes
//                              DIR/zero_losses.txt and DIR/zero_params.bin on rank 0)
//
// With TAG (e.g. floor) it reads DIR/TAG_config.json and writes DIR/zero_TAG_*: zero's own floor,
// on fewer ranks than the data has; each rank then takes world / ranks ranks' micro-batches side
// by side (the config's micro-batch must say so). With TAG grads (no launcher, no engine) it
// writes one forward/backward's logits and gradients in fp32 and bf16 (see run_grads).
#include <ATen/ATen.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>

#include <cstdio>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "zero/models/gpt.hpp"
#include "zero/models/hf_llama.hpp"
#include "zero/sharding.hpp"
#include "zero/zero.hpp"

namespace {

// Same layers, names, order and forward as Mlp in bench/ds_parity.py. At ZeRO stage 3 each layer
// is a unit of its own (the s3_* JSONs partition every parameter, as DeepSpeed does with
// stage3_param_persistence_threshold 0); below stage 3 run_unit is the layer's forward.
struct MlpImpl : torch::nn::Module {
  MlpImpl(int64_t in, int64_t hidden, int64_t out) {
    fc1 = register_module("fc1", torch::nn::Linear(in, hidden));
    norm = register_module("norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({hidden})));
    fc2 = register_module("fc2", torch::nn::Linear(hidden, hidden));
    head = register_module("head", torch::nn::Linear(hidden, out));
    zero::shard(*fc1);
    zero::shard(*norm);
    zero::shard(*fc2);
    zero::shard(*head);
  }
  at::Tensor forward(const at::Tensor& x) {
    auto h = zero::run_unit(*fc1, [this](const at::Tensor& t) { return fc1->forward(t); }, x);
    h = at::tanh(zero::run_unit(*norm, [this](const at::Tensor& t) { return norm->forward(t); }, h));
    h = at::tanh(zero::run_unit(*fc2, [this](const at::Tensor& t) { return fc2->forward(t); }, h));
    return zero::run_unit(*head, [this](const at::Tensor& t) { return head->forward(t); }, h);
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

std::string g_tag;  // empty, or the floor run's tag

std::string config_path(const std::string& dir) {
  return dir + (g_tag.empty() ? "/ds_config.json" : "/" + g_tag + "_config.json");
}

// This rank's micro-batch m of step s: its share of the data's ranks, side by side.
at::Tensor share(const at::Tensor& data, int64_t s, int64_t m, int rank, int ranks) {
  const int64_t world = data.size(2), k = world / ranks;
  TORCH_CHECK(k * ranks == world, "ds-parity-zero: ", ranks, " ranks cannot share ", world);
  const at::Tensor t = data[s][m].narrow(0, rank * k, k);
  return t.reshape({-1, t.size(-1)});
}

// `tensors` flattened one after another, as little-endian fp32.
void write_floats(const std::string& path, const std::vector<at::Tensor>& tensors) {
  std::vector<at::Tensor> parts;
  for (const auto& t : tensors) parts.push_back(t.detach().to(at::kFloat).reshape({-1}));
  const at::Tensor flat = at::cat(parts).contiguous();
  std::ofstream f(path, std::ios::binary);
  f.write(reinterpret_cast<const char*>(flat.data_ptr<float>()),
          flat.numel() * static_cast<int64_t>(sizeof(float)));
  if (!f) throw std::runtime_error("ds-parity-zero: cannot write " + path);
}

// The parameters to write, by name in the module's order: the module's own tensors below stage 3;
// at stage 3 (where a unit's parameters are empty between uses) what the engine gathers, in the
// compute dtype, as DeepSpeed's GatheredParameters gives them. A collective at stage 3: every
// rank calls it.
std::vector<std::pair<std::string, at::Tensor>> final_parameters(const zero::Engine& engine,
                                                                 torch::nn::Module& model) {
  if (engine.stage() == 3) return engine.state_dict({.master = false});
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (const auto& item : model.named_parameters()) out.emplace_back(item.key(), item.value());
  return out;
}

void write_results(const std::string& dir, const std::vector<double>& losses,
                   const std::vector<at::Tensor>& params) {
  const std::string out = dir + (g_tag.empty() ? "/zero" : "/zero_" + g_tag);
  std::FILE* f = std::fopen((out + "_losses.txt").c_str(), "w");
  if (!f) throw std::runtime_error("ds-parity-zero: cannot write " + out + "_losses.txt");
  for (double l : losses) std::fprintf(f, "%.17g\n", l);
  std::fclose(f);
  write_floats(out + "_params.bin", params);
}

// The small transformer: the example GPT loaded from DIR/hf, cross-entropy on DIR/tokens.bin
// ([steps, acc, world, micro, seq + 1] int64), parameters written in DIR/names.txt's (HF) order.
int run_llama(const std::string& dir, std::istream& meta) {
  int64_t steps, acc, world, mb, seq, vocab;
  if (!(meta >> steps >> acc >> world >> mb >> seq >> vocab)) {
    throw std::runtime_error("ds-parity-zero: cannot read " + dir + "/meta.txt");
  }
  zero::Config cfg = zero::Config::from_file(config_path(dir));
  auto model = std::make_shared<zero::models::GptImpl>(zero::models::hf_llama_config(dir + "/hf"));
  zero::models::load_hf_llama(*model, dir + "/hf");
  const int64_t n = steps * acc * world * mb * (seq + 1);
  at::Tensor tokens = at::empty({n}, at::kLong);
  {
    std::ifstream f(dir + "/tokens.bin", std::ios::binary);
    f.read(reinterpret_cast<char*>(tokens.data_ptr<int64_t>()), n * 8);
    if (f.gcount() != n * 8) throw std::runtime_error("ds-parity-zero: short tokens.bin");
  }
  tokens = tokens.view({steps, acc, world, mb, seq + 1});
  auto engine = zero::initialize(model, cfg);
  const int rank = engine.rank();
  std::vector<double> losses;
  for (int64_t s = 0; s < steps; ++s) {
    double total = 0;
    for (int64_t m = 0; m < acc; ++m) {
      const at::Tensor t = share(tokens, s, m, rank, engine.world_size());
      at::Tensor loss = model->loss(t.narrow(1, 0, seq), t.narrow(1, 1, seq));
      total += engine.all_reduce_mean(loss.item<double>());
      engine.backward(loss);
      engine.step();
    }
    losses.push_back(total / static_cast<double>(acc));
  }
  const auto final = final_parameters(engine, *model);
  if (rank == 0) {
    std::map<std::string, at::Tensor> by_hf;
    for (const auto& [name, value] : final) by_hf[zero::models::hf_llama_name(name)] = value;
    std::ifstream names(dir + "/names.txt");
    std::vector<at::Tensor> params;
    for (std::string name; names >> name;) {
      auto it = by_hf.find(name);
      if (it == by_hf.end()) throw std::runtime_error("ds-parity-zero: no GPT parameter " + name);
      params.push_back(it->second);
    }
    write_results(dir, losses, params);
  }
  return 0;
}

// One forward and backward of the example GPT, no engine: data rank 0's first micro-batch, in
// fp32 and in bf16 (the model cast as DeepSpeed casts it), for ds_parity.py --grads to compare
// with LlamaForCausalLM's on the same weights. Writes DIR/zero_{logits,grads}_{fp32,bf16}.bin
// (fp32 values; gradients in DIR/names.txt's order).
int run_grads(const std::string& dir) {
  std::ifstream meta(dir + "/meta.txt");
  std::string kind;
  int64_t steps, acc, world, mb, seq, vocab;
  if (!(meta >> kind >> steps >> acc >> world >> mb >> seq >> vocab) || kind != "llama") {
    throw std::runtime_error("ds-parity-zero: " + dir + "/meta.txt is not a llama case");
  }
  at::Tensor tokens = at::empty({mb, seq + 1}, at::kLong);
  std::ifstream f(dir + "/tokens.bin", std::ios::binary);
  f.read(reinterpret_cast<char*>(tokens.data_ptr<int64_t>()), tokens.numel() * 8);
  if (f.gcount() != tokens.numel() * 8)
    throw std::runtime_error("ds-parity-zero: short tokens.bin");
  std::vector<std::string> names;
  std::ifstream nf(dir + "/names.txt");
  for (std::string name; nf >> name;) names.push_back(name);
  for (const auto dtype : {at::kFloat, at::kBFloat16}) {
    zero::models::Gpt model(zero::models::hf_llama_config(dir + "/hf"));
    zero::models::load_hf_llama(*model, dir + "/hf");
    // The RoPE tables are cast too: forward rounds them to the model dtype anyway, as HF does.
    model->to(dtype);
    const at::Tensor logits = model->forward(tokens.narrow(1, 0, seq));
    at::cross_entropy_loss(logits.reshape({-1, vocab}).to(at::kFloat),
                           tokens.narrow(1, 1, seq).reshape({-1}))
        .backward();
    std::map<std::string, at::Tensor> grads;
    for (const auto& item : model->named_parameters()) {
      grads[zero::models::hf_llama_name(item.key())] = item.value().grad();
    }
    std::vector<at::Tensor> parts;
    for (const auto& n : names) parts.push_back(grads.at(n));
    const std::string tag = dtype == at::kFloat ? "fp32" : "bf16";
    write_floats(dir + "/zero_logits_" + tag + ".bin", {logits});
    write_floats(dir + "/zero_grads_" + tag + ".bin", parts);
  }
  return 0;
}

int run(const std::string& dir) {
  if (g_tag == "grads") return run_grads(dir);
  int64_t steps, acc, world, mb, in, hidden, out;
  {
    std::ifstream meta(dir + "/meta.txt");
    std::string first;
    if (!(meta >> first))
      throw std::runtime_error("ds-parity-zero: cannot read " + dir + "/meta.txt");
    if (first == "llama") return run_llama(dir, meta);
    steps = std::stoll(first);
    if (!(meta >> acc >> world >> mb >> in >> hidden >> out)) {
      throw std::runtime_error("ds-parity-zero: cannot read " + dir + "/meta.txt");
    }
  }
  zero::Config cfg = zero::Config::from_file(config_path(dir));
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
      const int ranks = engine.world_size();
      at::Tensor pred = model->forward(share(x, s, m, rank, ranks).to(dtype));
      at::Tensor loss = (pred.to(at::kFloat) - share(y, s, m, rank, ranks)).square().mean();
      total += engine.all_reduce_mean(loss.item<double>());
      engine.backward(loss);
      engine.step();
    }
    losses.push_back(total / static_cast<double>(acc));
  }
  const auto final = final_parameters(engine, *model);
  if (rank == 0) {
    std::vector<at::Tensor> params;
    for (const auto& item : final) params.push_back(item.second);
    write_results(dir, losses, params);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2 && argc != 3) {
    std::cerr << "usage: ds-parity-zero DIR [TAG] (run by bench/ds_parity.py)\n";
    return 2;
  }
  if (argc == 3) g_tag = argv[2];
  try {
    return run(argv[1]);
  } catch (const std::exception& e) {
    std::cerr << e.what() << "\n";
    return 1;
  }
}
