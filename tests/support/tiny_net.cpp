#include "support/tiny_net.hpp"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <torch/nn/utils/clip_grad.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>

#include <algorithm>

namespace zero::testing {

TinyNetImpl::TinyNetImpl(int in, int hidden, int out) {
  fc1 = register_module("fc1", torch::nn::Linear(in, hidden));
  norm = register_module("norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({hidden})));
  fc2 = register_module("fc2", torch::nn::Linear(hidden, hidden));
  head = register_module("head", torch::nn::Linear(hidden, out));
}

at::Tensor TinyNetImpl::forward(const at::Tensor& x) {
  auto h = at::tanh(norm->forward(fc1->forward(x)));
  h = at::tanh(fc2->forward(h));
  return head->forward(h);
}

std::shared_ptr<TinyNetImpl> make_tiny_net(uint64_t seed) {
  auto net = std::make_shared<TinyNetImpl>();
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  at::NoGradGuard g;
  for (auto& p : net->parameters()) p.copy_(at::randn(p.sizes(), gen) * 0.3);
  return net;
}

Batch global_batch(int64_t step, int64_t rows, uint64_t seed) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed * 1000003 + step);
  at::Tensor x = at::randn({rows, 12}, gen);
  at::Tensor w = at::linspace(-1, 1, 12 * 5).reshape({12, 5});
  at::Tensor y = at::sin(at::matmul(x, w)) + 0.1 * at::randn({rows, 5}, gen);
  return {x, y};
}

Batch rank_micro_batch(const Batch& global, int rank, int world, int micro, int accumulation) {
  const int64_t per = global.x.size(0) / (world * accumulation);
  const int64_t start = (static_cast<int64_t>(micro) * world + rank) * per;
  return {global.x.narrow(0, start, per), global.y.narrow(0, start, per)};
}

at::Tensor mse(const at::Tensor& pred, const at::Tensor& target) {
  return (pred - target).square().mean();
}

at::Tensor flatten(torch::nn::Module& m) {
  std::vector<at::Tensor> parts;
  for (auto& p : m.parameters()) parts.push_back(p.detach().reshape({-1}).to(at::kFloat));
  return at::cat(parts);
}

ReferenceResult train_reference(const Config& cfg, int steps, int64_t global_rows, uint64_t seed) {
  auto net = make_tiny_net(seed);
  return train_reference(cfg, steps, global_rows, *net,
                         [&net](const at::Tensor& x) { return net->forward(x); });
}

ReferenceResult train_reference(const Config& cfg, int steps, int64_t global_rows,
                                torch::nn::Module& m,
                                const std::function<at::Tensor(const at::Tensor&)>& forward) {
  return train_reference(cfg, steps, m, [&](int s) {
    const Batch b = global_batch(s, global_rows);
    return mse(forward(b.x), b.y);
  });
}

ReferenceResult train_reference(const Config& cfg, int steps, torch::nn::Module& m,
                                const std::function<at::Tensor(int)>& loss) {
  torch::nn::Module* net = &m;
  std::vector<at::Tensor> decay, no_decay;
  for (auto& item : net->named_parameters()) {
    const bool excluded =
        std::any_of(cfg.no_weight_decay.begin(), cfg.no_weight_decay.end(),
                    [&](const std::string& s) { return item.key().find(s) != std::string::npos; });
    (excluded ? no_decay : decay).push_back(item.value());
  }
  const auto& o = cfg.optimizer;
  std::unique_ptr<torch::optim::Optimizer> opt;
  if (o.type == "SGD") {
    auto mk = [&](double wd) {
      return std::make_unique<torch::optim::SGDOptions>(torch::optim::SGDOptions(o.lr)
                                                            .momentum(o.momentum)
                                                            .dampening(o.dampening)
                                                            .weight_decay(wd)
                                                            .nesterov(o.nesterov));
    };
    opt = std::make_unique<torch::optim::SGD>(
        std::vector<torch::optim::OptimizerParamGroup>{
            torch::optim::OptimizerParamGroup(decay, mk(o.weight_decay)),
            torch::optim::OptimizerParamGroup(no_decay, mk(0.0))},
        torch::optim::SGDOptions(o.lr));
  } else {
    auto mk = [&](double wd) {
      return std::make_unique<torch::optim::AdamWOptions>(
          torch::optim::AdamWOptions(o.lr).betas({o.beta1, o.beta2}).eps(o.eps).weight_decay(wd));
    };
    opt = std::make_unique<torch::optim::AdamW>(
        std::vector<torch::optim::OptimizerParamGroup>{
            torch::optim::OptimizerParamGroup(decay, mk(o.weight_decay)),
            torch::optim::OptimizerParamGroup(no_decay, mk(0.0))},
        torch::optim::AdamWOptions(o.lr));
  }
  ReferenceResult res;
  for (int s = 0; s < steps; ++s) {
    opt->zero_grad();
    const at::Tensor l = loss(s);
    res.losses.push_back(l.item<double>());
    l.backward();
    double norm = 0;
    for (auto& p : net->parameters()) norm += p.grad().square().sum().item<double>();
    res.grad_norms.push_back(std::sqrt(norm));
    if (cfg.gradient_clipping > 0) {
      torch::nn::utils::clip_grad_norm_(net->parameters(), cfg.gradient_clipping);
    }
    opt->step();
  }
  res.params = flatten(*net);
  return res;
}

Config test_config(int stage, int64_t micro, int accumulation, double clip, int64_t bucket) {
  Config c;
  c.zero_optimization.stage = stage;
  c.zero_optimization.reduce_bucket_size = bucket;
  c.train_micro_batch_size_per_gpu = micro;
  c.gradient_accumulation_steps = accumulation;
  c.gradient_clipping = clip;
  c.optimizer.type = "AdamW";
  c.optimizer.lr = 1e-2;
  c.optimizer.weight_decay = 0.1;
  return c;
}

}  // namespace zero::testing
