// Compressed gradient reduction (zero_quantized_gradients, zero/compress/quantized_reduce.hpp)
// on real gloo ranks, checked against exact fp32 collectives, analytical bounds and a
// single-process reference trainer:
//  - the compressed reduce-scatter is within the sum over ranks of each rank's per-element
//    quantization bound (scale / 2 of the block the element sits in) of the exact one;
//  - with error feedback, sum_t out_t + (sum over ranks of the final residual) == sum_t exact_t
//    (the residual telescopes), while without it the error of the sum grows;
//  - the bytes each rank puts on the wire (comm::CountingGroup) match the formula;
//  - training with int8 + error feedback tracks single-process training (SGD, AdamW);
//  - a resumed run continues exactly (the residual is in the checkpoint); resharding drops it.
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/serialize.h>

#include <cmath>
#include <filesystem>
#include <mutex>

#include "comm/counting_group.hpp"
#include "support/thread_group.hpp"
#include "support/tiny_net.hpp"
#include "zero/compress/quantized_reduce.hpp"
#include "zero/engine.hpp"

namespace zero::testing {
namespace {

namespace fs = std::filesystem;

// Rank r's bucket at step t: mostly small values with a few spikes, as gradients are.
at::Tensor bucket_of(int rank, int step, int64_t numel) {
  at::Generator gen = at::detail::createCPUGenerator(1000 * step + rank + 1);
  at::Tensor x = at::randn({numel}, gen).mul_(1e-2);
  for (int64_t i = (rank * 37 + step * 11) % 101; i < numel; i += 101)
    x[i] = 3.0 * (i % 2 ? 1 : -1);
  return x;
}

// The per-element bound of quantizing row `row` of x viewed as [world, n]: half its block's
// scale, absmax / qmax, blocks counted from the row's start.
at::Tensor row_bound(const at::Tensor& x, int world, int row, int bits, int64_t block) {
  const int64_t n = x.numel() / world;
  const int64_t blocks = (n + block - 1) / block;
  at::Tensor padded = at::zeros({blocks * block});
  padded.narrow(0, 0, n).copy_(x.view({world, n})[row]);
  const double qmax = bits == 8 ? 127.0 : 7.0;
  at::Tensor half_scale = padded.view({blocks, block}).abs().amax(1).div(2 * qmax);
  return half_scale.repeat_interleave(block).narrow(0, 0, n);
}

struct ReduceCase {
  int world;
  int bits;
  int64_t n;  // elements of each rank's shard
  int64_t block;
};

class CompressedReduceScatter : public ::testing::TestWithParam<ReduceCase> {};

TEST_P(CompressedReduceScatter, WithinQuantizationBoundOfExact) {
  const ReduceCase c = GetParam();
  run_ranks(c.world, [&](std::shared_ptr<comm::Group> group) {
    const int rank = group->rank();
    const int64_t total = c.world * c.n;
    compress::Settings s{true, c.bits, c.block, /*error_feedback=*/false};
    compress::QuantizedReduceScatter q(*group, s, {total}, at::kCPU);
    at::Tensor in = bucket_of(rank, 0, total), exact_in = in.clone();
    at::Tensor out = at::empty({c.n}), exact = at::empty({c.n});
    q.reduce_scatter(0, out, in, "compressed").wait();
    group->reduce_scatter_sum(exact, exact_in, "exact").wait();
    at::Tensor bound = at::zeros({c.n});
    double absmax = 0;
    for (int r = 0; r < c.world; ++r) {
      const at::Tensor x = bucket_of(r, 0, total);
      bound += row_bound(x, c.world, rank, c.bits, c.block);
      absmax += x.abs().max().item<double>();
    }
    // fp32: the dequantized values and the sum over ranks round at ~2^-23 of their size.
    const at::Tensor err = (out - exact).abs();
    const double slack = absmax * std::ldexp(1.0, -20);
    EXPECT_TRUE((err <= bound + slack).all().item<bool>())
        << "rank " << rank << ": worst excess " << (err - bound).max().item<double>();
    // The quantization really happened (int4 on spiky data loses most small values).
    EXPECT_GT(err.max().item<double>(), 1e-6);
  });
}

INSTANTIATE_TEST_SUITE_P(Ranks, CompressedReduceScatter,
                         ::testing::Values(ReduceCase{2, 8, 1000, 64}, ReduceCase{2, 4, 1000, 64},
                                           ReduceCase{3, 8, 4096, 256}, ReduceCase{4, 4, 777, 50},
                                           ReduceCase{2, 8, 10, 2048}),
                         [](const ::testing::TestParamInfo<ReduceCase>& i) {
                           const ReduceCase& c = i.param;
                           return "world" + std::to_string(c.world) + "_int" +
                                  std::to_string(c.bits) + "_n" + std::to_string(c.n) + "_block" +
                                  std::to_string(c.block);
                         });

TEST(CompressedReduceScatterFeedback, AccumulatedSumIsExactAndWithoutItDrifts) {
  constexpr int kWorld = 2, kSteps = 30, kBits = 4;
  constexpr int64_t kN = 3000, kBlock = 128, kTotal = kWorld * kN;
  run_ranks(kWorld, [&](std::shared_ptr<comm::Group> group) {
    const int rank = group->rank();
    compress::QuantizedReduceScatter ef(*group, {true, kBits, kBlock, true}, {kTotal}, at::kCPU);
    compress::QuantizedReduceScatter plain(*group, {true, kBits, kBlock, false}, {kTotal},
                                           at::kCPU);
    at::Tensor sum_ef = at::zeros({kN}, at::kDouble), sum_plain = sum_ef.clone(),
               sum_exact = sum_ef.clone();
    double step_bound = 0;
    for (int t = 0; t < kSteps; ++t) {
      // A part that persists from step to step, as a gradient's mean does, below half a step of
      // the int4 grid the spikes set (3 / 7 / 2): without feedback it is rounded away every time.
      at::Tensor in = bucket_of(rank, t, kTotal).add_(0.05), copy = in.clone();
      at::Tensor out = at::empty({kN}), exact = at::empty({kN});
      ef.reduce_scatter(0, out, in, "ef").wait();
      sum_ef += out.to(at::kDouble);
      plain.reduce_scatter(0, out, in, "plain").wait();
      sum_plain += out.to(at::kDouble);
      group->reduce_scatter_sum(exact, copy, "exact").wait();
      sum_exact += exact.to(at::kDouble);
      step_bound = std::max(step_bound, exact.abs().max().item<double>());
    }
    // Every rank's residual, reduced exactly: what error feedback still owes this shard.
    at::Tensor residual = ef.feedback()->residual(0).clone(), owed = at::empty({kN});
    group->reduce_scatter_sum(owed, residual, "residuals").wait();
    const double closed = (sum_ef + owed.to(at::kDouble) - sum_exact).abs().max().item<double>();
    // Two fp32 roundings per step per rank, each ~2^-23 of values up to a few step sums.
    EXPECT_LT(closed, kSteps * kWorld * 4 * step_bound * std::ldexp(1.0, -23)) << rank;
    const double err_ef = (sum_ef - sum_exact).abs().max().item<double>();
    const double err_plain = (sum_plain - sum_exact).abs().max().item<double>();
    // With feedback the sum is off by one residual (a step's quantization error at most);
    // without it the persistent part is lost on every step: 30 steps x 2 ranks x 0.05.
    EXPECT_GT(err_plain, 2 * err_ef) << "rank " << rank;
    EXPECT_GT(err_plain, 0.5 * kSteps * kWorld * 0.05) << "rank " << rank;
    EXPECT_GT(ef.bytes(), 0);
    EXPECT_EQ(ef.bytes(), kTotal * 4);
    EXPECT_EQ(plain.bytes(), 0);
  });
}

// The bytes a rank sends for one bucket of world x n elements, as the ZeRO papers count them:
// (N-1)/N of its input, which the all-to-all sends exactly and a ring reduce-scatter sends in
// N-1 steps. Compressed: every row padded to whole blocks, bits/8 bytes per element and 4 per
// block.
TEST(CompressedReduceScatterBytes, SentBytesMatchTheFormula) {
  constexpr int kWorld = 4;
  constexpr int64_t kN = 5000, kBlock = 256, kTotal = kWorld * kN;
  run_ranks(kWorld, [&](std::shared_ptr<comm::Group> inner) {
    auto group = std::make_shared<comm::CountingGroup>(inner);
    at::Tensor in = bucket_of(group->rank(), 0, kTotal);
    at::Tensor out = at::empty({kN});
    at::Tensor in16 = in.to(at::kHalf), out16 = at::empty({kN}, at::kHalf);
    group->reduce_scatter_sum(out, in, "fp32").wait();
    group->reduce_scatter_sum(out16, in16, "fp16").wait();
    for (int bits : {8, 4}) {
      compress::QuantizedReduceScatter q(*group, {true, bits, kBlock, true}, {kTotal}, at::kCPU);
      q.reduce_scatter(0, out, in, "int" + std::to_string(bits)).wait();
    }
    const int64_t blocks = (kN + kBlock - 1) / kBlock;
    const auto sent = [](int64_t bytes) { return bytes * (kWorld - 1) / kWorld; };
    EXPECT_EQ(group->sent_bytes("fp32"), sent(4 * kTotal));
    EXPECT_EQ(group->sent_bytes("fp16"), sent(2 * kTotal));
    EXPECT_EQ(group->sent_bytes("int8"), sent(kWorld * (blocks * kBlock + 4 * blocks)));
    EXPECT_EQ(group->sent_bytes("int4"), sent(kWorld * (blocks * kBlock / 2 + 4 * blocks)));
    EXPECT_EQ(group->counts().at("all_to_all").calls, 2);
  });
}

// Loads a flat parameter vector (named_parameters() order) into a TinyNet.
void load_flat(torch::nn::Module& m, const at::Tensor& flat) {
  at::NoGradGuard no_grad;
  int64_t at = 0;
  for (auto& p : m.parameters()) {
    p.copy_(flat.narrow(0, at, p.numel()).view_as(p));
    at += p.numel();
  }
}

double held_out_loss(const at::Tensor& flat) {
  auto net = make_tiny_net(3);
  load_flat(*net, flat);
  at::NoGradGuard no_grad;
  const Batch b = global_batch(/*step=*/999, 256);
  return mse(net->forward(b.x), b.y).item<double>();
}

struct TrainCase {
  int stage;
  std::string optimizer;
  int accumulation;
};

class QuantizedTraining : public ::testing::TestWithParam<TrainCase> {};

constexpr int kWorld = 2;
constexpr int kSteps = 30;
constexpr int64_t kRows = 48;

Config train_config(const TrainCase& c) {
  Config cfg = test_config(c.stage, kRows / (kWorld * c.accumulation), c.accumulation, 0,
                           /*bucket=*/64);
  cfg.optimizer.type = c.optimizer;
  if (c.optimizer == "SGD") {
    cfg.optimizer.lr = 0.05;
    cfg.optimizer.momentum = 0.9;
  }
  return cfg;
}

struct RunResult {
  at::Tensor params;
  int64_t comm_buffers = 0;
  int64_t padded = 0;
};

RunResult train_engine(Config cfg) {
  std::mutex mu;
  RunResult out;
  run_ranks(kWorld, [&](std::shared_ptr<comm::Group> group) {
    auto net = make_tiny_net(3);
    auto engine = initialize(net, cfg, group);
    const int r = group->rank();
    const int acc = static_cast<int>(cfg.gradient_accumulation_steps);
    for (int s = 0; s < kSteps; ++s) {
      const Batch global = global_batch(s, kRows);
      for (int m = 0; m < acc; ++m) {
        Batch b = rank_micro_batch(global, r, kWorld, m, acc);
        engine.backward(mse(net->forward(b.x), b.y));
        engine.step();
      }
    }
    std::lock_guard<std::mutex> lock(mu);
    if (r == 0) {
      out.params = engine.flat_parameters();
      out.comm_buffers = engine.memory_report().measured.comm_buffers;
      out.padded = engine.memory_report().padded_params;
    }
  });
  return out;
}

TEST_P(QuantizedTraining, Int8WithErrorFeedbackTracksSingleProcessTraining) {
  const TrainCase c = GetParam();
  Config cfg = train_config(c);
  const ReferenceResult ref = train_reference(cfg, kSteps, kRows, /*seed=*/3);
  const RunResult exact = train_engine(cfg);
  auto& q = cfg.zero_optimization.quantized_gradients;
  q.enabled = true;
  q.bits = 8;
  q.block = 32;
  const RunResult int8 = train_engine(cfg);
  q.error_feedback = false;
  const RunResult no_ef = train_engine(cfg);

  // The residuals: one fp32 value per (padded) gradient element, declared with the buffers.
  EXPECT_EQ(int8.comm_buffers - no_ef.comm_buffers, 4 * int8.padded);
  // Stage 2's path has its buffers anyway; stage 1's accumulator reduces fp32 in place unless
  // compressed, which adds the two declared bucket buffers (bucket + shard, fp32).
  if (c.accumulation == 1) EXPECT_EQ(no_ef.comm_buffers, exact.comm_buffers);

  const double diff = (int8.params - ref.params).abs().max().item<double>();
  const double diff_no_ef = (no_ef.params - ref.params).abs().max().item<double>();
  double max_norm = 0;
  for (double n : ref.grad_norms) max_norm = std::max(max_norm, n);
  const double loss_ref = held_out_loss(ref.params), loss_q = held_out_loss(int8.params);
  std::printf(
      "%s stage %d ga %d: max |param - reference| int8+EF %.3g, int8 without EF %.3g; "
      "held-out loss reference %.6f, int8+EF %.6f\n",
      c.optimizer.c_str(), c.stage, c.accumulation, diff, diff_no_ef, loss_ref, loss_q);
  if (c.optimizer == "SGD") {
    // With feedback, what was not sent is the last residual, at most half a block scale per
    // rank: |e| <= max|g| / 254 <= the gradient norm / 254 (averaged over ranks). Momentum
    // weights a gradient by at most 1/(1-beta) = 10, and summation by parts over the
    // telescoping residuals gives |delta param| <= 2 lr |e| / (1 - beta); x2 for the
    // gradients being taken at slightly different parameters.
    const double bound = 2 * 2 * cfg.optimizer.lr * (max_norm / 254) / (1 - 0.9);
    EXPECT_LT(diff, bound);
  } else {
    // AdamW normalises each element's step, so a near-zero gradient's sign decides a step of
    // ~lr either way: parameter bounds say little. The goal of issue 25 is the loss: within
    // 1 % of uncompressed training.
    EXPECT_LT(std::abs(loss_q - loss_ref), 0.01 * loss_ref);
    EXPECT_LT(diff, kSteps * cfg.optimizer.lr);
  }
  // Training moved the parameters.
  EXPECT_GT((ref.params - flatten(*make_tiny_net(3))).abs().max().item<double>(), 1e-2);
}

INSTANTIATE_TEST_SUITE_P(Stages, QuantizedTraining,
                         ::testing::Values(TrainCase{1, "SGD", 1}, TrainCase{2, "SGD", 1},
                                           TrainCase{1, "SGD", 2}, TrainCase{2, "AdamW", 1},
                                           TrainCase{1, "AdamW", 2}),
                         [](const ::testing::TestParamInfo<TrainCase>& i) {
                           return "stage" + std::to_string(i.param.stage) + "_" +
                                  i.param.optimizer + "_ga" + std::to_string(i.param.accumulation);
                         });

// Trains `steps` steps from `from_step`, loading `load` first (if not empty) and saving to
// `save` after `save_after` steps (if not empty); returns rank 0's parameters.
at::Tensor run_segment(const Config& cfg, int world, int from_step, int steps,
                       const std::string& load, const std::string& save, int save_after) {
  std::mutex mu;
  at::Tensor params;
  run_ranks(world, [&](std::shared_ptr<comm::Group> group) {
    auto net = make_tiny_net(3);
    auto engine = initialize(net, cfg, group);
    if (!load.empty()) engine.load_checkpoint(load);
    for (int s = from_step; s < from_step + steps; ++s) {
      Batch b = rank_micro_batch(global_batch(s, kRows), group->rank(), world, 0, 1);
      engine.backward(mse(net->forward(b.x), b.y));
      engine.step();
      if (!save.empty() && s + 1 - from_step == save_after) engine.save_checkpoint(save, "mid");
    }
    std::lock_guard<std::mutex> lock(mu);
    if (group->rank() == 0) params = engine.flat_parameters();
  });
  return params;
}

Config resume_config(int world) {
  Config cfg = test_config(2, kRows / world, 1, 0, 64);
  cfg.optimizer.type = "SGD";
  cfg.optimizer.lr = 0.05;
  cfg.optimizer.momentum = 0.9;
  auto& q = cfg.zero_optimization.quantized_gradients;
  q.enabled = true;
  q.bits = 4;  // the coarsest codes: the residual is large, so losing it shows
  q.block = 32;
  return cfg;
}

TEST(QuantizedResume, ResidualInCheckpointMakesResumeExact) {
  const fs::path dir = fs::temp_directory_path() / "zero_test_quantized_resume";
  fs::remove_all(dir);
  const Config cfg = resume_config(2);
  const at::Tensor straight = run_segment(cfg, 2, 0, 10, "", dir.string(), 5);
  EXPECT_TRUE(fs::exists(dir / "mid" / "error_feedback.rank0_of_2.pt"));
  EXPECT_TRUE(fs::exists(dir / "mid" / "error_feedback.rank1_of_2.pt"));
  const at::Tensor resumed = run_segment(cfg, 2, 5, 5, dir.string(), "", 0);
  EXPECT_TRUE(at::equal(straight, resumed))
      << "max diff " << (straight - resumed).abs().max().item<double>();

  // Without the residuals (a checkpoint of a run without feedback) the resumed run differs:
  // the files above carried something.
  const fs::path copy = fs::temp_directory_path() / "zero_test_quantized_resume_no_ef";
  fs::remove_all(copy);
  fs::copy(dir, copy, fs::copy_options::recursive);
  fs::remove(copy / "mid" / "error_feedback.rank0_of_2.pt");
  fs::remove(copy / "mid" / "error_feedback.rank1_of_2.pt");
  ::testing::internal::CaptureStderr();
  const at::Tensor without = run_segment(cfg, 2, 5, 5, copy.string(), "", 0);
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(err.find("the checkpoint has none"), std::string::npos) << err;
  EXPECT_FALSE(at::equal(straight, without));
  fs::remove_all(dir);
  fs::remove_all(copy);
}

// A residual kept in bf16 is saved as bf16 and resumes exactly; a checkpoint of an fp32-residual
// run resumes under int8 residuals (converted, rounded once, no warning: nothing was dropped).
TEST(QuantizedResume, NarrowResidualResumesAndConvertsAcrossStorage) {
  const fs::path dir = fs::temp_directory_path() / "zero_test_quantized_resume_bf16";
  fs::remove_all(dir);
  Config cfg = resume_config(2);
  cfg.zero_optimization.quantized_gradients.error_feedback_dtype = "bf16";
  const at::Tensor straight = run_segment(cfg, 2, 0, 8, "", dir.string(), 4);
  std::vector<at::Tensor> saved;
  torch::load(saved, (dir / "mid" / "error_feedback.rank0_of_2.pt").string());
  ASSERT_GE(saved.size(), 2u);
  EXPECT_EQ(saved[1].scalar_type(), at::kBFloat16);
  EXPECT_TRUE(at::equal(straight, run_segment(cfg, 2, 4, 4, dir.string(), "", 0)));

  cfg.zero_optimization.quantized_gradients.error_feedback_dtype = "int8";
  ::testing::internal::CaptureStderr();
  const at::Tensor converted = run_segment(cfg, 2, 4, 4, dir.string(), "", 0);
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(err.find("error-feedback residuals start at zero"), std::string::npos) << err;
  EXPECT_TRUE(converted.isfinite().all().item<bool>());
  fs::remove_all(dir);
}

TEST(QuantizedResume, ReshardingDropsTheResidualWithAWarning) {
  const fs::path dir = fs::temp_directory_path() / "zero_test_quantized_reshard";
  fs::remove_all(dir);
  run_segment(resume_config(2), 2, 0, 3, "", dir.string(), 3);
  ::testing::internal::CaptureStderr();
  const at::Tensor after = run_segment(resume_config(4), 4, 3, 2, dir.string(), "", 0);
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(err.find("resharding drops them"), std::string::npos) << err;
  EXPECT_TRUE(after.isfinite().all().item<bool>());
  fs::remove_all(dir);
}


// Two parameters of one shape under the same names, registered in either order: the checkpoint
// loads by name into either model, but the bucket holds them in the other order, so a residual
// row of one would land on the other's elements.
struct TwoWeights : torch::nn::Module {
  explicit TwoWeights(bool swapped) {
    at::Generator gen = at::detail::createCPUGenerator(5);
    const at::Tensor a0 = at::randn({8, 8}, gen) * 0.3, b0 = at::randn({8, 8}, gen) * 0.3;
    if (swapped) {
      b = register_parameter("b", b0);
      a = register_parameter("a", a0);
    } else {
      a = register_parameter("a", a0);
      b = register_parameter("b", b0);
    }
  }
  at::Tensor forward(const at::Tensor& x) { return at::tanh(x.matmul(a)).matmul(b); }
  at::Tensor a, b;
};

std::string train_two_weights(bool swapped, const std::string& load, const std::string& save) {
  std::string err;
  Config cfg = resume_config(2);
  cfg.zero_optimization.reduce_bucket_size = 1000;  // one bucket holds both
  ::testing::internal::CaptureStderr();
  run_ranks(2, [&](std::shared_ptr<comm::Group> group) {
    auto net = std::make_shared<TwoWeights>(swapped);
    auto engine = initialize(net, cfg, group);
    if (!load.empty()) engine.load_checkpoint(load);
    for (int s = 0; s < 2; ++s) {
      at::Generator gen = at::detail::createCPUGenerator(100 * s + group->rank());
      const at::Tensor x = at::randn({4, 8}, gen);
      engine.backward(net->forward(x).pow(2).mean());
      engine.step();
    }
    if (!save.empty()) engine.save_checkpoint(save, "two");
  });
  return ::testing::internal::GetCapturedStderr();
}

TEST(QuantizedResume, ResidualOfAnotherBucketLayoutIsDroppedNamingIt) {
  const fs::path dir = fs::temp_directory_path() / "zero_test_quantized_layout";
  fs::remove_all(dir);
  train_two_weights(false, "", dir.string());
  // The same layout resumes with its residuals: no warning.
  std::string err = train_two_weights(false, dir.string(), "");
  EXPECT_EQ(err.find("error-feedback residuals start at zero"), std::string::npos) << err;
  // Same names, shapes and buffer sizes, the rows in the other order: dropped, and said why.
  err = train_two_weights(true, dir.string(), "");
  EXPECT_NE(err.find("error-feedback residuals start at zero"), std::string::npos) << err;
  EXPECT_NE(err.find("saved under bucket layout"), std::string::npos) << err;
  fs::remove_all(dir);
}

}  // namespace
}  // namespace zero::testing
