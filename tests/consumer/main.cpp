// An outside program on zero's public API only: ZeRO-2 on a linear regression, then the trained
// weights through Engine::state_dict, and a tensor-parallel column -> row pair over the ranks
// (zero/tensor_parallel.hpp). Exits non-zero unless the loss fell, the ranks agree, the state
// dict holds the model's values and the parallel product equals the full one.
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <torch/nn/modules/linear.h>
#include <zero/tensor_parallel.hpp>
#include <zero/zero.hpp>

#include <cmath>
#include <cstdio>

int main() {
  return zero::run_main("consumer", [] {
    at::manual_seed(0);
    torch::nn::Linear model(8, 1);
    zero::Config cfg;
    cfg.zero_optimization.stage = 2;
    cfg.train_micro_batch_size_per_gpu = 16;
    cfg.gradient_accumulation_steps = 1;
    cfg.optimizer.type = "SGD";
    cfg.optimizer.lr = 0.1;
    auto world = zero::process_group_from_env(cfg, c10::DeviceType::CPU);
    zero::Engine engine = zero::initialize(model.ptr(), cfg, world);
    const int rank = engine.rank();
    // The process group through its public handle (zero/group.hpp, installed).
    const zero::Group& group = engine.group();
    const bool group_ok = group.rank() == rank && group.size() == engine.world_size() &&
                          group.name() == "world" && group.global_rank(rank) == rank;

    const at::Tensor w_true = at::linspace(-1, 1, 8).view({8, 1});
    auto gen = at::make_generator<at::CPUGeneratorImpl>(100 + rank);  // each rank its own data
    double first = 0, last = 0;
    for (int step = 0; step < 40; ++step) {
      const at::Tensor x = at::randn({16, 8}, gen, at::TensorOptions().dtype(at::kFloat));
      const at::Tensor loss = (model->forward(x) - x.matmul(w_true)).square().mean();
      const double mean = engine.all_reduce_mean(loss.item<double>());
      (step == 0 ? first : last) = mean;
      engine.backward(loss);
      engine.step();
    }
    const zero::StateDict sd = engine.state_dict();
    bool ok = sd.size() == 2 && sd[0].first == "weight" && sd[1].first == "bias" &&
              at::equal(sd[0].second, model->weight.detach()) &&
              at::equal(sd[1].second, model->bias.detach());
    // Every rank must hold the same weights: their mean over ranks is their own value.
    const double sum = sd[0].second.sum().item<double>();
    ok = ok && std::abs(engine.all_reduce_mean(sum) - sum) < 1e-9 && last < 0.1 * first && group_ok;

    // Tensor parallelism over every rank: the column layer's output features and the row
    // layer's input features split, one all-reduce; the same as the full two products.
    namespace tp = zero::tensor_parallel;
    const tp::Groups groups = tp::make_groups(world, world->size());
    tp::ColumnParallelLinear col(
        groups.tp, tp::ColumnParallelLinearOptions(8, 4).seed(5).gather_output(false));
    tp::RowParallelLinear row(groups.tp,
                              tp::RowParallelLinearOptions(4, 2).seed(6).input_is_parallel(true));
    auto xgen = at::make_generator<at::CPUGeneratorImpl>(7);  // the same input on every rank
    const at::Tensor x = at::randn({3, 8}, xgen, at::TensorOptions().dtype(at::kFloat));
    const tp::FullLinear fc = tp::init_full_linear(8, 4, true, 5);
    const tp::FullLinear fr = tp::init_full_linear(4, 2, true, 6);
    const at::Tensor want = at::linear(at::linear(x, fc.weight, fc.bias), fr.weight, fr.bias);
    const bool tp_ok = at::allclose(row->forward(col->forward(x)), want, 1e-5, 1e-6);
    ok = ok && tp_ok;
    std::printf("consumer rank %d/%d: ZeRO stage %d, loss %.4g -> %.3g, state_dict %s, %s %s\n",
                rank, engine.world_size(), engine.stage(), first, last, ok ? "ok" : "WRONG",
                groups.describe().c_str(), tp_ok ? "ok" : "WRONG");
    return ok ? 0 : 1;
  });
}
