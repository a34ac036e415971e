#include "support/fake_training.hpp"

#include <ATen/ATen.h>

#include "support/fake_device.hpp"

namespace zero::testing {

c10::Device rank_device(const comm::Group& g) { return fake::device(g.rank()); }

std::shared_ptr<TinyNetImpl> net_on(uint64_t seed, c10::Device d) {
  auto net = make_tiny_net(seed);
  net->to(d);
  return net;
}

at::Tensor plain(TinyNetImpl& net, const at::Tensor& x) { return net.forward(x); }

void train_steps(Engine& e, TinyNetImpl& net, int rank, int from, int to, const Forward& forward) {
  const at::Tensor p = net.parameters().front();
  const int ga = static_cast<int>(e.config().gradient_accumulation_steps);
  for (int s = from; s < to; ++s) {
    for (int m = 0; m < ga; ++m) {
      Batch b = rank_micro_batch(global_batch(s, kRows), rank, kWorld, m, ga);
      const at::Tensor x = b.x.to(p.device(), p.scalar_type());
      e.backward(mse(forward(net, x).to(at::kFloat), b.y.to(p.device())));
      e.step();
    }
  }
}

Config training_config(int stage, const std::string& optimizer, bool offload) {
  Config cfg = test_config(stage, kRows / kWorld, 1, /*clip=*/0.3);
  cfg.optimizer.type = optimizer;
  if (optimizer == "SGD") {
    cfg.optimizer.lr = 0.05;
    cfg.optimizer.momentum = 0.9;
    cfg.optimizer.weight_decay = 0.01;
  }
  cfg.zero_optimization.offload_optimizer.enabled = offload;
  cfg.zero_optimization.offload_optimizer.threads = 1;
  return cfg;
}

}  // namespace zero::testing
