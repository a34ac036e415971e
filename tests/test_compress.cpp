// Gradient compression (zero/compress/): blockwise int8 / int4 quantization and error feedback,
// checked against analytical bounds and plain double-precision sums, never against itself.
//  - Round trip: symmetric rounding to the nearest code leaves each element within scale / 2 of
//    its value (scale = its block's absmax / (2^(bits-1) - 1)); fp32 adds at most a few ulps of
//    the block's absmax, so the tolerance is scale / 2 + absmax * 2^-21.
//  - Error feedback: sum_t dequant(compress(g_t)) + residual_T == sum_t g_t up to fp32 rounding of
//    the two operations per step (g + r, then - dequant): tolerance T * 2^-22 * max |g + r|, sums
//    formed in double. Without feedback the same sum drifts like a random walk (the test checks it
//    does, so the feedback check can fail).
//  - A simulated compressed all-reduce on 2 and 4 gloo thread ranks (all_gather of the payloads,
//    dequantize and sum in fp32) is within the sum of the ranks' per-element bounds of the exact
//    all-reduce.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <functional>
#include <limits>
#include <ostream>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "comm/group.hpp"
#include "support/fake_device.hpp"
#include "support/thread_group.hpp"
#include "zero/compress/error_feedback.hpp"
#include "zero/compress/quantize.hpp"

namespace zero::compress {
namespace {

using testing::run_ranks;

at::Tensor randn(int64_t n, uint64_t seed) {
  at::Generator gen = at::detail::createCPUGenerator(seed);
  return at::randn({n}, gen);
}

// Heavy-tailed: Cauchy values (most small, a few enormous) - one outlier sets its block's scale.
at::Tensor cauchy(int64_t n, uint64_t seed) {
  at::Generator gen = at::detail::createCPUGenerator(seed);
  return at::empty({n}).cauchy_(0.0, 1.0, gen);
}

// Small gradients with a few large spikes, the shape of real gradient tensors.
at::Tensor spiky(int64_t n, uint64_t seed) {
  at::Tensor x = randn(n, seed).mul_(1e-3);
  for (int64_t i = 0; i < n; i += 997) x[i] = 50.0 * (i % 2 ? 1 : -1);
  return x;
}

// Each element's block scale, expanded to the unpadded length.
at::Tensor per_element(const at::Tensor& per_block, int64_t block, int64_t numel) {
  return per_block.repeat_interleave(block).narrow(0, 0, numel);
}

int64_t max_code(int bits) { return bits == 8 ? 127 : 7; }

struct RoundTripCase {
  int bits;
  int64_t numel;
  int64_t block;
  std::string data;
};

void PrintTo(const RoundTripCase& c, std::ostream* os) {
  *os << "int" << c.bits << " " << c.data << " numel " << c.numel << " block " << c.block;
}

class RoundTrip : public ::testing::TestWithParam<RoundTripCase> {};

TEST_P(RoundTrip, ErrorWithinHalfScalePerBlock) {
  const RoundTripCase c = GetParam();
  const at::Tensor x = c.data == "normal"   ? randn(c.numel, 1)
                       : c.data == "cauchy" ? cauchy(c.numel, 2)
                                            : spiky(c.numel, 3);
  const Quantized q = blockwise_quantize(x, c.bits, c.block);
  ASSERT_EQ(q.scales.numel(), (c.numel + c.block - 1) / c.block);
  const at::Tensor y = blockwise_dequantize(q);
  ASSERT_EQ(y.sizes(), x.sizes());

  // Scales from an independent absmax per block (double), not from q.
  const at::Tensor xd = x.to(at::kDouble);
  const int64_t blocks = q.scales.numel();
  at::Tensor absmax = at::zeros({blocks}, at::kDouble);
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t start = b * c.block;
    absmax[b] = xd.narrow(0, start, std::min(c.block, c.numel - start)).abs().max();
  }
  const at::Tensor scale = absmax / static_cast<double>(max_code(c.bits));
  EXPECT_TRUE(at::allclose(q.scales.to(at::kDouble), scale, 1e-6, 0.0));

