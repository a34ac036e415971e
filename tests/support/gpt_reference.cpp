#include "support/gpt_reference.hpp"

#include <torch/nn/utils/clip_grad.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>

#include <ATen/CPUGeneratorImpl.h>

#include <memory>

namespace zero::testing {

void set_optimizer(Config& c, RefOpt o) {
  const bool sgd = o == RefOpt::SGD;
  c.optimizer.type = sgd ? "SGD" : "AdamW";
  c.optimizer.lr = sgd ? 0.1 : 1e-2;
  c.optimizer.momentum = sgd ? 0.9 : 0.0;
  c.optimizer.weight_decay = sgd ? 0.0 : 0.1;
}

GptParams draw_weights(const models::GptConfig& c, uint64_t seed) {
  models::Gpt m(c);
  auto gen = at::detail::createCPUGenerator(seed);
  at::NoGradGuard g;
  for (auto& p : m->named_parameters()) p.value().copy_(at::randn(p.value().sizes(), gen) * 0.05);
  return snapshot(m);
}

RefTrained reference_training(const models::GptConfig& c, const GptParams& init,
                              const std::vector<StepBatch>& batches, RefOpt o,
                              const std::vector<int>& groups, const RefSetup& setup) {
  models::Gpt model(c);
  load(model, init);
  std::unique_ptr<torch::optim::Optimizer> opt;
  if (o == RefOpt::SGD)
    opt = std::make_unique<torch::optim::SGD>(model->parameters(),
                                              torch::optim::SGDOptions(0.1).momentum(0.9));
  else
    opt = std::make_unique<torch::optim::AdamW>(
        model->parameters(),
        torch::optim::AdamWOptions(1e-2).weight_decay(0.1).eps(setup.adamw_eps));
  auto params = model->parameters();
  RefTrained out;
  for (size_t step = 0; step < batches.size(); ++step) {
    const auto& b = batches[step];
    const int chunks = setup.global_rows / setup.rows, d = groups[step], m = chunks / d;
    auto in = b.inputs.chunk(chunks, 0);
    auto tg = b.targets.chunk(chunks, 0);
    std::vector<at::Tensor> sum(params.size());
    double loss = 0;
    for (int g = 0; g < d; ++g) {
      for (int i = g * m; i < (g + 1) * m; ++i) {
        at::Tensor l = model->loss(in[i], tg[i]) / m;
        l.backward();
        loss += l.item<double>() / d;
      }
      for (size_t k = 0; k < params.size(); ++k) {
        at::Tensor gk = params[k].grad().clone();
        sum[k] = g == 0 ? gk : sum[k] + gk;
      }
      opt->zero_grad();
    }
    for (size_t k = 0; k < params.size(); ++k) params[k].mutable_grad() = sum[k] / d;
    torch::nn::utils::clip_grad_norm_(params, setup.clip);
    opt->step();
    opt->zero_grad();
    out.losses.push_back(static_cast<float>(loss));
  }
  out.params = snapshot(model);
  return out;
}

}  // namespace zero::testing
