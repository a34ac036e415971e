// The engine on a fake accelerator (tests/support/fake_device.hpp): parameters that are not CPU
// tensors, so the device half of every path runs (pinned staging, copy streams and events, the
// device read-back, collectives staged through the host), and a host/device mix-up throws.
#include <ATen/ATen.h>
#include <c10/core/Event.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <gtest/gtest.h>
#include <time.h>
#include <unistd.h>

#include <filesystem>
#include <map>
#include <mutex>
#include <optional>

#include "device/event_wait.hpp"
#include "device/pinned_host.hpp"
#include "support/fake_device.hpp"
#include "support/thread_group.hpp"
#include "support/tiny_net.hpp"
#include "zero/activation_checkpointing.hpp"
#include "zero/engine.hpp"
#include "zero/grads/grad_to_host.hpp"

namespace zero::testing {
namespace {

// The device itself first: what the engine tests below rely on.
TEST(FakeDevice, CountsEveryByteAndCopiesBetweenDistinctMemories) {
  const c10::Device dev = fake::device(3);
  const int64_t before = fake::allocated_bytes(3);
  fake::reset_peak(3);
  {
    at::Tensor host = at::arange(10, at::kFloat);
    at::Tensor d = host.to(dev);
    EXPECT_EQ(d.device(), dev);
    EXPECT_EQ(fake::allocated_bytes(3) - before, 40);
    // Kernels run (CPU fallback); views alias.
    at::Tensor v = d.narrow(0, 2, 4);
    v.mul_(2);
    at::Tensor back = d.cpu();
    EXPECT_EQ(back[3].item<float>(), 6.0f);
    EXPECT_EQ(host[3].item<float>(), 3.0f);  // distinct memory: the host copy is untouched
    at::Tensor sum = (d + d).sum();
    EXPECT_EQ(sum.device(), dev);
    EXPECT_EQ(sum.item<float>(), 2 * (45.0f + 2 + 3 + 4 + 5));
    // A mix-up throws as on a GPU.
    EXPECT_ANY_THROW(d.add_(host));
  }
  EXPECT_EQ(fake::allocated_bytes(3), before);
  EXPECT_GE(fake::peak_bytes(3) - before, 80);
  // Pinned host memory is the backend's, and counted; as CUDA's caching host allocator does,
  // it rounds a block up to a power of two (1000 bytes take 1024).
  const int64_t pinned = fake::pinned_in_use_bytes();
  at::Tensor p = at::empty({250}, at::TensorOptions().pinned_memory(true));
  EXPECT_TRUE(p.is_pinned());
  EXPECT_EQ(fake::pinned_in_use_bytes() - pinned, 1024);
}

// Gloo cannot read fake tensors: a group on the fake device type runs each collective on host
// copies and copies the result back at wait(). Each rank's values differ, so a result left on
// the host copy, or a rank's chunk misplaced, shows.
TEST(FakeDeviceGroup, CollectivesStagedThroughTheHostReachTheDevice) {
  run_ranks(
      2,
      [](std::shared_ptr<comm::Group> g) {
        const c10::Device d = fake::device(g->rank());
        const double r = g->rank();
        at::Tensor t = at::full({4}, r + 1, at::TensorOptions().device(d));
        g->all_reduce_sum(t, "all_reduce").wait();
        EXPECT_EQ(t.device(), d);
        EXPECT_TRUE(at::equal(t.cpu(), at::full({4}, 3.0)));

        at::Tensor in = at::arange(6, at::kFloat).add(10 * r).to(d);  // rank r: 10r + [0..5]
        at::Tensor out = at::empty({3}, in.options());
        g->reduce_scatter_sum(out, in, "reduce_scatter").wait();
        // Chunk k summed over ranks: (0+10) + 2 x [3k..3k+2].
        EXPECT_TRUE(at::equal(out.cpu(), at::arange(3, at::kFloat).add(3 * r).mul(2).add(10)));

        at::Tensor mine = at::full({2}, r, in.options());
        at::Tensor all = at::empty({4}, in.options());
        g->all_gather(all, mine, "all_gather").wait();
        EXPECT_TRUE(at::equal(all.cpu(), at::tensor({0.0f, 0.0f, 1.0f, 1.0f})));

        // all_to_all: chunk s of rank r's input becomes chunk r of rank s's output.
        at::Tensor send = at::arange(4, at::kFloat).add(10 * r).to(d);  // 10r + [0..3]
        at::Tensor recv = at::empty({4}, send.options());
        g->all_to_all(recv, send, "all_to_all").wait();
        EXPECT_EQ(recv.device(), d);
        EXPECT_TRUE(at::equal(
            recv.cpu(), at::tensor({2 * r, 2 * r + 1, 10 + 2 * r, 11 + 2 * r}).to(at::kFloat)));

        at::Tensor b = at::full({3}, r + 5, in.options());
        g->broadcast(b, 1, "broadcast").wait();
        EXPECT_TRUE(at::equal(b.cpu(), at::full({3}, 6.0)));
        // A host tensor handed to a fake-device group is a mix-up, refused by name.
        at::Tensor host = at::ones({2});
        EXPECT_THROW(g->all_reduce_sum(host, "all_reduce of a host tensor"), c10::Error);
      },
      std::chrono::seconds(60), fake::device().type());
}

constexpr int kSteps = 4;
constexpr int64_t kRows = 48;
constexpr int kWorld = 2;

// Rank r trains on fake:r, as rank r of a GPU job on GPU r.
c10::Device rank_device(const comm::Group& g) { return fake::device(g.rank()); }

// A TinyNet on the rank's fake device; the engine must keep every parameter there.
std::shared_ptr<TinyNetImpl> net_on(uint64_t seed, c10::Device d) {
  auto net = make_tiny_net(seed);
  net->to(d);
  return net;
}

// How each test's training runs the forward pass: plainly, or through zero::checkpoint.
using Forward = std::function<at::Tensor(TinyNetImpl&, const at::Tensor&)>;
at::Tensor plain(TinyNetImpl& net, const at::Tensor& x) { return net.forward(x); }

// One optimizer step per global batch; the data moves to the device as a real loader's would.
void train_steps(Engine& e, TinyNetImpl& net, int rank, int from, int to,
                 const Forward& forward = plain) {
  const at::Tensor p = net.parameters().front();
  for (int s = from; s < to; ++s) {
    Batch b = rank_micro_batch(global_batch(s, kRows), rank, kWorld, 0, 1);
    const at::Tensor x = b.x.to(p.device(), p.scalar_type());
    e.backward(mse(forward(net, x).to(at::kFloat), b.y.to(p.device())));
    e.step();
  }
}

struct Result {
  std::vector<at::Tensor> params;  // per rank, on the host
  std::vector<std::vector<double>> norms;
};

// Trains a TinyNet on 2 ranks' fake devices through the engine.
Result train_on_fake(const Config& cfg, uint64_t seed, const Forward& forward = plain) {
  Result out;
  out.params.resize(kWorld);
  out.norms.resize(kWorld);
  std::mutex mu;
  run_ranks(
      kWorld,
      [&](std::shared_ptr<comm::Group> group) {
        const int r = group->rank();
        auto net = net_on(seed, rank_device(*group));
        auto engine = initialize(net, cfg, group);
        for (const auto& p : net->parameters()) EXPECT_EQ(p.device(), rank_device(*group));
        for (int s = 0; s < kSteps; ++s) {
          train_steps(engine, *net, r, s, s + 1, forward);
          // The device path reads the step's verdict one step late; settle it now.
          const double norm = engine.settled_stats().last_grad_norm;
          std::lock_guard<std::mutex> lock(mu);
          out.norms[r].push_back(norm);
        }
        at::Tensor flat = engine.flat_parameters();
        EXPECT_EQ(flat.device(), rank_device(*group));
        std::lock_guard<std::mutex> lock(mu);
        out.params[r] = flat.cpu();
      },
      std::chrono::seconds(60), fake::device().type());
  return out;
}

void expect_matches_reference(const Config& cfg, uint64_t seed, const Result& got) {
  const ReferenceResult ref = train_reference(cfg, kSteps, kRows, seed);
  for (int r = 0; r < kWorld; ++r) {
    ASSERT_EQ(got.params[r].numel(), ref.params.numel());
    EXPECT_LT((got.params[r] - ref.params).abs().max().item<double>(), 2e-5) << "rank " << r;
    for (int s = 0; s < kSteps; ++s) {
      EXPECT_NEAR(got.norms[r][s], ref.grad_norms[s], 1e-5 * ref.grad_norms[s]) << "step " << s;
    }
  }
  // Training moved the parameters, so equality is not trivial.
  EXPECT_GT((ref.params - flatten(*make_tiny_net(seed))).abs().max().item<double>(), 1e-2);
}

Config config(int stage, const std::string& optimizer, bool offload = false) {
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

struct Case {
  int stage;
  const char* optimizer;
  bool offload;
};

class FakeDeviceEquivalence : public ::testing::TestWithParam<Case> {};

// Single-process torch::optim training on the host is the reference; the engine trains on two
// fake devices whose collectives are staged through gloo on the host.
TEST_P(FakeDeviceEquivalence, MatchesSingleProcessTraining) {
  const Case c = GetParam();
  const Config cfg = config(c.stage, c.optimizer, c.offload);
  expect_matches_reference(cfg, 3, train_on_fake(cfg, 3));
}

// zero_quantized_gradients on a device gloo cannot read: the all-to-all of codes and scales is
// staged through the host, the residuals stay on the device. SGD with momentum against the
// reference, within the bound test_compressed_reduce.cpp derives: 2 x 2 lr |e| / (1 - beta),
// |e| <= the largest gradient norm / 254.
TEST(FakeDeviceCompressed, Int8WithErrorFeedbackTracksTheReference) {
  Config cfg = config(2, "SGD");
  const ReferenceResult ref = train_reference(cfg, kSteps, kRows, 3);
  cfg.zero_optimization.quantized_gradients = {true, 8, 32, true};
  const Result got = train_on_fake(cfg, 3);
  double max_norm = 0;
  for (double n : ref.grad_norms) max_norm = std::max(max_norm, n);
  const double bound = 2 * 2 * cfg.optimizer.lr * (max_norm / 254) / (1 - 0.9);
  for (int r = 0; r < kWorld; ++r) {
    const double diff = (got.params[r] - ref.params).abs().max().item<double>();
    EXPECT_LT(diff, bound) << "rank " << r;
    EXPECT_GT(diff, 0.0) << "rank " << r << ": the gradients were not quantized";
  }
}

INSTANTIATE_TEST_SUITE_P(StagesAndOptimizers, FakeDeviceEquivalence,
                         ::testing::Values(Case{0, "AdamW", false}, Case{1, "AdamW", false},
                                           Case{2, "AdamW", false}, Case{0, "SGD", false},
                                           Case{1, "SGD", false}, Case{2, "SGD", false},
                                           // Optimizer offload (issue 21, defect 1: it could not
                                           // start on a model whose parameters are not on the CPU).
                                           Case{1, "AdamW", true}, Case{2, "AdamW", true},
                                           Case{2, "SGD", true}),
                         [](const ::testing::TestParamInfo<Case>& info) {
                           const Case& c = info.param;
                           return std::string(c.optimizer) + "_stage" + std::to_string(c.stage) +
                                  (c.offload ? "_offload" : "");
                         });

// The forward pass through zero::checkpoint, the block's input offloaded to the host.
Forward checkpointed(ActivationOffloader& offloader) {
  return [&offloader](TinyNetImpl& net, const at::Tensor& x) {
    CheckpointOptions o;
    o.offload = &offloader;
    return checkpoint([&net](const at::Tensor& in) { return net.forward(in); }, x, o);
  };
}

// Activation checkpointing on the device, its saved inputs offloaded to the host through the
// copy engine's stream and events (device/device_copy.cpp, the CUDA path's code).
TEST(FakeDeviceCheckpointing, RecomputedTrainingMatchesSingleProcessTraining) {
  const Config cfg = config(2, "AdamW");
  ActivationOffloader offloader;
  expect_matches_reference(cfg, 4, train_on_fake(cfg, 4, checkpointed(offloader)));
  const OffloadStats st = offloader.stats();
  EXPECT_EQ(st.offloaded, kSteps * kWorld);
  EXPECT_EQ(st.fetched, kSteps * kWorld);
  EXPECT_EQ(st.device_bytes_kept, 0);
}

// Events that complete 2 ms after they were recorded: every "has the copy finished?" poll
// (the offloader releasing a copied input, the step's read-back one step late) first sees "no",
// and every host wait (a gradient slot landing, the verdict) really waits.
TEST(FakeDeviceSlowEvents, OffloadAndCheckpointingMatchTrainingWhenCopiesFinishLate) {
  fake::set_event_delay(std::chrono::milliseconds(2));
  struct Restore {
    ~Restore() { fake::set_event_delay(std::chrono::microseconds(0)); }
  } restore;
  const Config cfg = config(2, "AdamW", /*offload=*/true);
  ActivationOffloader offloader;
  expect_matches_reference(cfg, 4, train_on_fake(cfg, 4, checkpointed(offloader)));
  offloader.synchronize();
  EXPECT_EQ(offloader.stats().device_bytes_kept, 0);
  EXPECT_EQ(offloader.stats().fetched, kSteps * kWorld);
}

// TinyNet's modules registered head first: the engine lays parameters out in reverse
// registration order, so head's gradients (the first to arrive) land in the last bucket and,
// from the second step on, the engine releases its buckets in the observed arrival order
// (zero/engine/release_order.cpp), on the device and under offload.
struct HeadFirstImpl : torch::nn::Module {
  explicit HeadFirstImpl(std::shared_ptr<TinyNetImpl> t) : net(std::move(t)) {
    register_module("head", net->head);
    register_module("fc1", net->fc1);
    register_module("norm", net->norm);
    register_module("fc2", net->fc2);
  }
  std::shared_ptr<TinyNetImpl> net;  // computes; its modules are registered above, reordered
};

class FakeDeviceArrivalOrder : public ::testing::TestWithParam<bool> {};

TEST_P(FakeDeviceArrivalOrder, BucketsOutOfLayoutOrderMatchSingleProcessTraining) {
  const Config cfg = config(2, "AdamW", /*offload=*/GetParam());
  std::vector<at::Tensor> finals(kWorld);
  run_ranks(
      kWorld,
      [&](std::shared_ptr<comm::Group> group) {
        auto model = std::make_shared<HeadFirstImpl>(net_on(8, rank_device(*group)));
        auto engine = initialize(model, cfg, group);
        train_steps(engine, *model->net, group->rank(), 0, kSteps);
        // In TinyNet's parameter order, as the reference flattens it.
        std::map<std::string, at::Tensor> sd;
        for (auto& [name, t] : engine.state_dict()) sd[name] = t;
        std::vector<at::Tensor> parts;
        for (const auto& item : make_tiny_net(8)->named_parameters()) {
          parts.push_back(sd.at(item.key()).reshape(-1).cpu());
        }
        finals[group->rank()] = at::cat(parts);
      },
      std::chrono::seconds(60), fake::device().type());
  const ReferenceResult ref = train_reference(cfg, kSteps, kRows, 8);
  for (int r = 0; r < kWorld; ++r) {
    EXPECT_LT((finals[r] - ref.params).abs().max().item<double>(), 2e-5) << "rank " << r;
  }
}

INSTANTIATE_TEST_SUITE_P(WithAndWithoutOffload, FakeDeviceArrivalOrder, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return std::string(info.param ? "offload" : "on_device");
                         });

std::string temp_dir(const std::string& name) {
  return (std::filesystem::temp_directory_path() / (name + "_" + std::to_string(::getpid())))
      .string();
}

// Saved from the fake devices, loaded into fresh engines on them: training resumes where it
// would have gone on (with and without optimizer offload on either side).
class FakeDeviceCheckpoint : public ::testing::TestWithParam<bool> {};

TEST_P(FakeDeviceCheckpoint, SaveLoadRoundTripResumesTraining) {
  const bool offload = GetParam();
  const std::string dir = temp_dir(std::string("zero_fake_ckpt") + (offload ? "_off" : ""));
  std::filesystem::remove_all(dir);
  const Config cfg = config(2, "AdamW", offload);
  const auto masters = [](Engine& e) {
    std::vector<at::Tensor> parts;
    for (auto& [name, t] : e.state_dict()) parts.push_back(t.reshape(-1));
    return at::cat(parts);
  };
  std::vector<at::Tensor> saved(kWorld), straight(kWorld), loaded(kWorld), resumed(kWorld);
  const auto dev = fake::device().type();
  run_ranks(
      kWorld,
      [&](std::shared_ptr<comm::Group> group) {
        const int r = group->rank();
        auto net = net_on(6, rank_device(*group));
        auto engine = initialize(net, cfg, group);
        train_steps(engine, *net, r, 0, 2);
        const int64_t pinned_before = fake::pinned_allocations();
        engine.save_checkpoint(dir, "two");
        // The pieces on the device travel through a page-locked staging buffer (a pageable one
        // makes the driver stage every copy itself); under offload they are host memory already.
        if (!offload) EXPECT_GT(fake::pinned_allocations(), pinned_before) << "rank " << r;
        // A later save reuses that buffer: page-locking memory per save is slow, and freeing
        // it (cudaFreeHost) synchronises the device. Both ranks made theirs in the first save
        // (its collectives come after write_shard), so no other thread allocates meanwhile.
        const int64_t pinned_after_first = fake::pinned_allocations();
        engine.save_checkpoint(dir, "again");
        EXPECT_EQ(fake::pinned_allocations(), pinned_after_first) << "rank " << r;
        saved[r] = masters(engine);
        train_steps(engine, *net, r, 2, 4);
        straight[r] = masters(engine);
      },
      std::chrono::seconds(60), dev);
  run_ranks(
      kWorld,
      [&](std::shared_ptr<comm::Group> group) {
        const int r = group->rank();
        auto net = net_on(99, rank_device(*group));  // other weights: the load must replace them
        auto engine = initialize(net, cfg, group);
        const int64_t pinned_before = fake::pinned_allocations();
        EXPECT_EQ(engine.load_checkpoint(dir, "two"), "two");
        if (!offload) EXPECT_GT(fake::pinned_allocations(), pinned_before) << "rank " << r;
        loaded[r] = masters(engine);
        train_steps(engine, *net, r, 2, 4);
        resumed[r] = masters(engine);
      },
      std::chrono::seconds(60), dev);
  for (int r = 0; r < kWorld; ++r) {
    EXPECT_TRUE(at::equal(loaded[r].cpu(), saved[r].cpu())) << "rank " << r;
    EXPECT_TRUE(at::equal(resumed[r].cpu(), straight[r].cpu())) << "rank " << r;
    EXPECT_FALSE(at::equal(resumed[r].cpu(), saved[r].cpu())) << "training went on";
  }
  std::filesystem::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(WithAndWithoutOffload, FakeDeviceCheckpoint, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return std::string(info.param ? "offload" : "on_device");
                         });

// The fake allocator counts each device's bytes exactly, so what initialize leaves on the device
// must be exactly what the engine reports: the device part of its memory report, less the
// parameters it replaced. The engine's own allocator reading (zero::allocated_bytes through
// c10's DeviceAllocator interface) must see the same figure.
class FakeDeviceMemory : public ::testing::TestWithParam<std::tuple<int, bool, bool>> {};

TEST_P(FakeDeviceMemory, InitializeAllocatesExactlyTheReportedDeviceBytes) {
  const auto [stage, bf16, offload] = GetParam();
  Config cfg = config(stage, "AdamW", offload);
  cfg.bf16 = bf16;
  std::vector<int64_t> added(kWorld), peak_step(kWorld), after_step(kWorld), after_init(kWorld);
  std::vector<MemoryReport> reports(kWorld);
  run_ranks(
      kWorld,
      [&](std::shared_ptr<comm::Group> group) {
        const int r = group->rank();
        auto net = net_on(5, rank_device(*group));
        const int64_t before = fake::allocated_bytes(r);
        auto engine = initialize(net, cfg, group);
        after_init[r] = fake::allocated_bytes(r);
        added[r] = after_init[r] - before;
        reports[r] = engine.memory_report();
        fake::reset_peak(r);
        train_steps(engine, *net, r, 0, 3);
        peak_step[r] = fake::peak_bytes(r) - after_init[r];
        after_step[r] = fake::allocated_bytes(r) - after_init[r];
      },
      std::chrono::seconds(60), fake::device().type());
  for (int r = 0; r < kWorld; ++r) {
    const MemoryReport& rep = reports[r];
    const int64_t device_part = rep.measured.total() - rep.host_measured;
    std::printf(
        "stage %d %s%s rank %d: fake allocator +%lld B over initialize, report device part "
        "%lld B - replaced %lld B; steps: peak +%lld B, kept %+lld B\n",
        stage, bf16 ? "bf16" : "fp32", offload ? " offload" : "", r,
        static_cast<long long>(added[r]), static_cast<long long>(device_part),
        static_cast<long long>(rep.replaced_param_bytes), static_cast<long long>(peak_step[r]),
        static_cast<long long>(after_step[r]));
    // Plus one fp32 scalar the report does not count: the step count the fused AdamW kernel
    // reads from the device (optim/adamw.cpp, step_); the host optimizer under offload has none.
    const int64_t step_count = offload ? 0 : 4;
    EXPECT_EQ(added[r], device_part - rep.replaced_param_bytes + step_count) << "rank " << r;
    EXPECT_EQ(rep.allocator_delta, added[r]) << "rank " << r << ": the engine's own reading";
    // Offload's device part can be smaller than the parameters it replaced: initialize then
    // freed memory, and the report says so in units, not as a raw negative count.
    const std::string text = format_memory_report(rep);
    const std::string said = added[r] < 0 ? "initialize freed " + format_bytes(-added[r]) + " net"
                                          : "initialize added " + format_bytes(added[r]);
    EXPECT_NE(text.find(said), std::string::npos) << text;
  }
}

INSTANTIATE_TEST_SUITE_P(
    StagesDtypesOffload, FakeDeviceMemory,
    ::testing::Values(std::make_tuple(0, false, false), std::make_tuple(1, false, false),
                      std::make_tuple(2, false, false), std::make_tuple(2, true, false),
                      std::make_tuple(1, false, true), std::make_tuple(2, true, true)));

// Offload's gradient pieces leave the device in fp32 (grad_to_host.hpp), and their squared norm
// is summed on the device as they go: the step reads no host memory for it. A range that gets a
// second piece (summed on the host) leaves the device without the norm, and so does a CPU run.
TEST(FakeDeviceGradToHost, NormOfTheShardIsSummedOnTheDevice) {
  const c10::Device d = fake::device(0);
  GradToHost to_host(d, /*slot_numel=*/5, at::kBFloat16, at::kFloat);
  at::Tensor shard = device::host_zeros(10, /*pin=*/true).fill_(7);  // last window's values
  auto gen = at::detail::createCPUGenerator(5);
  const at::Tensor values = at::randn({10}, gen).to(at::kBFloat16);
  to_host.new_window();
  for (int k = 0; k < 2; ++k) {
    const at::Tensor piece = values.narrow(0, 5 * k, 5).to(d);
    to_host.wait(to_host.send(piece, shard.narrow(0, 5 * k, 5), /*add=*/true));
  }
  to_host.finish(shard);
  EXPECT_TRUE(at::equal(shard, values.to(at::kFloat)));
  const at::Tensor sq = to_host.squared_norm();
  ASSERT_TRUE(sq.defined());
  EXPECT_EQ(sq.device(), d);
  const double want = shard.square().sum().item<double>();
  EXPECT_NEAR(sq.cpu().item<double>(), want, 1e-6 * want);
  // A second piece into a written range: the sum, and so the norm, is the host's.
  to_host.send(values.narrow(0, 0, 5).to(d), shard.narrow(0, 0, 5), /*add=*/true);
  to_host.finish(shard);
  EXPECT_FALSE(to_host.squared_norm().defined());
  to_host.new_window();
  GradToHost on_host(at::kCPU, 5, at::kBFloat16, at::kFloat);
  on_host.new_window();
  on_host.send(values.narrow(0, 0, 5), shard.narrow(0, 0, 5), /*add=*/true);
  EXPECT_FALSE(on_host.squared_norm().defined());
}

// Direct copies (a range's first piece) and slot copies (a later piece, summed on the host) share
// one queue: with every slot busy and direct copies older than them, the next later piece must
// land copies until a slot is free, not just the oldest (a direct one, which frees none). Three
// ranges first get one piece each (three direct copies in flight), then four more rounds of
// pieces go through the three slots; the events finish late, so nothing lands early.
TEST(FakeDeviceGradToHost, LaterPiecesFindASlotBehindDirectCopies) {
  fake::set_event_delay(std::chrono::milliseconds(2));
  struct Restore {
    ~Restore() { fake::set_event_delay(std::chrono::microseconds(0)); }
  } restore;
  const c10::Device d = fake::device(0);
  constexpr int kRanges = 3, kRounds = 5, kNumel = 4;
  GradToHost to_host(d, kNumel, at::kFloat, at::kFloat);
  at::Tensor shard = device::host_zeros(kRanges * kNumel, /*pin=*/true).fill_(7);
  auto gen = at::detail::createCPUGenerator(11);
  const at::Tensor pieces = at::randn({kRounds, kRanges * kNumel}, gen);
  to_host.new_window();
  for (int round = 0; round < kRounds; ++round) {
    for (int r = 0; r < kRanges; ++r) {
      const at::Tensor piece = pieces[round].narrow(0, r * kNumel, kNumel).to(d);
      to_host.wait(to_host.send(piece, shard.narrow(0, r * kNumel, kNumel), /*add=*/true));
    }
  }
  to_host.finish(shard);
  // The reference: the pieces summed in fp32 in the order they were sent.
  at::Tensor want = at::zeros({kRanges * kNumel});
  for (int round = 0; round < kRounds; ++round) want.add_(pieces[round]);
  EXPECT_TRUE(at::allclose(shard, want, 1e-6, 1e-6));
}

// The host's wait for a device event polls and sleeps instead of spinning (cudaEventSynchronize
// spins under CUDA's default scheduling): over a 40 ms wait the thread uses a fraction of a core.
TEST(FakeDeviceEvents, HostWaitForAnEventSleeps) {
  fake::set_event_delay(std::chrono::milliseconds(40));
  struct Restore {
    ~Restore() { fake::set_event_delay(std::chrono::microseconds(0)); }
  } restore;
  const c10::Device d = fake::device(0);
  const c10::impl::VirtualGuardImpl guard(d.type());
  c10::Event event(d.type());
  event.record(guard.getStream(d));
  const auto cpu_now = [] {
    timespec ts{};
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return std::chrono::seconds(ts.tv_sec) + std::chrono::nanoseconds(ts.tv_nsec);
  };
  const auto wall0 = std::chrono::steady_clock::now();
  const auto cpu0 = cpu_now();
  device::wait_for_event(event);
  const auto wall = std::chrono::steady_clock::now() - wall0;
  const auto cpu = cpu_now() - cpu0;
  EXPECT_TRUE(event.query());
  EXPECT_GE(wall, std::chrono::milliseconds(35));
  EXPECT_LT(cpu, wall / 4) << "cpu " << std::chrono::duration<double>(cpu).count() << " s of "
                           << std::chrono::duration<double>(wall).count() << " s";
}

// A real gloo group that says it is bound to `bound`, as an NCCL group is bound to LOCAL_RANK's
// GPU (comm/nccl.cpp): its collectives would run there whatever device the model is on.
class BoundGroup final : public comm::Group {
 public:
  BoundGroup(std::shared_ptr<comm::Group> g, c10::Device bound) : g_(std::move(g)), bound_(bound) {}
  int rank() const override { return g_->rank(); }
  int size() const override { return g_->size(); }
  std::string name() const override { return g_->name(); }
  int global_rank(int r) const override { return g_->global_rank(r); }
  const comm::GroupOptions& options() const override { return g_->options(); }
  std::optional<c10::Device> bound_device() const override { return bound_; }
  comm::Work all_reduce_sum(at::Tensor& t, const std::string& w) override {
    return g_->all_reduce_sum(t, w);
  }
  comm::Work reduce_scatter_sum(at::Tensor& o, at::Tensor& i, const std::string& w) override {
    return g_->reduce_scatter_sum(o, i, w);
  }
  comm::Work all_gather(at::Tensor& o, at::Tensor& i, const std::string& w) override {
    return g_->all_gather(o, i, w);
  }
  comm::Work all_to_all(at::Tensor& o, at::Tensor& i, const std::string& w) override {
    return g_->all_to_all(o, i, w);
  }
  comm::Work broadcast(at::Tensor& t, int root, const std::string& w) override {
    return g_->broadcast(t, root, w);
  }
  void barrier(const std::string& w) override { g_->barrier(w); }
  comm::Work send(at::Tensor& t, int dst, const std::string& w, int tag) override {
    return g_->send(t, dst, w, tag);
  }
  comm::Work recv(at::Tensor& t, int src, const std::string& w, int tag) override {
    return g_->recv(t, src, w, tag);
  }
  std::shared_ptr<comm::Group> split(int color, int key, const std::string& n) override {
    return g_->split(color, key, n);
  }