  const at::Tensor err = (y.to(at::kDouble) - xd).abs();
  const at::Tensor bound = per_element(scale, c.block, c.numel) / 2;
  const at::Tensor tol = bound + per_element(absmax, c.block, c.numel) * std::ldexp(1.0, -21);
  const at::Tensor over = err > tol;
  EXPECT_FALSE(over.any().item<bool>())
      << over.sum().item<int64_t>() << " elements exceed scale/2; first at "
      << over.nonzero()[0].item<int64_t>();
  const double ratio = (err / bound.clamp_min(1e-30)).max().item<double>();
  std::printf("int%d %s numel=%lld block=%lld: max |err| / (scale/2) = %.6f\n", c.bits,
              c.data.c_str(), static_cast<long long>(c.numel), static_cast<long long>(c.block),
              ratio);
  // Rounding to nearest uses the whole half-step somewhere in a few thousand values - except
  // when spikes set the scales: then the small values all round to code 0 and their error is
  // their own size, far below scale / 2 (what error feedback exists to carry to later steps).
  if (c.numel >= 1000 && c.data != "spiky") EXPECT_GT(ratio, 0.9);
  if (c.data == "spiky") EXPECT_LT(ratio, 0.1);
}

INSTANTIATE_TEST_SUITE_P(
    Compress, RoundTrip,
    ::testing::Values(RoundTripCase{8, 1, 64, "normal"}, RoundTripCase{8, 4097, 64, "normal"},
                      RoundTripCase{8, 10000, 2048, "normal"},
                      RoundTripCase{8, 3 * 128 + 5, 128, "cauchy"},
                      RoundTripCase{8, 20001, 256, "cauchy"},
                      RoundTripCase{8, 20001, 2048, "spiky"}, RoundTripCase{4, 1, 64, "normal"},
                      RoundTripCase{4, 4097, 64, "normal"}, RoundTripCase{4, 10000, 2048, "normal"},
                      RoundTripCase{4, 3 * 128 + 5, 128, "cauchy"},
                      RoundTripCase{4, 20001, 256, "cauchy"},
                      RoundTripCase{4, 20001, 2048, "spiky"}, RoundTripCase{4, 999, 2, "normal"}),
    [](const ::testing::TestParamInfo<RoundTripCase>& info) {
      return "int" + std::to_string(info.param.bits) + "_" + info.param.data + "_n" +
             std::to_string(info.param.numel) + "_b" + std::to_string(info.param.block);
    });

TEST(Compress, Int4PackingIsExactOnAll16Codes) {
  // Every (low, high) pair of the 16 nibble values, against the byte worked out by hand.
  std::vector<int8_t> codes;
  for (int lo = -8; lo <= 7; ++lo) {
    for (int hi = -8; hi <= 7; ++hi) {
      codes.push_back(static_cast<int8_t>(lo));
      codes.push_back(static_cast<int8_t>(hi));
    }
  }
  const at::Tensor c = at::tensor(codes, at::kChar);
  const at::Tensor packed = pack_int4(c);
  ASSERT_EQ(packed.numel(), 256);
  const int8_t* p = packed.data_ptr<int8_t>();
  for (int64_t i = 0; i < 256; ++i) {
    const int expect = (codes[2 * i] & 0x0F) | ((codes[2 * i + 1] & 0x0F) << 4);
    ASSERT_EQ(static_cast<uint8_t>(p[i]), expect) << "pair " << i;
  }
  EXPECT_TRUE(at::equal(unpack_int4(packed), c));

  // Quantizing exact multiples of a power-of-two scale: every int4 code -7..7 comes back exactly.
  std::vector<float> values;
  for (int k = -7; k <= 7; ++k) values.push_back(0.25f * static_cast<float>(k));
  values.push_back(0.0f);  // even block of 16
  const at::Tensor x = at::tensor(values);
  const Quantized q = blockwise_quantize(x, 4, 16);
  EXPECT_EQ(q.codes.numel(), 8);
  EXPECT_FLOAT_EQ(q.scales.item<float>(), 0.25f);
  EXPECT_TRUE(at::equal(blockwise_dequantize(q), x));
  std::vector<int8_t> expect_codes;
  for (int k = -7; k <= 7; ++k) expect_codes.push_back(static_cast<int8_t>(k));
  expect_codes.push_back(0);
  EXPECT_TRUE(at::equal(unpack_int4(q.codes), at::tensor(expect_codes, at::kChar)));
}

TEST(Compress, ZeroBlocksGetScaleZeroAndEmptyInputWorks) {
  at::Tensor x = at::zeros({100});
  x.narrow(0, 32, 32).copy_(randn(32, 5));
  for (int bits : {8, 4}) {
    const Quantized q = blockwise_quantize(x, bits, 32);
    ASSERT_EQ(q.scales.numel(), 4);
    EXPECT_EQ(q.scales[0].item<float>(), 0.0f);
    EXPECT_GT(q.scales[1].item<float>(), 0.0f);
    EXPECT_EQ(q.scales[2].item<float>(), 0.0f);
    EXPECT_EQ(q.scales[3].item<float>(), 0.0f);  // 4 real zeros + 28 padding
    const at::Tensor y = blockwise_dequantize(q);
    EXPECT_TRUE(at::equal(y.narrow(0, 0, 32), at::zeros({32})));
    EXPECT_TRUE(at::equal(y.narrow(0, 64, 36), at::zeros({36})));
    EXPECT_TRUE(y.isfinite().all().item<bool>());

    const Quantized e = blockwise_quantize(at::zeros({0}), bits, 32);
    EXPECT_EQ(e.scales.numel(), 0);
    EXPECT_EQ(blockwise_dequantize(e).numel(), 0);
  }
}

TEST(Compress, StridedInputIsQuantizedLikeItsCopy) {
  const at::Tensor base = randn(2 * 1000, 9);
  const at::Tensor strided = base.slice(0, 0, 2000, 2);
  ASSERT_FALSE(strided.is_contiguous());
  const Quantized a = blockwise_quantize(strided, 8, 64);
  const Quantized b = blockwise_quantize(strided.contiguous(), 8, 64);
  EXPECT_TRUE(at::equal(a.codes, b.codes));
  EXPECT_TRUE(at::equal(a.scales, b.scales));
}

TEST(Compress, NonFiniteValueKeepsItsBlockNonFinite) {
  // An overflowed gradient must still look overflowed after the compressed reduction.
  at::Tensor x = randn(96, 6);
  x[40] = std::numeric_limits<float>::infinity();
  const at::Tensor y = blockwise_dequantize(blockwise_quantize(x, 8, 32));
  EXPECT_FALSE(y.narrow(0, 32, 32).isfinite().all().item<bool>());
  EXPECT_TRUE(y.narrow(0, 0, 32).isfinite().all().item<bool>());
  EXPECT_TRUE(y.narrow(0, 64, 32).isfinite().all().item<bool>());
}

void expect_invalid(const std::function<void()>& fn, const std::vector<std::string>& needles) {
  try {
    fn();
    ADD_FAILURE() << "no exception";
  } catch (const std::invalid_argument& e) {
    for (const std::string& n : needles) {
      EXPECT_NE(std::string(e.what()).find(n), std::string::npos) << e.what() << " lacks " << n;
    }
  }
}

TEST(Compress, BadParametersNameTheNumbers) {
  const at::Tensor x = randn(10, 7);
  expect_invalid([&] { blockwise_quantize(x, 3, 64); }, {"bits = 3", "8", "4"});
  expect_invalid([&] { blockwise_quantize(x, 16, 64); }, {"bits = 16"});
  expect_invalid([&] { blockwise_quantize(x, 8, 0); }, {"block = 0", "positive"});
  expect_invalid([&] { wire_bytes(10, 8, -5); }, {"block = -5"});
  expect_invalid([&] { blockwise_quantize(x, 4, 63); }, {"block = 63", "even"});
  expect_invalid([&] { blockwise_quantize(x.to(at::kDouble), 8, 64); }, {"fp32", "Double"});
  expect_invalid([&] { blockwise_quantize(x.view({2, 5}), 8, 64); }, {"1-D", "2 dimensions"});
  expect_invalid([&] { ErrorFeedback({10}, 5, 64, at::TensorOptions()); }, {"bits = 5"});
}

TEST(Compress, WireBytesEqualPayloadBytes) {
  for (int bits : {8, 4}) {
    for (int64_t block : {2, 64, 2048}) {
      for (int64_t numel : {1, 63, 64, 65, 4097, 100000}) {
        const Quantized q = blockwise_quantize(randn(numel, 8), bits, block);
        EXPECT_EQ(wire_bytes(numel, bits, block),
                  static_cast<int64_t>(q.codes.nbytes() + q.scales.nbytes()))
            << "bits " << bits << " block " << block << " numel " << numel;
      }
    }
  }
  // The traffic against 16- and 32-bit gradients for a large buffer (DeepSpeed's qgZ uses blocks
  // of a few thousand): codes plus one fp32 scale per block.
  const int64_t n = int64_t{1} << 24;
  for (int bits : {8, 4}) {
    const double w = static_cast<double>(wire_bytes(n, bits, 2048));
    std::printf("int%d block 2048: %.4f of fp32, %.4f of bf16\n", bits, w / (4.0 * n),
                w / (2.0 * n));
  }
  EXPECT_EQ(wire_bytes(n, 8, 2048), n + n / 2048 * 4);
  EXPECT_EQ(wire_bytes(n, 4, 2048), n / 2 + n / 2048 * 4);
}

// Sum over `steps` of what was sent, with and without feedback, against the exact sum of the
// gradients (all in double).
struct Drift {
  double feedback_err = 0;  // max |sum sent + residual - sum g|
  double feedback_tol = 0;
  double residual_over_bound = 0;  // max |residual_T| / (last scale / 2)
  double plain_err = 0;            // max |sum dequant(quantize(g)) - sum g|
  double last_half_scale = 0;      // max over blocks of the last step's scale / 2
};

Drift drift(int bits, int steps, int64_t n, int64_t block, at::ScalarType store = at::kFloat) {
  ErrorFeedback ef({n}, bits, block, at::TensorOptions(), store);
  at::Tensor sum_g = at::zeros({n}, at::kDouble);
  at::Tensor sum_sent = at::zeros({n}, at::kDouble);
  at::Tensor sum_plain = at::zeros({n}, at::kDouble);
  double max_x = 0;
  Drift d;
  Quantized last;
  for (int t = 0; t < steps; ++t) {
    const at::Tensor g = randn(n, 1000 + t);
    max_x = std::max(max_x, (g + ef.residual(0)).abs().max().item<double>());
    last = ef.compress(0, g);
    sum_g += g.to(at::kDouble);
    sum_sent += blockwise_dequantize(last).to(at::kDouble);
    sum_plain += blockwise_dequantize(blockwise_quantize(g, bits, block)).to(at::kDouble);
  }
  const at::Tensor r = ef.residual(0).to(at::kDouble);
  d.feedback_err = (sum_sent + r - sum_g).abs().max().item<double>();
  d.feedback_tol = steps * std::ldexp(1.0, -22) * max_x;
  const at::Tensor half = per_element(last.scales.to(at::kDouble), block, n) / 2;
  d.residual_over_bound = (r.abs() / half).max().item<double>();
  d.plain_err = (sum_plain - sum_g).abs().max().item<double>();
  d.last_half_scale = half.max().item<double>();
  return d;
}

TEST(ErrorFeedback, AccumulatedSumIsExactAndWithoutItErrorGrows) {
  const int64_t n = 5000, block = 128;
  for (int bits : {8, 4}) {
    const Drift short_run = drift(bits, 10, n, block);
    const Drift d = drift(bits, 100, n, block);
    std::printf(
        "int%d, 100 steps: feedback max|sum sent + residual - sum g| = %.3g (tol %.3g), "
        "max|residual|/(scale/2) = %.4f; without feedback max|drift| = %.4g after 10 steps, "
        "%.4g after 100 (scale/2 <= %.4g)\n",
        bits, d.feedback_err, d.feedback_tol, d.residual_over_bound, short_run.plain_err,
        d.plain_err, d.last_half_scale);
    EXPECT_LE(d.feedback_err, d.feedback_tol);
    // What was sent alone is off by the last residual only: bounded by half a step, not growing.
    EXPECT_LE(d.residual_over_bound, 1.0 + 1e-5);
    // Without feedback the error is a random walk: ~sqrt(10) times larger after 10x the steps,
    // and far beyond the half step that feedback keeps.
    EXPECT_GT(d.plain_err, 2.0 * short_run.plain_err);
    EXPECT_GT(d.plain_err, 5.0 * d.last_half_scale);
  }
}

// Residuals kept in 16 bits or as int8 codes (zero_quantized_gradients_error_feedback_dtype):
// what the storage rounds away is lost once per step, a small fraction of a quantization step,
// so the sum sent stays far closer to the sum of the gradients than without feedback.
TEST(ErrorFeedback, NarrowStorageStaysWithinItsRoundingOfExact) {
  const int64_t n = 5000, block = 128;
  const int steps = 100;
  for (int bits : {8, 4}) {
    const double qmax = bits == 8 ? 127.0 : 7.0;
    for (auto [store, lost] : {std::pair{at::kBFloat16, std::ldexp(1.0, -8)},
                               std::pair{at::kHalf, std::ldexp(1.0, -10)},
                               std::pair{at::kChar, 1.0 / 254}}) {
      const Drift d = drift(bits, steps, n, block, store);
      // Per step at most `lost` of the residual, itself at most half a step of max|x| / qmax
      // (randn inputs: max|x| < 6).
      const double bound = steps * lost * 6.0 / (2 * qmax);
      std::printf("int%d, residual as %s: max|sum sent + residual - sum g| = %.3g (bound %.3g), "
                  "without feedback %.3g\n",
                  bits, c10::toString(store), d.feedback_err, bound, d.plain_err);
      EXPECT_LE(d.feedback_err, bound) << c10::toString(store);
      EXPECT_LT(d.feedback_err, d.plain_err / 20) << c10::toString(store);
      EXPECT_LE(d.residual_over_bound, 1.0 + 1e-2) << c10::toString(store);
    }
  }
}

// The residuals' bytes as the fake accelerator's allocator counts them, exactly, against
// bytes() (what the memory report adds) and residual_bytes (what planners use): per element 4
// (fp32), 2 (bf16, fp16), 1 + 4 / block (int8 codes, one fp32 scale per block).
TEST(ErrorFeedback, StorageBytesAreWhatTheAllocatorCounts) {
  const c10::Device dev = testing::fake::device(0);
  const std::vector<int64_t> numels{5000, 37, 4096};
  const int64_t block = 128, total = 5000 + 37 + 4096;
  for (auto [store, per_element] :
       {std::pair{at::kFloat, 4.0}, std::pair{at::kBFloat16, 2.0}, std::pair{at::kHalf, 2.0},
        std::pair{at::kChar, 1.0 + 4.0 / block}}) {
    const int64_t before = testing::fake::allocated_bytes(0);
    int64_t held = 0, formula = 0;
    {
      ErrorFeedback ef(numels, 8, block, at::TensorOptions().device(dev), store);
      held = testing::fake::allocated_bytes(0) - before;
      for (int64_t n : numels) formula += residual_bytes(n, store, block);
      EXPECT_EQ(held, ef.bytes()) << c10::toString(store);
      // A step on the device keeps the storage where and as it was.
      ef.compress_rows(0, randn(5000, 1).to(dev), 2);
      ef.compress(2, randn(4096, 2).to(dev));
      EXPECT_EQ(ef.bytes(), held);
      EXPECT_GT(ef.residual(0).abs().max().item<float>(), 0.0f);
    }
    EXPECT_EQ(held, formula) << c10::toString(store);
    std::printf("residual as %s: %lld bytes for %lld elements, %.4f per element\n",
                c10::toString(store), static_cast<long long>(held),
                static_cast<long long>(total), static_cast<double>(held) / total);
    // Padding to whole blocks (int8) adds at most one block per buffer.
    EXPECT_NEAR(static_cast<double>(held) / total, per_element,
                store == at::kChar ? 3.0 * (block + 4) / total : 0.0);
    EXPECT_EQ(testing::fake::allocated_bytes(0), before) << "freed with the ErrorFeedback";
  }
  EXPECT_EQ(residual_store("auto", at::kBFloat16), at::kBFloat16);
  EXPECT_EQ(residual_store("auto", at::kFloat), at::kFloat);
  EXPECT_EQ(residual_store("int8", at::kBFloat16), at::kChar);
  expect_invalid([] { residual_store("int4", at::kFloat); },
                 {"zero_quantized_gradients_error_feedback_dtype", "'int4'", "int8"});
}

// A residual saved under one storage loads into another (a run that switched
// zero_quantized_gradients_error_feedback_dtype): converted, rounded once.
TEST(ErrorFeedback, StateLoadsAcrossStorage) {
  ErrorFeedback a({1000}, 4, 64, at::TensorOptions());
  for (int t = 0; t < 3; ++t) a.compress(0, randn(1000, 40 + t));
  const at::Tensor exact = a.residual(0);
  for (at::ScalarType store : {at::kBFloat16, at::kHalf, at::kChar}) {
    ErrorFeedback b({1000}, 4, 64, at::TensorOptions(), store);
    b.load_state(a.state());
    const double tol = store == at::kChar ? exact.abs().max().item<double>() / 254 * 1.01
                                          : exact.abs().max().item<double>() * std::ldexp(1.0, -8);
    EXPECT_LE((b.residual(0) - exact).abs().max().item<double>(), tol) << c10::toString(store);
    // And back: the narrow state into fp32 is the narrow values exactly.
    ErrorFeedback c({1000}, 4, 64, at::TensorOptions());
    c.load_state(b.state());
    EXPECT_TRUE(at::equal(c.residual(0), b.residual(0))) << c10::toString(store);
  }
}

TEST(ErrorFeedback, StateRoundTripIsExact) {
  const std::vector<int64_t> numels{1000, 37};
  ErrorFeedback a(numels, 4, 64, at::TensorOptions());
  EXPECT_EQ(a.bytes(), (1000 + 37) * 4);
  EXPECT_EQ(a.buffers(), 2u);
  for (int t = 0; t < 3; ++t) {
    a.compress(0, randn(1000, 20 + t));
    a.compress(1, randn(37, 30 + t));
  }
  const ErrorFeedback::State saved = a.state();
  ASSERT_GT(saved.residuals[0].abs().max().item<float>(), 0.0f);

  ErrorFeedback b(numels, 4, 64, at::TensorOptions());
  b.load_state(saved);
  for (size_t i = 0; i < numels.size(); ++i) {
    EXPECT_TRUE(at::equal(b.residual(i), a.residual(i)));
  }
  // The saved copy is independent of further training.
  const at::Tensor before = saved.residuals[0].clone();
  const at::Tensor g = randn(1000, 99);
  const Quantized qa = a.compress(0, g);
  const Quantized qb = b.compress(0, g);
  EXPECT_TRUE(at::equal(saved.residuals[0], before));
  EXPECT_TRUE(at::equal(qa.codes, qb.codes));
  EXPECT_TRUE(at::equal(qa.scales, qb.scales));
  EXPECT_TRUE(at::equal(a.residual(0), b.residual(0)));

  ErrorFeedback other_bits(numels, 8, 64, at::TensorOptions());
  expect_invalid([&] { other_bits.load_state(saved); }, {"bits = 4", "bits = 8"});
  ErrorFeedback other_size({1000, 38}, 4, 64, at::TensorOptions());
  expect_invalid([&] { other_size.load_state(saved); }, {"buffer 1", "37", "38"});
  ErrorFeedback other_count({1000}, 4, 64, at::TensorOptions());
  expect_invalid([&] { other_count.load_state(saved); }, {"2 buffers", "has 1"});
  expect_invalid([&] { a.compress(0, randn(999, 1)); }, {"1000", "999"});

  a.reset();
  EXPECT_EQ(a.residual(0).abs().max().item<float>(), 0.0f);
}

// Each rank quantizes its own gradient, the payloads are all-gathered, every rank dequantizes and
// sums in fp32: within sum over ranks of scale_r / 2 (per element) of the exact all-reduce.
TEST(CompressedReduce, GatherDequantizeSumWithinSumOfBounds) {
  const int64_t n = 3000, block = 256;
  for (int world : {2, 4}) {
    for (int bits : {8, 4}) {
      run_ranks(world, [&](std::shared_ptr<comm::Group> group) {
        const int rank = group->rank();
        // Ranks differ in magnitude so their scales (and bounds) differ.
        const at::Tensor g = randn(n, 500 + rank).mul_(static_cast<double>(rank + 1));
        const Quantized q = blockwise_quantize(g, bits, block);
        at::Tensor codes = q.codes, scales = q.scales;
        at::Tensor all_codes = at::empty({codes.numel() * world}, codes.options());
        at::Tensor all_scales = at::empty({scales.numel() * world}, scales.options());
        group->all_gather(all_codes, codes, "compressed gradient codes").wait();
        group->all_gather(all_scales, scales, "compressed gradient scales").wait();
        EXPECT_EQ(static_cast<int64_t>(codes.nbytes() + scales.nbytes()),
                  wire_bytes(n, bits, block));

        at::Tensor sum = at::zeros({n});
        at::Tensor bound = at::zeros({n}, at::kDouble);
        at::Tensor abs_sum = at::zeros({n}, at::kDouble);
        for (int r = 0; r < world; ++r) {
          Quantized qr{all_codes.chunk(world)[r], all_scales.chunk(world)[r], n, bits, block};
          sum += blockwise_dequantize(qr);
          bound += per_element(qr.scales.to(at::kDouble), block, n) / 2;
          abs_sum += (randn(n, 500 + r) * static_cast<double>(r + 1)).to(at::kDouble).abs();
        }
        // Exact references: the group's fp32 all-reduce, and the sum formed here in double.
        at::Tensor reduced = g.clone();
        group->all_reduce_sum(reduced, "exact gradient all-reduce").wait();
        at::Tensor exact = at::zeros({n}, at::kDouble);
        for (int r = 0; r < world; ++r) {
          exact += (randn(n, 500 + r) * static_cast<double>(r + 1)).to(at::kDouble);
        }
        // fp32 summation of `world` terms: a few ulps of the sum of magnitudes.
        const at::Tensor tol = bound + abs_sum * (world * std::ldexp(1.0, -23));
        const at::Tensor err = (sum.to(at::kDouble) - exact).abs();
        EXPECT_FALSE((err > tol).any().item<bool>());
        EXPECT_FALSE(((sum.to(at::kDouble) - reduced.to(at::kDouble)).abs() >
                      tol + abs_sum * std::ldexp(1.0, -20))
                         .any()
                         .item<bool>());
        if (rank == 0) {
          std::printf("world %d int%d: max |compressed - exact| / sum of bounds = %.4f\n", world,
                      bits, (err / bound).max().item<double>());
        }
        EXPECT_GT((err / bound).max().item<double>(), 0.1);  // quantization did happen
      });
    }
  }
}

}  // namespace
}  // namespace zero::compress
