// An outside program on zero's public API only: ZeRO-2 on a linear regression, then the trained
// weights through Engine::state_dict; a tensor-parallel column -> row pair over the ranks of a
// zero::ParallelDims mesh (zero/parallel_dims.hpp, zero/tensor_parallel.hpp) equal to the full
// product; and that pair trained by initialize(model, cfg, mesh) with clipping. Exits non-zero
// unless the losses fell, the ranks agree, the state dict holds the model's values, the parallel
// product equals the full one and the tensor-parallel engine's norm spans the tp group.
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <torch/nn/modules/linear.h>
#include <zero/tensor_parallel.hpp>
#include <zero/zero.hpp>

#include <cmath>
#include <cstdio>

namespace tp = zero::tensor_parallel;

// A two-layer MLP split over the tensor-parallel group: the hidden features by columns, then
// rows, one all-reduce; the output bias is the same on every tensor-parallel rank.
struct TpMlpImpl : torch::nn::Module {
  TpMlpImpl(std::shared_ptr<zero::Group> group)
      : col(register_module(
            "col", tp::ColumnParallelLinear(
                       group, tp::ColumnParallelLinearOptions(8, 4).seed(5).gather_output(false)))),
        row(register_module("row", tp::RowParallelLinear(group, tp::RowParallelLinearOptions(4, 1)
                                                                     .seed(6)
                                                                     .input_is_parallel(true)))) {}
  at::Tensor forward(const at::Tensor& x) { return row->forward(at::relu(col->forward(x))); }
  tp::ColumnParallelLinear col;
  tp::RowParallelLinear row;
};
TORCH_MODULE(TpMlp);

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
    zero::ParallelDims dims;
    dims.tp = world->size();
    const zero::Mesh mesh = dims.build_mesh(world);
    tp::ColumnParallelLinear col(
        mesh.tp, tp::ColumnParallelLinearOptions(8, 4).seed(5).gather_output(false));
    tp::RowParallelLinear row(mesh.tp,
                              tp::RowParallelLinearOptions(4, 2).seed(6).input_is_parallel(true));
    auto xgen = at::make_generator<at::CPUGeneratorImpl>(7);  // the same input on every rank
    const at::Tensor x = at::randn({3, 8}, xgen, at::TensorOptions().dtype(at::kFloat));
    const tp::FullLinear fc = tp::init_full_linear(8, 4, true, 5);
    const tp::FullLinear fr = tp::init_full_linear(4, 2, true, 6);
    const at::Tensor want = at::linear(at::linear(x, fc.weight, fc.bias), fr.weight, fr.bias);
    const bool tp_ok = at::allclose(row->forward(col->forward(x)), want, 1e-5, 1e-6);
    ok = ok && tp_ok;

    // The split MLP trained through the mesh: ZeRO-1 over mesh.dp, the clipping norm over dp
    // and tp (the row layer's bias, whole on every tp rank, counted once).
    TpMlp mlp(mesh.tp);
    zero::Config tcfg = cfg;
    tcfg.zero_optimization.stage = 1;
    tcfg.gradient_clipping = 1.0;
    tcfg.tensor_parallel.autotp_size = mesh.dims.tp;
    zero::Engine tengine = zero::initialize(mlp, tcfg, mesh);
    const bool norm_ok = tengine.groups().norm.size() == 1 &&
                         tengine.groups().norm[0].replicated ==
                             std::vector<std::string>{"row.bias"};
    auto tgen = at::make_generator<at::CPUGeneratorImpl>(300 + mesh.dp_rank());
    double tfirst = 0, tlast = 0;
    for (int step = 0; step < 60; ++step) {
      const at::Tensor tx = at::randn({16, 8}, tgen, at::TensorOptions().dtype(at::kFloat));
      const at::Tensor loss = (mlp->forward(tx) - tx.matmul(w_true)).square().mean();
      (step == 0 ? tfirst : tlast) = tengine.all_reduce_mean(loss.item<double>());
      tengine.backward(loss);
      tengine.step();
    }
    const bool tp_train_ok = norm_ok && tlast < 0.5 * tfirst;
    ok = ok && tp_train_ok;
    std::printf(
        "consumer rank %d/%d: ZeRO stage %d, loss %.4g -> %.3g, state_dict %s, %s %s; "
        "initialize(model, cfg, mesh) loss %.4g -> %.3g %s\n",
        rank, engine.world_size(), engine.stage(), first, last, ok ? "ok" : "WRONG",
        mesh.describe().c_str(), tp_ok ? "ok" : "WRONG", tfirst, tlast,
        tp_train_ok ? "ok" : "WRONG");
    return ok ? 0 : 1;
  });
}