 private:
  std::shared_ptr<comm::Group> g_;
  c10::Device bound_;
};

// A model on another device than the one the group is bound to (set_current_device picked the
// model's GPU, LOCAL_RANK another) stops initialize at once with both devices and the fix,
// before any collective could hang; a model on the bound device trains.
TEST(FakeDeviceBoundGroup, ModelOnAnotherDeviceThanTheGroupIsAClearError) {
  const Config cfg = config(2, "AdamW");
  run_ranks(
      kWorld,
      [&](std::shared_ptr<comm::Group> group) {
        const int r = group->rank();
        const c10::Device other = fake::device(1 - r);
        try {
          initialize(net_on(1, rank_device(*group)), cfg,
                     std::make_shared<BoundGroup>(group, other));
          ADD_FAILURE() << "rank " << r << ": expected an error";
        } catch (const c10::Error& e) {
          const std::string m = e.what();
          EXPECT_NE(m.find("the model is on " + rank_device(*group).str()), std::string::npos) << m;
          EXPECT_NE(m.find("is bound to " + other.str()), std::string::npos) << m;
          EXPECT_NE(m.find("LOCAL_RANK"), std::string::npos) << m;
        }
        auto net = net_on(1, rank_device(*group));
        auto engine =
            initialize(net, cfg, std::make_shared<BoundGroup>(group, rank_device(*group)));
        train_steps(engine, *net, r, 0, 1);
      },
      std::chrono::seconds(60), fake::device().type());
}

// One rank alone on the wrong device (rank 1's model on fake:1, its group bound to fake:0):
// rank 0 must not go on into the parameter broadcast and wait there for rank 1 until
// comm_timeout_s (20 s here). Both stop at once with the same error, naming rank 1's devices.
TEST(FakeDeviceBoundGroup, OneRankOnAnotherDeviceStopsEveryRankAtOnce) {
  const Config cfg = config(2, "AdamW");
  std::vector<std::string> messages(kWorld);
  std::vector<double> seconds(kWorld);
  run_ranks(
      kWorld,
      [&](std::shared_ptr<comm::Group> group) {
        const int r = group->rank();
        const c10::Device bound = r == 1 ? fake::device(0) : rank_device(*group);
        const auto t0 = std::chrono::steady_clock::now();
        try {
          initialize(net_on(1, rank_device(*group)), cfg,
                     std::make_shared<BoundGroup>(group, bound));
          ADD_FAILURE() << "rank " << r << ": expected an error";
        } catch (const c10::Error& e) {
          messages[r] = e.what_without_backtrace();
        }
        seconds[r] = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      },
      std::chrono::seconds(20), fake::device().type());
  EXPECT_EQ(messages[0], messages[1]);
  EXPECT_NE(messages[0].find("every rank stops, rank 1: the model is on " + fake::device(1).str() +
                             " but the process group"),
            std::string::npos)
      << messages[0];
  EXPECT_NE(messages[0].find("is bound to " + fake::device(0).str()), std::string::npos);
  EXPECT_EQ(messages[0].find("rank 0:"), std::string::npos) << messages[0];
  for (int r = 0; r < kWorld; ++r) EXPECT_LT(seconds[r], 10.0) << "rank " << r << " waited";
}

// Optimizer offload's host buffers (master, moments, gradient shard, compute-dtype copy, the
// gradient ring) are long-lived and large. The page-locked memory the process holds for them
// (cached free blocks included) must be what they declare, give or take a page a buffer, not the
// caching host allocator's power-of-two blocks: on an H200, 23.15 GiB of host tensors held
// 36.4 GiB pinned. A 1000 x 1499 layer makes each shard 3 MB, which a power of two rounds to 4 MiB.
class FakeDeviceHostMemory : public ::testing::TestWithParam<bool> {};

TEST_P(FakeDeviceHostMemory, PinnedHostMemoryIsTheDeclaredOffloadBuffers) {
  const bool bf16 = GetParam();
  // One bucket for the whole model: the ring's slots are shards of the model's size too.
  Config cfg = test_config(2, 4, 1, 0, /*bucket=*/int64_t{1} << 22);
  cfg.bf16 = bf16;
  cfg.zero_optimization.offload_optimizer.enabled = true;
  cfg.zero_optimization.offload_optimizer.threads = 1;
  std::vector<MemoryReport> reports(kWorld);
  std::vector<int64_t> held(kWorld), in_use(kWorld);
  const int64_t held_before = fake::pinned_bytes();
  const int64_t in_use_before = fake::pinned_in_use_bytes();
  run_ranks(
      kWorld,
      [&](std::shared_ptr<comm::Group> group) {
        const int r = group->rank();
        const c10::Device d = rank_device(*group);
        auto gen = at::detail::createCPUGenerator(11);
        auto net = std::make_shared<torch::nn::LinearImpl>(1000, 1499);
        net->to(d, bf16 ? at::kBFloat16 : at::kFloat);
        auto engine = initialize(net, cfg, group);
        for (int s = 0; s < 2; ++s) {
          const at::Tensor x = at::randn({4, 1000}, gen).to(d, net->weight.scalar_type());
          engine.backward(net->forward(x).to(at::kFloat).pow(2).mean());
          engine.step();
        }
        engine.settled_stats();
        reports[r] = engine.memory_report();
        group->barrier("both ranks hold their buffers");
        held[r] = fake::pinned_bytes() - held_before;
        in_use[r] = fake::pinned_in_use_bytes() - in_use_before;
        group->barrier("both ranks read the allocator");
      },
      std::chrono::seconds(120), fake::device().type());
  int64_t declared = 0;
  int64_t buffers = 0;
  for (const MemoryReport& rep : reports) {
    declared += rep.host_measured;
    // Each rank's buffers, each up to a page over: master, 2 moments, gradient shard, the
    // compute-dtype copy and 3 ring slots.
    buffers += 8;
    EXPECT_LE(rep.host_pinned, rep.host_measured + 8 * device::kHostPageBytes)
        << "the memory report's pinned figure";
  }
  ASSERT_GT(declared, 2 * 5 * 3'000'000) << "the buffers are large enough to be rounded";
  const int64_t bound = declared + buffers * device::kHostPageBytes;
  std::printf("%s: declared host buffers %lld B; pinned held %lld B, in use %lld B\n",
              bf16 ? "bf16" : "fp32", static_cast<long long>(declared),
              static_cast<long long>(held[0]), static_cast<long long>(in_use[0]));
  EXPECT_LE(held[0], bound) << "pinned memory held beyond the declared host buffers";
  EXPECT_LE(in_use[0], bound);
  EXPECT_GE(in_use[0], declared) << "every declared buffer is page-locked";
}

INSTANTIATE_TEST_SUITE_P(Fp32AndBf16, FakeDeviceHostMemory, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return std::string(info.param ? "bf16" : "fp32");
                         });

}  // namespace
}  // namespace zero::testing
