// An outside program on the installed models (zero::models): the LLaMA-style GPT trained at ZeRO
// stage 3 over the data-parallel ranks, and its tensor-parallel twin trained over a mesh's tp
// group, each against the same model trained in this process by plain LibTorch (no zero: autograd
// and p -= lr * grad). Exits non-zero unless every step's loss agrees with that reference to
// 1e-5 relative and the losses fell.
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <torch/csrc/autograd/generated/variable_factories.h>
#include <zero/models/gpt.hpp>
#include <zero/models/tp_gpt.hpp>
#include <zero/zero.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <vector>

namespace models = zero::models;

namespace {

constexpr int kSteps = 5;
constexpr double kLr = 0.2;
constexpr int64_t kBatch = 2, kSeq = 16;

struct Batch {
  at::Tensor tokens, targets;
};

// Each rank its own batch, the same at every step: the losses must fall.
Batch batch_of(const models::GptConfig& c, int rank) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(1000 + rank);
  return {at::randint(c.vocab, {kBatch, kSeq}, gen, at::kLong),
          at::randint(c.vocab, {kBatch, kSeq}, gen, at::kLong)};
}

// The same GPT as the engines start from (at::manual_seed(seed), then its constructor).
models::Gpt reference_gpt(const models::GptConfig& c, uint64_t seed) {
  at::manual_seed(seed);
  return models::Gpt(c);
}

// One plain SGD step of the reference on `loss`; returns its value.
double reference_step(models::Gpt& ref, const at::Tensor& loss) {
  for (auto& p : ref->parameters()) p.mutable_grad() = at::Tensor();
  loss.backward();
  at::NoGradGuard no_grad;
  for (auto& p : ref->parameters()) p.sub_(p.grad(), kLr);
  return loss.item<double>();
}

double rel(double a, double b) { return std::abs(a - b) / std::max(std::abs(b), 1e-12); }

zero::Config sgd_config(int stage) {
  zero::Config cfg;
  cfg.zero_optimization.stage = stage;
  cfg.train_micro_batch_size_per_gpu = kBatch;
  cfg.gradient_accumulation_steps = 1;
  cfg.gradient_clipping = 0.0;
  cfg.optimizer.type = "SGD";
  cfg.optimizer.lr = kLr;
  return cfg;
}

}  // namespace

int main() {
  return zero::run_main("consumer-gpt", [] {
    const models::GptConfig c = models::gpt_preset("tiny");
    zero::Config cfg = sgd_config(3);
    auto world = zero::process_group_from_env(cfg, c10::DeviceType::CPU);
    const int rank = world->rank(), n = world->size();

    // ZeRO-3 over every rank: each rank its own batch; the reference sees all of them and
    // averages their losses (what the engine's averaged gradients are the gradient of).
    models::Gpt model = reference_gpt(c, 1);
    zero::Engine engine = zero::initialize(model.ptr(), cfg, world);
    models::Gpt ref = reference_gpt(c, 1);
    double worst3 = 0, first3 = 0, last3 = 0;
    for (int step = 0; step < kSteps; ++step) {
      const Batch b = batch_of(c, rank);
      const at::Tensor loss = model->loss(b.tokens, b.targets);
      const double mean = engine.all_reduce_mean(loss.item<double>());
      engine.backward(loss);
      engine.step();
      at::Tensor ref_loss = at::zeros({});
      for (int r = 0; r < n; ++r) {
        const Batch br = batch_of(c, r);
        ref_loss = ref_loss + ref->loss(br.tokens, br.targets) / n;
      }
      const double want = reference_step(ref, ref_loss);
      worst3 = std::max(worst3, rel(mean, want));
      (step == 0 ? first3 : last3) = mean;
    }
    const bool s3_ok = worst3 < 1e-5 && last3 < first3;

    // Tensor parallelism over every rank (dp 1): the GPT's heads, ffn and vocabulary split, the
    // same batch on every rank; starts from the plain GPT's weights (init_like_gpt).
    zero::ParallelDims dims;
    dims.tp = n;
    const zero::Mesh mesh = dims.build_mesh(world);
    zero::Config tcfg = sgd_config(1);
    tcfg.tensor_parallel.autotp_size = n;
    models::TpGpt tp_model(mesh.tp, c);
    at::manual_seed(2);
    models::init_like_gpt(*tp_model, at::detail::getDefaultCPUGenerator());
    zero::Engine tengine = zero::initialize(tp_model, tcfg, mesh);
    models::Gpt tref = reference_gpt(c, 2);
    double worst_tp = 0, first_tp = 0, last_tp = 0;
    for (int step = 0; step < kSteps; ++step) {
      const Batch b = batch_of(c, 0);
      const at::Tensor loss = tp_model->loss(b.tokens, b.targets);
      const double got = loss.item<double>();
      tengine.backward(loss);
      tengine.step();
      const double want = reference_step(tref, tref->loss(b.tokens, b.targets));
      worst_tp = std::max(worst_tp, rel(got, want));
      (step == 0 ? first_tp : last_tp) = got;
    }
    const bool tp_ok = worst_tp < 1e-5 && last_tp < first_tp;

    std::printf(
        "consumer-gpt rank %d/%d: zero::models::Gpt at ZeRO stage 3 loss %.5g -> %.5g, worst "
        "relative difference to plain LibTorch %.2g %s; TpGpt over %s loss %.5g -> %.5g, worst "
        "%.2g %s\n",
        rank, n, first3, last3, worst3, s3_ok ? "ok" : "WRONG", mesh.describe().c_str(), first_tp,
        last_tp, worst_tp, tp_ok ? "ok" : "WRONG");
    return s3_ok && tp_ok ? 0 : 1;
  });
}
