// The gradient path as a composition (zero/grads/grad_sync.hpp): each collector (partitioned,
// accumulated) with each reducer (reduce-scatter, all-reduce-keep-shard, quantized; stage 0's
// in-place all-reduce) and each sink (device shard, host shard, in place) on 2 real gloo ranks,
// against the sum of every rank's gradients computed here from the layout's arithmetic alone.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <mutex>

#include "support/thread_group.hpp"
#include "zero/grads/grad_sync.hpp"

namespace zero::testing {
namespace {

constexpr int kWorld = 2;

// "b" is larger than a bucket (reduced in chunks); the rest share buckets.
const std::vector<ParamSpec> kSpecs = {{"a", 5}, {"b", 12}, {"c", 3}, {"d", 7}, {"e", 1}};

// Small integers: exact in bf16 and in any sum of a few of them.
at::Tensor grad_of(int rank, int param, int pass, int64_t numel) {
  return (at::arange(numel, at::kFloat).remainder(7) - 3) * (rank + 1) + param - 2 * pass;
}

enum class Collector { kPartitioned, kAccumulated };
enum class Reduction { kAllReduce, kReduceScatter, kKeepShard, kQuantized };

struct Case {
  Collector collector;
  Reduction reduction;
  bool host = false;  // the host-shard sink (optimizer offload)
  at::ScalarType comm = at::kFloat;
  std::string name;
};

std::unique_ptr<Reducer> reducer_for(const Case& c, const FlatLayout& layout, comm::Group& g,
                                     const GradSyncOptions& opts) {
  switch (c.reduction) {
    case Reduction::kAllReduce:
      return make_all_reduce(g);
    case Reduction::kReduceScatter:
      return make_reduce_scatter(g);
    case Reduction::kKeepShard:
      return make_all_reduce_keep_shard(g);
    case Reduction::kQuantized:
      return make_quantized_reducer(layout, g, opts);
  }
  return nullptr;
}

class GradPath : public ::testing::TestWithParam<Case> {};

TEST_P(GradPath, ShardIsTheSumOverRanksAndMicroSteps) {
  const Case c = GetParam();
  const bool stage0 = c.reduction == Reduction::kAllReduce;
  const FlatLayout layout = FlatLayout::build(kSpecs, /*bucket_numel=*/8, stage0 ? 1 : kWorld, 1);
  const int passes = 2;
  std::mutex mu;
  std::vector<int> launched_order;
  run_ranks(kWorld, [&](std::shared_ptr<comm::Group> group) {
    const int rank = group->rank();
    GradSyncOptions opts;
    opts.comm_dtype = c.comm;
    opts.host_shard = c.host;
    opts.compress.enabled = c.reduction == Reduction::kQuantized;
    opts.compress.error_feedback = true;
    std::unique_ptr<GradSync> sync;
    if (stage0) {
      sync = make_accumulated_grads(layout, *group, /*sharded=*/false, opts);
    } else {
      auto reducer = reducer_for(c, layout, *group, opts);
      auto sink = c.host ? make_host_shard(layout.shard_numel(), layout.chunk_numel(), opts)
                         : make_device_shard(layout.shard_numel(), opts);
      sync = c.collector == Collector::kPartitioned
                 ? make_partitioned_grads(layout, *group, opts, std::move(reducer),
                                          std::move(sink))
                 : make_accumulated_grads(layout, *group, /*sharded=*/true, opts,
                                          std::move(reducer), std::move(sink));
    }
    std::vector<int> launched;
    sync->set_on_launched([&](int b) { launched.push_back(b); });
    // The reference: every rank's every gradient of the window, summed into one flat buffer.
    at::Tensor sum = at::zeros({layout.total_numel()});
    for (int step = 0; step < 2; ++step) {
      for (int pass = 0; pass < passes; ++pass) {
        sync->begin_backward(/*boundary=*/pass == passes - 1, {}, /*counting=*/false);
        // Backward order: the layout's own (reverse registration).
        for (int p = 0; p < static_cast<int>(layout.params().size()); ++p) {
          const ParamSlot& s = layout.params()[p];
          sync->on_grad(p, grad_of(rank, p, pass + 3 * step, s.numel));
          for (int r = 0; r < kWorld; ++r) {
            sum.narrow(0, s.flat_offset, s.numel).add_(grad_of(r, p, pass + 3 * step, s.numel));
          }
        }
        sync->end_backward();
      }
      // This rank's part of each bucket, laid out as the shard.
      at::Tensor expected = at::zeros({layout.shard_numel()});
      for (const BucketSlot& b : layout.buckets()) {
        const int64_t S = b.shard.shard_numel();
        const int me = stage0 ? 0 : rank;
        expected.narrow(0, b.shard_offset, S).copy_(sum.narrow(0, b.flat_offset + me * S, S));
      }
      const at::Tensor got = sync->grad_shard().to(at::kFloat);
      if (c.reduction == Reduction::kQuantized) {
        // int8 codes per block of 2048: an error of at most half a step of the block's largest
        // value, per rank and reduction, and error feedback carries it into the next window.
        const double step_size = expected.abs().max().item<double>() / 127.0;
        EXPECT_LE((got - expected).abs().max().item<double>(), 4 * kWorld * step_size)
            << c.name << " step " << step;
        EXPECT_GT((got - expected).abs().max().item<double>(), 0) << "not quantized at all?";
      } else {
        EXPECT_TRUE(at::equal(got, expected)) << c.name << " step " << step << " rank " << rank
                                              << "\n got " << got << "\n want " << expected;
      }
      const GradPathBytes bytes = sync->bytes();
      EXPECT_EQ(bytes.grads, (c.collector == Collector::kAccumulated || stage0
                                  ? layout.total_numel() * 4
                                  : 0) +
                                 (stage0 ? 0 : layout.shard_numel() * 4));
      EXPECT_EQ(bytes.host_staging > 0 || !c.host, true);
      EXPECT_EQ(sync->reducer().error_feedback() != nullptr, c.reduction == Reduction::kQuantized);
      sync->zero_grad();
      sum.zero_();
    }
    // Each bucket's first reduction announced once per boundary pass, in release (index) order.
    std::vector<int> want;
    for (int step = 0; step < 2; ++step) {
      for (size_t b = 0; b < layout.buckets().size(); ++b) want.push_back(static_cast<int>(b));
      if (c.collector == Collector::kPartitioned && !stage0) {
        // Every pass is reduced on the partitioned path.
        for (size_t b = 0; b < layout.buckets().size(); ++b) want.push_back(static_cast<int>(b));
      }
    }
    EXPECT_EQ(launched, want) << c.name;
    std::lock_guard<std::mutex> lock(mu);
    launched_order = launched;
  });
}

std::vector<Case> cases() {
  std::vector<Case> out;
  for (Collector col : {Collector::kPartitioned, Collector::kAccumulated}) {
    const std::string cn = col == Collector::kPartitioned ? "Partitioned" : "Accumulated";
    for (Reduction red : {Reduction::kReduceScatter, Reduction::kKeepShard, Reduction::kQuantized}) {
      const std::string rn = red == Reduction::kReduceScatter ? "ReduceScatter"
                             : red == Reduction::kKeepShard   ? "KeepShard"
                                                              : "Quantized";
      for (bool host : {false, true}) {
        for (at::ScalarType comm : {at::kFloat, at::kBFloat16}) {
          out.push_back({col, red, host, comm,
                         cn + rn + (host ? "HostShard" : "DeviceShard") +
                             (comm == at::kFloat ? "Fp32" : "Bf16")});
        }
      }
    }
  }
  for (at::ScalarType comm : {at::kFloat, at::kBFloat16}) {
    out.push_back({Collector::kAccumulated, Reduction::kAllReduce, false, comm,
                   std::string("Stage0InPlace") + (comm == at::kFloat ? "Fp32" : "Bf16")});
  }
  return out;
}

INSTANTIATE_TEST_SUITE_P(Compositions, GradPath, ::testing::ValuesIn(cases()),
                         [](const auto& info) { return info.param.name; });

// Stage 0's sink is its accumulator: a sharded sink there is refused, as is compression.
TEST(GradPathRefusals, Stage0RefusesCompression) {
  run_ranks(1, [&](std::shared_ptr<comm::Group> group) {
    const FlatLayout layout = FlatLayout::build(kSpecs, 8, 1, 1);
    GradSyncOptions opts;
    opts.compress.enabled = true;
    EXPECT_THROW(make_accumulated_grads(layout, *group, /*sharded=*/false, opts), c10::Error);
  });
}

}  // namespace
}  // namespace zero::testing
