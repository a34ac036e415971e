// Bytes on the wire per optimizer step for the gradient reduction of stage 2, measured at the
// process group (comm::CountingGroup around each rank's gloo group; ranks are threads, as in
// the tests) for each communication mode, next to the formula. One JSON line per mode:
//
//   compress-wire --model small --ranks 2 --steps 2
//
// Modes: fp32 (uncompressed), fp16 (communication_data_type), int8 and int4
// (zero_quantized_gradients with error feedback). reduce_bucket_size is above the model's size,
// so the gradient is one bucket of P padded elements and each rank's shard is S = P / N:
//   fp32/fp16: a reduce-scatter of P elements, b bytes each: sends P b (N-1)/N
//   intK:      an all-to-all of N rows, each S elements padded to whole blocks of B, K/8 bytes
//              per element and 4 per block: sends N (ceil(S/B) B K/8 + 4 ceil(S/B)) (N-1)/N
// --nodes K (K > 1): the ranks stand for K nodes of N/K (LOCAL_WORLD_SIZE = N/K), so intK goes
// hierarchical: with a row R = ceil(S/B) B K/8 + 4 ceil(S/B), each rank sends (N/K - 1) K R
// within its node and (K - 1) R across nodes, counted on the two subgroups; the flat exchange
// would send (N - N/K) R across nodes.
#include <ATen/ATen.h>

#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <string>

#include "comm/counting_group.hpp"
#include "support/thread_group.hpp"
#include "zero/engine.hpp"
#include "zero/models/gpt.hpp"

int main(int argc, char** argv) {
  std::map<std::string, std::string> arg = {{"--model", "small"}, {"--ranks", "2"},
                                            {"--steps", "2"},     {"--seq", "64"},
                                            {"--block", "2048"},  {"--nodes", "1"}};
  for (int i = 1; i + 1 < argc; i += 2) arg[argv[i]] = argv[i + 1];
  const int world = std::stoi(arg["--ranks"]);
  const int steps = std::stoi(arg["--steps"]);
  const int64_t seq = std::stoll(arg["--seq"]), block = std::stoll(arg["--block"]);
  const zero::models::GptConfig shape = zero::models::gpt_preset(arg["--model"]);
  const int nodes = std::stoi(arg["--nodes"]);
  if (nodes > 1) {
    if (world % nodes != 0 || world / nodes < 2) {
      std::fprintf(stderr, "compress-wire: --nodes %d needs --ranks a multiple of it, >= 2 each\n",
                   nodes);
      return 2;
    }
    // Read by the engine at initialize: rank r sits on node r / (world / nodes).
    ::setenv("LOCAL_WORLD_SIZE", std::to_string(world / nodes).c_str(), 1);
  }

  struct Mode {
    const char* name;
    int bits;  // 0: uncompressed
    zero::Dtype comm;
  };
  const Mode modes[] = {{"fp32", 0, zero::Dtype::kFloat32},
                        {"fp16", 0, zero::Dtype::kFloat16},
                        {"int8", 8, zero::Dtype::kFloat32},
                        {"int4", 4, zero::Dtype::kFloat32}};
  for (const Mode& mode : modes) {
    zero::Config cfg;
    cfg.zero_optimization.stage = 2;
    cfg.zero_optimization.reduce_bucket_size = 2'000'000'000;
    cfg.train_micro_batch_size_per_gpu = 1;
    cfg.optimizer.type = "AdamW";
    cfg.optimizer.lr = 1e-4;
    cfg.communication_data_type = mode.comm;
    auto& q = cfg.zero_optimization.quantized_gradients;
    q.enabled = mode.bits != 0;
    q.bits = mode.bits ? mode.bits : 8;
    q.block = block;
    std::mutex mu;
    int64_t sent = 0, padded = 0, calls = 0, within = 0, across = 0;
    zero::testing::run_ranks(
        world,
        [&](std::shared_ptr<zero::comm::Group> inner) {
          auto group = std::make_shared<zero::comm::CountingGroup>(inner);
          const int r = group->rank();
          zero::models::Gpt model(shape);
          at::Generator gen = at::detail::createCPUGenerator(100 + r);
          auto engine = zero::initialize(model.ptr(), cfg, group);
          group->reset();  // set-up traffic (parameter broadcast) is not the step's
          for (int s = 0; s < steps; ++s) {
            at::Tensor x = at::randint(shape.vocab, {1, seq}, gen, at::kLong);
            at::Tensor y = at::randint(shape.vocab, {1, seq}, gen, at::kLong);
            engine.backward(model->loss(x, y));
            engine.step();
          }
          std::lock_guard<std::mutex> lock(mu);
          if (r != 0) return;
          sent = group->sent_bytes("gradient bucket");
          for (const auto& [op, c] : group->counts()) {
            if (op == "reduce_scatter" || op == "all_to_all") calls += c.calls;
          }
          // The hierarchical exchange's traffic is its subgroups' (within node, across nodes).
          for (const auto& sub : group->subgroups()) {
            const int64_t b = sub->sent_bytes("gradient bucket");
            (sub->name().find("across nodes") != std::string::npos ? across : within) += b;
            if (b > 0 && sub->name().find("across nodes") != std::string::npos) {
              calls += sub->counts().at("all_to_all").calls;
            }
          }
          sent += within + across;
          padded = engine.memory_report().padded_params;
        },
        std::chrono::minutes(30));
    const int64_t S = padded / world, blocks = (S + block - 1) / block;
    const int64_t input = mode.bits == 0 ? padded * (mode.comm == zero::Dtype::kFloat32 ? 4 : 2)
                                         : world * (blocks * block * mode.bits / 8 + 4 * blocks);
    const int64_t row = blocks * block * mode.bits / 8 + 4 * blocks;
    const bool two_level = nodes > 1 && mode.bits != 0;
    const int64_t per_node = world / nodes;
    const int64_t formula =
        two_level ? (per_node - 1) * nodes * row + (nodes - 1) * row : input * (world - 1) / world;
    if (two_level) {
      std::printf(
          "{\"mode\": \"%s hierarchical\", \"nodes\": %d, \"within_per_step\": %lld, "
          "\"within_formula\": %lld, \"across_per_step\": %lld, \"across_formula\": %lld, "
          "\"flat_across_formula\": %lld}\n",
          mode.name, nodes, static_cast<long long>(within / steps),
          static_cast<long long>((per_node - 1) * nodes * row),
          static_cast<long long>(across / steps), static_cast<long long>((nodes - 1) * row),
          static_cast<long long>((world - per_node) * row));
    }
    std::printf(
        "{\"mode\": \"%s\", \"model\": \"%s\", \"ranks\": %d, \"padded_params\": %lld, "
        "\"reductions_per_step\": %.2f, \"sent_per_step\": %lld, \"formula\": %lld, "
        "\"bytes_per_param\": %.4f}\n",
        mode.name, arg["--model"].c_str(), world, static_cast<long long>(padded),
        static_cast<double>(calls) / steps, static_cast<long long>(sent / steps),
        static_cast<long long>(formula),
        static_cast<double>(sent / steps) / (static_cast<double>(padded) * (world - 1) / world));
    std::fflush(stdout);
  }
}
