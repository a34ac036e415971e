// Your own model on zero, the whole program (docs/getting-started.md): an MLP trained with the
// config's ZeRO stage and dtype on every rank torchrun starts, app keys of its own, each rank
// its own data, a checkpoint after each step that ran, and a resume from the newest one.
//   torchrun --no-python --standalone --nproc-per-node 2 build/examples/zero-own-model \
//     --config configs/zero2.yaml --set app.steps=40 --set app.save_dir=/tmp/own
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>
#include <zero/checkpoint_io.hpp>
#include <zero/command_line.hpp>
#include <zero/zero.hpp>

#include <cstdio>

int main(int argc, char** argv) {
  return zero::run_main("own-model", [&] {
    using Key = zero::Config::Extension::Key;
    using Type = zero::Config::Extension::Type;
    zero::Config::Extension app{"app",
                                {Key{"steps", Type::kInt, "40", "optimizer steps in all"},
                                 Key{"save_dir", Type::kString, "", "save each step; resume"}}};
    const zero::ConfigArgs args = zero::take_config_args(argc, argv);
    const zero::Config cfg = zero::Config::from_file(args.config_path, args.overrides, &app);
    const int64_t steps = cfg.extra_int("app.steps");
    const std::string dir = cfg.extra_string("app.save_dir");

    at::manual_seed(0);  // the same initial weights on every rank
    torch::nn::Sequential model(torch::nn::Linear(16, 64), torch::nn::ReLU(),
                                torch::nn::Linear(64, 1));
    // bf16 / fp16 configs turn the model's parameters into that dtype here, in place.
    zero::Engine engine = zero::initialize(model.ptr(), cfg);
    if (!dir.empty() && !zero::latest_checkpoint_tag(dir).empty()) engine.load_checkpoint(dir);

    const int64_t micro = cfg.train_micro_batch_size_per_gpu;
    while (engine.stats().optimizer_steps < steps) {
      // Each rank its own rows, drawn from (step, micro-step, rank): a resumed run sees the data
      // the uninterrupted one would have.
      const int64_t seed = (engine.stats().micro_steps * engine.world_size() + engine.rank());
      const at::Tensor x = at::randn({micro, 16}, at::make_generator<at::CPUGeneratorImpl>(seed));
      const at::Tensor y = at::tanh(x.sum(1, /*keepdim=*/true) / 4);
      // The compute dtype (bf16/fp16 configs); cast_input adds DeepSpeed's fp16.auto_cast, if set.
      const at::Tensor out = model->forward(engine.cast_input(x.to(engine.compute_dtype())));
      const at::Tensor loss = (out.to(at::kFloat) - y).square().mean();
      engine.backward(loss);
      if (!engine.step()) continue;  // mid accumulation window (or an fp16 overflow skipped)
      if (!dir.empty()) engine.save_checkpoint(dir, "", /*keep_last=*/2);
      const double mean = engine.all_reduce_mean(loss.item<double>());  // every rank calls it
      if (engine.rank() == 0)
        std::printf("step %lld loss %.6f\n", (long long)engine.stats().optimizer_steps, mean);
    }
    return 0;
  });
}
