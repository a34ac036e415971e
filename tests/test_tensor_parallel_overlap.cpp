// The column-parallel layers' overlapped backward (Megatron's
// LinearWithGradAccumulationAndAsyncCommunication): the fused products compute, bit for bit, what
// autograd computes for the composition they replace (copy_to_region or
// gather_from_sequence_region, then at::linear per product: autograd's own linear backward and
// its sum of the input's gradients), with the overlap on and off; under sequence parallelism
// the backward really has two collectives in flight: the input's all-gather and the input
// gradient's reduce-scatter both start before either is waited for; and without it the weight
// gradients' products (aten::mm, seen by a RecordFunction callback) run between the start of the
// input gradient's all-reduce and its wait, where the unoverlapped order runs them after it.
// zero-train's switch: tensor_parallel.overlap_comm, parsed and applied to the example TP GPT by
// set_overlap_comm as the trainers do, decides that order in the whole model's backward (off:
// every collective waited before anything else runs), with and without SP, and the loss and
// gradients are the same bits either way.
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/record_function.h>

#include <algorithm>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "comm/group.hpp"
#include "support/forwarding_group.hpp"
#include "support/thread_group.hpp"
#include "zero/comm_overlap.hpp"
#include "zero/config.hpp"
#include "zero/models/tp_gpt.hpp"
#include "zero/tensor_parallel.hpp"
#include "zero/tensor_parallel/column_parallel_linears.hpp"
#include "zero/tensor_parallel/overlap.hpp"
#include "zero/tensor_parallel/sequence_parallel_linear.hpp"

namespace zero::testing {
namespace {

using tensor_parallel::column_parallel_linears;
using tensor_parallel::sequence_parallel_linears;

// Forwards every call, and writes "start <op>" when a collective is issued and "wait <op>" when
// its Work is waited for.
class RecordingGroup final : public ForwardingGroup {
 public:
  using ForwardingGroup::ForwardingGroup;
  comm::Work all_reduce_sum(at::Tensor& t, const std::string& what) override {
    return record("all_reduce", inner().all_reduce_sum(t, what));
  }
  comm::Work reduce_scatter_sum(at::Tensor& out, at::Tensor& in, const std::string& what) override {
    return record("reduce_scatter", inner().reduce_scatter_sum(out, in, what));
  }
  comm::Work all_gather(at::Tensor& out, at::Tensor& in, const std::string& what) override {
    return record("all_gather", inner().all_gather(out, in, what));
  }
  std::vector<std::string> events;

