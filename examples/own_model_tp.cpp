// Your own tensor-parallel model on zero, the whole program (docs/tensor-parallelism.md): an
// MLP whose first layer is split by columns and second by rows over the mesh's tp group
// (Megatron's pair: one all-reduce forward, one backward), ZeRO over the dp group, each dp rank
// its own data. T x D ranks, T = tensor_parallel.autotp_size:
//   torchrun --no-python --standalone --nproc-per-node 4 build/examples/zero-own-model-tp \
//     --config configs/zero1.yaml --set tensor_parallel.autotp_size=2 --set app.steps=20
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/sequential.h>
#include <zero/command_line.hpp>
#include <zero/tensor_parallel.hpp>
#include <zero/zero.hpp>

#include <cstdio>

int main(int argc, char** argv) {
  return zero::run_main("own-model-tp", [&] {
    namespace tp = zero::tensor_parallel;
    using Key = zero::Config::Extension::Key;
    zero::Config::Extension app{
        "app", {Key{"steps", zero::Config::Extension::Type::kInt, "20", "optimizer steps"}}};
    const zero::ConfigArgs args = zero::take_config_args(argc, argv);
    const zero::Config cfg = zero::Config::from_file(args.config_path, args.overrides, &app);

    auto world = zero::process_group_from_env(cfg, c10::DeviceType::CPU);
    zero::Mesh mesh = zero::ParallelDims::from_config(cfg).build_mesh(world);
    // Each layer's seed draws the full initial weight and keeps this rank's part: every T gives
    // the same model, and the ranks of a tp group start from one set of weights.
    torch::nn::Sequential model(
        tp::ColumnParallelLinear(
            mesh.tp, tp::ColumnParallelLinearOptions(16, 64).gather_output(false).seed(1)),
        torch::nn::ReLU(),
        tp::RowParallelLinear(mesh.tp,
                              tp::RowParallelLinearOptions(64, 1).input_is_parallel(true).seed(2)));
    zero::Engine engine = zero::initialize(model.ptr(), cfg, mesh);  // ZeRO over mesh.dp

    const int64_t micro = cfg.train_micro_batch_size_per_gpu;
    while (engine.stats().optimizer_steps < cfg.extra_int("app.steps")) {
      // The ranks of one tp group see the same rows; each dp rank its own.
      const int64_t seed = engine.stats().micro_steps * mesh.dp->size() + mesh.dp_rank();
      const at::Tensor x = at::randn({micro, 16}, at::make_generator<at::CPUGeneratorImpl>(seed));
      const at::Tensor y = at::tanh(x.sum(1, /*keepdim=*/true) / 4);
      const at::Tensor out = model->forward(x.to(engine.compute_dtype()));
      const at::Tensor loss = (out.to(at::kFloat) - y).square().mean();
      engine.backward(loss);
      if (!engine.step()) continue;
      const double mean = engine.all_reduce_mean(loss.item<double>());  // over dp: every rank
      if (world->rank() == 0)
        std::printf("step %lld loss %.6f\n", (long long)engine.stats().optimizer_steps, mean);
    }
    return 0;
  });
}
