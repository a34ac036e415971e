// The post-step parameter all-gather of stages 1 and 2, coalesced (comm/gather_coalescing.hpp):
// how many collectives it makes, and that the values are the per-bucket gathers' bit for bit.
// Real gloo ranks (threads); the expected outputs and call counts are computed here from the
// inputs and the bound, not read from the code under test.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <mutex>

#include "comm/counting_group.hpp"
#include "comm/gather_coalescing.hpp"
#include "support/thread_group.hpp"
#include "support/tiny_net.hpp"
#include "support/tiny_net_layout.hpp"
#include "zero/engine.hpp"

namespace zero::testing {
namespace {

// Rank r's shard of bucket b, element i: a value no other (r, b, i) has, exact in bf16.
at::Tensor shard_values(int r, int b, int64_t n, at::ScalarType dtype) {
  return (at::arange(n, at::kFloat) + 1000 * b + 100 * r).to(dtype);
}

// How many collectives a greedy coalescer makes of calls with these output sizes: a call that
// would take the queued ones past `bound` launches them first.
int expected_gathers(const std::vector<int64_t>& outs, int64_t bound) {
  int n = 0;
  int64_t queued = 0;
  for (int64_t o : outs) {
    if (queued > 0 && queued + o > bound) {
      ++n;
      queued = 0;
    }
    queued += o;
  }
  return n + (queued > 0 ? 1 : 0);
}

int64_t all_gather_calls(const comm::CountingGroup& g) {
  const auto counts = g.counts();
  const auto it = counts.find("all_gather");
  return it == counts.end() ? 0 : it->second.calls;
}

// Bucket-major outputs, as zero's flat buffer: bucket b holds every rank's shard of it.
void check_buckets(at::ScalarType dtype, int64_t bound) {
  const int world = 4;
  const std::vector<int64_t> shard = {3, 5, 2, 7, 1, 4};
  std::vector<int64_t> outs;
  int64_t total = 0;
  for (int64_t s : shard) {
    outs.push_back(s * world);
    total += s * world;
  }
  std::mutex mu;
  std::vector<int64_t> calls(world);
  run_ranks(world, [&](std::shared_ptr<comm::Group> group) {
    const int r = group->rank();
    auto counting = std::make_shared<comm::CountingGroup>(group);
    comm::GatherCoalescingGroup g(counting, bound);
    at::Tensor flat = at::full({total}, -1.0, at::TensorOptions().dtype(dtype));
    std::vector<at::Tensor> ins;
    std::vector<comm::Work> works;
    {
      comm::CoalescingWindow window(&g);
      int64_t off = 0;
      for (size_t b = 0; b < shard.size(); ++b) {
        at::Tensor out = flat.narrow(0, off, outs[b]);
        // Bucket 0 in place (its input inside its output, as the fp32 master is), the others
        // from a temporary (as a bf16 cast is).
        at::Tensor in = b == 0 ? out.narrow(0, r * shard[b], shard[b])
                               : shard_values(r, static_cast<int>(b), shard[b], dtype);
        if (b == 0) in.copy_(shard_values(r, 0, shard[b], dtype));
        works.push_back(g.all_gather(out, in, "bucket " + std::to_string(b)));
        ins.push_back(in);
        off += outs[b];
      }
      for (auto& w : works) w.wait();
    }
    int64_t off = 0;
    for (size_t b = 0; b < shard.size(); ++b) {
      for (int q = 0; q < world; ++q) {
        at::Tensor got = flat.narrow(0, off + q * shard[b], shard[b]);
        EXPECT_TRUE(at::equal(got, shard_values(q, static_cast<int>(b), shard[b], dtype)))
            << "rank " << r << " bucket " << b << " chunk of rank " << q;
      }
      off += outs[b];
    }
    std::lock_guard<std::mutex> lock(mu);
    calls[r] = all_gather_calls(*counting);
  });
  for (int r = 0; r < world; ++r) {
    EXPECT_EQ(calls[r], expected_gathers(outs, bound)) << "rank " << r << ", bound " << bound;
  }
}

TEST(GatherCoalescing, BucketMajorOutputsFromFewerGathers) {
  // 32: {0, 1} together, 2 alone (it would pass the bound with 3), {3, 4}, 5 alone.
  for (const int64_t bound : {int64_t{1}, int64_t{32}, int64_t{1} << 40}) {
    check_buckets(at::kFloat, bound);
    check_buckets(at::kBFloat16, bound);
  }
  EXPECT_EQ(expected_gathers({12, 20, 8, 28, 4, 16}, 32), 4);
}

// Outside the window every call is the wrapped group's own; inside, another collective sends
// the queued gathers first, so every rank's collectives stay in the order they were called.
TEST(GatherCoalescing, OtherCollectivesKeepTheirOrder) {
  run_ranks(2, [&](std::shared_ptr<comm::Group> group) {
    const int r = group->rank();
    auto counting = std::make_shared<comm::CountingGroup>(group);
    comm::GatherCoalescingGroup g(counting, 1 << 20);
    at::Tensor out = at::empty({4}), in = at::full({2}, static_cast<double>(r));
    g.all_gather(out, in, "outside").wait();
    EXPECT_EQ(all_gather_calls(*counting), 1);
    comm::CoalescingWindow window(&g);
    at::Tensor a = at::empty({4}), b = at::empty({4});
    at::Tensor ia = at::full({2}, 10.0 + r), ib = at::full({2}, 20.0 + r);
    comm::Work wa = g.all_gather(a, ia, "a");
    comm::Work wb = g.all_gather(b, ib, "b");
    EXPECT_EQ(all_gather_calls(*counting), 1) << "queued, not sent";
    at::Tensor s = at::ones({1});
    g.all_reduce_sum(s, "sum").wait();
    EXPECT_EQ(all_gather_calls(*counting), 2) << "the all-reduce sent the queued pair first";
    EXPECT_EQ(s.item<float>(), 2.0f);
    wb.wait();
    wa.wait();
    EXPECT_TRUE(at::equal(a, at::tensor({10.f, 10.f, 11.f, 11.f})));
    EXPECT_TRUE(at::equal(b, at::tensor({20.f, 20.f, 21.f, 21.f})));
  });
}

// The engine: stages 1 and 2 publish with one all-gather per allgather_bucket_size elements
// (capped, zero/engine/engine.cpp), not one per gradient bucket, and train as single-process
// training does (fp32) and as the per-bucket gathers do, bit for bit.
struct TrainRun {
  std::vector<at::Tensor> finals;
  std::vector<int64_t> step_gathers;  // rank 0's all-gathers in each step
};

TrainRun train(const Config& cfg, int world, int steps) {
  TrainRun out;
  out.finals.resize(world);
  std::mutex mu;
  run_ranks(world, [&](std::shared_ptr<comm::Group> group) {
    const int r = group->rank();
    auto counting = std::make_shared<comm::CountingGroup>(group);
    auto net = make_tiny_net(3);
    auto engine = initialize(net, cfg, counting);
    for (int s = 0; s < steps; ++s) {
      Batch b = rank_micro_batch(global_batch(s, 48), r, world, 0, 1);
      const at::Tensor x = b.x.to(engine.compute_dtype());
      engine.backward(mse(net->forward(x).to(at::kFloat), b.y));
      counting->reset();
      engine.step();
      if (r == 0) out.step_gathers.push_back(all_gather_calls(*counting));
    }
    std::lock_guard<std::mutex> lock(mu);
    out.finals[r] = engine.flat_parameters();
  });
  return out;
}

TEST(GatherCoalescing, EnginePublishesInFewerGathersBitForBit) {
  const int steps = 4;
  for (const int stage : {1, 2}) {
    for (const int world : {2, 4}) {
      for (const bool bf16 : {false, true}) {
        SCOPED_TRACE("stage " + std::to_string(stage) + ", " + std::to_string(world) + " ranks, " +
                     (bf16 ? "bf16" : "fp32"));
        const int64_t bucket = 64;  // every weight is larger: many buckets
        Config cfg = test_config(stage, 48 / world, 1, 0.3, bucket);
        cfg.bf16 = bf16;
        std::vector<int64_t> outs;
        int64_t largest = 0;
        for (const auto& b : tiny_net_layout(world, bucket).buckets()) {
          outs.push_back(b.shard.padded_numel());
          largest = std::max(largest, outs.back());
        }
        ASSERT_GT(outs.size(), 4u);
        // The documented cap: gloo's flat buffers of one coalesced gather (its outputs and 1/world
        // of that for its inputs) no larger than two of the largest bucket's, as the per-bucket
        // gathers held at once.
        const int64_t cap = 2 * largest * world / (world + 1);
        auto bounded_by = [&](int64_t allgather_bucket_size) {
          return expected_gathers(outs, std::min(allgather_bucket_size, cap));
        };
        ASSERT_GT(static_cast<int64_t>(outs.size()), bounded_by(500'000'000) + 2);

        cfg.zero_optimization.allgather_bucket_size = 1;  // each bucket alone: the old path
        const TrainRun per_bucket = train(cfg, world, steps);
        cfg.zero_optimization.allgather_bucket_size = 500'000'000;  // the default
        const TrainRun whole = train(cfg, world, steps);
        cfg.zero_optimization.allgather_bucket_size = 600;
        const TrainRun bounded = train(cfg, world, steps);

        for (int s = 0; s < steps; ++s) {
          EXPECT_EQ(per_bucket.step_gathers[s], static_cast<int64_t>(outs.size()));
          EXPECT_EQ(whole.step_gathers[s], bounded_by(500'000'000));
          EXPECT_EQ(bounded.step_gathers[s], bounded_by(600));
        }
        for (int r = 0; r < world; ++r) {
          EXPECT_TRUE(at::equal(whole.finals[r], per_bucket.finals[r])) << "rank " << r;
          EXPECT_TRUE(at::equal(bounded.finals[r], per_bucket.finals[r])) << "rank " << r;
        }
        if (!bf16) {
          const ReferenceResult ref = train_reference(cfg, steps, 48, /*seed=*/3);
          for (int r = 0; r < world; ++r) {
            EXPECT_LT((whole.finals[r] - ref.params).abs().max().item<double>(), 2e-5);
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace zero::testing