 private:
  comm::Work record(const std::string& op, comm::Work inner) {
    events.push_back("start " + op);
    auto work = std::make_shared<comm::Work>(std::move(inner));
    return comm::Work([this, op, work] {
      events.push_back("wait " + op);
      work->wait();
    });
  }
};

struct Grads {
  std::vector<at::Tensor> out;
  at::Tensor x, w[3], b[3];
};

// Three products of one input (q, k, v), a [B, S, H] input that differs by rank, the output's
// gradient too: the input's gradient is a sum over products and ranks.
Grads run(int rank, const std::shared_ptr<zero::Group>& g, bool sp, bool bias, int mode) {
  at::Generator gen = at::detail::createCPUGenerator(7);
  constexpr int64_t B = 2, S = 8, H = 12, O = 6;
  const int T = g->size();
  const at::Tensor full_x = at::randn({B, S, H}, gen) + rank;
  at::Tensor x = (sp ? full_x.chunk(T, 1)[rank].contiguous() : full_x).clone().requires_grad_();
  std::vector<at::Tensor> w, b;
  for (int i = 0; i < 3; ++i) {
    w.push_back(at::randn({O, H}, gen).requires_grad_());
    b.push_back(bias ? at::randn({O}, gen).requires_grad_() : at::Tensor());
  }
  std::vector<at::Tensor> y;
  if (mode == 2) {  // the composition autograd differentiates by itself
    const at::Tensor in = sp ? tensor_parallel::gather_from_sequence_region(x, g, 1)
                             : tensor_parallel::copy_to_region(x, g);
    for (int i = 0; i < 3; ++i) y.push_back(at::linear(in, w[i], b[i]));
  } else if (sp) {
    y = sequence_parallel_linears(w, b, x, g, 1, /*overlap=*/mode == 1);
  } else {
    y = column_parallel_linears(w, b, x, g, /*overlap=*/mode == 1);
  }
  at::Tensor loss;
  for (int i = 0; i < 3; ++i) {
    const at::Tensor dy = at::randn(y[i].sizes(), gen) * (i + 1 + rank);
    const at::Tensor term = (y[i] * dy).sum();
    loss = loss.defined() ? loss + term : term;
  }
  loss.backward();
  Grads out;
  for (const at::Tensor& t : y) out.out.push_back(t.detach());
  out.x = x.grad();
  for (int i = 0; i < 3; ++i) {
    out.w[i] = w[i].grad();
    if (bias) out.b[i] = b[i].grad();
  }
  return out;
}

void expect_equal(const Grads& a, const Grads& want, const std::string& what) {
  for (size_t i = 0; i < want.out.size(); ++i)
    EXPECT_TRUE(at::equal(a.out[i], want.out[i])) << what << ": output " << i;
  EXPECT_TRUE(at::equal(a.x, want.x)) << what << ": input gradient";
  for (int i = 0; i < 3; ++i) {
    EXPECT_TRUE(at::equal(a.w[i], want.w[i])) << what << ": weight gradient " << i;
    if (want.b[i].defined()) EXPECT_TRUE(at::equal(a.b[i], want.b[i])) << what << ": bias " << i;
  }
}

TEST(TensorParallelOverlap, FusedProductsEqualAutogradsCompositionBitForBit) {
  for (int world : {2, 4}) {
    for (bool sp : {false, true}) {
      for (bool bias : {true, false}) {
        const std::string what = "T=" + std::to_string(world) + (sp ? " SP" : "") +
                                 (bias ? " with bias" : " without bias");
        run_ranks(world, [&](std::shared_ptr<comm::Group> g) {
          const Grads want = run(g->rank(), g, sp, bias, 2);
          expect_equal(run(g->rank(), g, sp, bias, 1), want, what + ", overlapped");
          expect_equal(run(g->rank(), g, sp, bias, 0), want, what + ", waited at once");
        });
      }
    }
  }
}

TEST(TensorParallelOverlap, SequenceParallelBackwardHasBothCollectivesInFlight) {
  for (bool overlap : {true, false}) {
    std::vector<std::vector<std::string>> events(2);
    run_ranks(2, [&](std::shared_ptr<comm::Group> g) {
      auto rec = std::make_shared<RecordingGroup>(g);
      at::Generator gen = at::detail::createCPUGenerator(3);
      at::Tensor x = at::randn({2, 4, 8}, gen).requires_grad_();
      const at::Tensor w = at::randn({6, 8}, gen).requires_grad_();
      const auto y = sequence_parallel_linears({w}, {}, x, rec, 1, overlap);
      rec->events.clear();  // forward's all-gather
      y[0].sum().backward();
      events[g->rank()] = rec->events;
    });
    const std::vector<std::string> want =
        overlap ? std::vector<std::string>{"start all_gather", "start reduce_scatter",
                                           "wait all_gather", "wait reduce_scatter"}
                : std::vector<std::string>{"start all_gather", "wait all_gather",
                                           "start reduce_scatter", "wait reduce_scatter"};
    for (int r = 0; r < 2; ++r) EXPECT_EQ(events[r], want) << "rank " << r << " overlap " << overlap;
  }
}

// Where this thread's aten::mm calls go (a RecordFunction callback is a plain function pointer).
// The CPU backward runs on the thread that calls backward(), i.e. the rank's own.
thread_local std::vector<std::string>* mm_events = nullptr;

std::unique_ptr<at::ObserverContext> record_mm(const at::RecordFunction& fn) {
  if (mm_events && std::string_view(fn.name()) == "aten::mm") mm_events->push_back("mm");
  return nullptr;
}

TEST(TensorParallelOverlap, InputGradientAllReduceRunsDuringTheWeightGradients) {
  for (bool overlap : {true, false}) {
    std::vector<std::vector<std::string>> events(2);
    run_ranks(2, [&](std::shared_ptr<comm::Group> g) {
      // A thread-local callback: added on the rank's own thread.
      const auto callback = at::addThreadLocalCallback(
          at::RecordFunctionCallback(record_mm).scopes({at::RecordScope::FUNCTION}));
      auto rec = std::make_shared<RecordingGroup>(g);
      at::Generator gen = at::detail::createCPUGenerator(3);
      at::Tensor x = at::randn({2, 4, 8}, gen).requires_grad_();
      const at::Tensor w1 = at::randn({6, 8}, gen).requires_grad_();
      const at::Tensor w2 = at::randn({6, 8}, gen).requires_grad_();
      const auto y = column_parallel_linears({w1, w2}, {}, x, rec, overlap);
      rec->events.clear();
      mm_events = &rec->events;
      (y[0].sum() + y[1].sum()).backward();
      mm_events = nullptr;
      at::removeCallback(callback);
      events[g->rank()] = rec->events;
    });
    // dX's two products, the all-reduce started, then dA's two products before (overlapped) or
    // after (waited at once) its wait.
    const std::vector<std::string> want =
        overlap ? std::vector<std::string>{"mm", "mm", "start all_reduce",
                                           "mm", "mm", "wait all_reduce"}
                : std::vector<std::string>{"mm", "mm", "start all_reduce", "wait all_reduce",
                                           "mm", "mm"};
    for (int r = 0; r < 2; ++r)
      EXPECT_EQ(events[r], want) << "rank " << r << " overlap " << overlap;
  }
}

// The example TP GPT's backward, its collectives and products in order, with
// tensor_parallel.overlap_comm from `yaml`; the loss and every gradient by name.
struct ModelRun {
  std::vector<std::string> events;
  at::Tensor loss;
  std::map<std::string, at::Tensor> grads;
};

ModelRun run_model(const std::shared_ptr<comm::Group>& g, bool sp, const std::string& yaml) {
  const Config cfg = Config::from_string(yaml, "test.yaml");
  models::GptConfig c = models::gpt_preset("tiny");
  auto rec = std::make_shared<RecordingGroup>(g);
  models::TpGpt model(rec, c, sp);
  // What zero-train does with the key (examples/trainer.cpp, pp_trainer.cpp): the attention's
  // fused q/k/v and the MLP's first layer in each block at least.
  EXPECT_GE(tensor_parallel::set_overlap_comm(*model, tensor_parallel_overlap_comm(cfg)),
            2 * c.layers);
  at::Generator gen = at::detail::createCPUGenerator(11);
  const at::Tensor tokens = at::randint(c.vocab, {2, 16}, gen);
  const at::Tensor targets = (tokens * 3 + 1) % c.vocab;
  const auto callback = at::addThreadLocalCallback(
      at::RecordFunctionCallback(record_mm).scopes({at::RecordScope::FUNCTION}));
  ModelRun out;
  out.loss = model->loss(tokens, targets);
  rec->events.clear();  // forward's
  mm_events = &rec->events;
  out.loss.backward();
  mm_events = nullptr;
  at::removeCallback(callback);
  out.events = rec->events;
  for (const auto& p : model->named_parameters()) out.grads[p.key()] = p.value().grad().clone();
  return out;
}

// How many collectives had anything (a product, another collective) between their start and
// their wait; -1 if a start has no wait.
int overlapped(const std::vector<std::string>& events) {
  int n = 0;
  for (size_t i = 0; i < events.size(); ++i) {
    if (events[i].rfind("start ", 0) != 0) continue;
    const std::string wait = "wait " + events[i].substr(6);
    size_t j = i + 1;
    while (j < events.size() && events[j] != wait) ++j;
    if (j == events.size()) return -1;
    if (j != i + 1) ++n;
  }
  return n;
}

TEST(TensorParallelOverlap, ConfigKeySwitchesTheModelsBackward) {
  for (bool sp : {false, true}) {
    run_ranks(2, [&](std::shared_ptr<comm::Group> g) {
      const std::string tp = "tensor_parallel: {autotp_size: 2, sequence_parallel: " +
                             std::string(sp ? "true" : "false");
      const ModelRun on = run_model(g, sp, tp + "}\n");
      const ModelRun off = run_model(g, sp, tp + ", overlap_comm: false}\n");
      const std::string what =
          std::string(sp ? "SP" : "no SP") + " rank " + std::to_string(g->rank());
      // One overlapped collective per column-parallel layer's backward at least (under SP its
      // all-gather and reduce-scatter both); none without the overlap.
      EXPECT_GE(overlapped(on.events), 2 * models::gpt_preset("tiny").layers) << what;
      EXPECT_EQ(overlapped(off.events), 0) << what;
      EXPECT_GT(std::count(off.events.begin(), off.events.end(), "mm"), 0) << what;
      EXPECT_TRUE(at::equal(on.loss, off.loss)) << what;
      ASSERT_EQ(on.grads.size(), off.grads.size());
      for (const auto& [name, t] : on.grads)
        EXPECT_TRUE(at::equal(t, off.grads.at(name))) << what << ": " << name;
    });
  }
}

}  // namespace
}  // namespace zero::testing
