// pipeline.partition: compute. The cut minimises the largest stage's FLOPs per token (forward +
// backward, include/zero/pipeline_flops.hpp), where "parameters" balances parameter counts. Each
// expected cut below is worked out by hand from Megatron-LM's FLOP count (training.py
// num_floating_point_operations: 6 per matmul weight, 12·s·h per block for attention, 6·h·V for
// the logits) plus the embedding's lookup (h) and the loss (8·V), in the comments beside it.
#include <gtest/gtest.h>

#include <string>
#include <thread>
#include <vector>

#include "comm/group.hpp"
#include "support/thread_group.hpp"
#include "zero/models/gpt.hpp"
#include "zero/models/gpt_config.hpp"
#include "zero/models/gpt_layers.hpp"
#include "zero/models/tp_gpt.hpp"
#include "zero/models/tp_gpt_layers.hpp"
#include "zero/parallel_plan.hpp"
#include "zero/pipeline.hpp"
#include "zero/pipeline/partition.hpp"
#include "zero/pipeline/runtime/layers.hpp"
#include "zero/pipeline_engine.hpp"
#include "zero/tensor_parallel/embedding.hpp"

namespace zero::pipeline {
namespace {

using models::Gpt;
using models::GptConfig;

// A toy LM of width h = 64 over s = 16 tokens: blocks of 12h² = 49152 parameters, an embedding
// of V·h, a head of V·h + h.
//   block:  6·49152 + 12·16·64 = 307200 FLOPs per token
//   embed:  h = 64
//   head:   6·(V·h + h) + 8·V
struct Toy {
  std::vector<int64_t> params, flops;
};

Toy toy(int64_t vocab) {
  const int64_t h = 64, block_params = 49152, block_flops = 307200;
  Toy t;
  t.params = {vocab * h, block_params, block_params, block_params, block_params, vocab * h + h};
  t.flops = {64,          block_flops, block_flops,
             block_flops, block_flops, 6 * (vocab * h + h) + 8 * vocab};
  return t;
}

// V = 1000: the embedding weighs 64000 parameters, more than a block's 49152, but costs 64 FLOPs.
TEST(PipelinePartitionCompute, AnEmbeddingHeavyCutMovesABlockToTheFirstStage) {
  const Toy t = toy(1000);
  ASSERT_EQ(t.flops.back(), 392384);  // 6·64064 + 8000
  // By parameters, P = 2: embed + 2 blocks = 162304 against 2 blocks + head = 162368 (a cut one
  // layer later: 211456 on the first stage).
  EXPECT_EQ(partition_layers(PartitionMethod::Parameters, t.params, 2),
            (std::vector<int>{0, 3, 6}));
  // By compute: embed + 2 blocks = 614464 against 2 blocks + head = 1006784; embed + 3 blocks =
  // 921664 against 1 block + head = 699584, the smaller largest stage.
  EXPECT_EQ(partition_layers(PartitionMethod::Compute, t.flops, 2), (std::vector<int>{0, 4, 6}));
}

// V = 32000: the head (6·2048064 + 256000 = 12544384 FLOPs) outweighs the 4 blocks together
// (1228800): alone on the last stage, every block goes first. By parameters the embedding and the
// head weigh about the same, and the blocks split in the middle.
TEST(PipelinePartitionCompute, AHeadHeavyCutLeavesTheHeadAlone) {
  const Toy t = toy(32000);
  ASSERT_EQ(t.flops.back(), 12544384);
  // Parameters: embed + 2 blocks = 2146304 against 2 blocks + head = 2146368.
  EXPECT_EQ(partition_layers(PartitionMethod::Parameters, t.params, 2),
            (std::vector<int>{0, 3, 6}));
  EXPECT_EQ(partition_layers(PartitionMethod::Compute, t.flops, 2), (std::vector<int>{0, 5, 6}));
  // P = 3: the head alone (12544384) paces any cut; the first stages split the rest greedily,
  // as many layers as fit under that cap on the earlier stages and one left for each later.
  EXPECT_EQ(partition_layers(PartitionMethod::Compute, t.flops, 3), (std::vector<int>{0, 4, 5, 6}));
}

// Every rank cuts the same list by itself: the bounds depend on the costs alone (not on the
// thread, the call, or the costs' unit: FLOPs per token or per micro-batch).
TEST(PipelinePartitionCompute, TheCutIsAPureFunctionOfTheCosts) {
  const Toy t = toy(1000);
  const std::vector<int> want = partition_layers(PartitionMethod::Compute, t.flops, 2);
  std::vector<std::vector<int>> got(4);
  std::vector<std::thread> threads;
  for (int r = 0; r < 4; ++r)
    threads.emplace_back([&, r] {
      const std::vector<int64_t> copy = t.flops;
      got[r] = partition_layers(PartitionMethod::Compute, copy, 2);
    });
  for (auto& th : threads) th.join();
  for (const auto& g : got) EXPECT_EQ(g, want);
  std::vector<int64_t> per_batch;
  for (int64_t f : t.flops) per_batch.push_back(f * 4096);
  EXPECT_EQ(partition_layers(PartitionMethod::Compute, per_batch, 2), want);
}

TEST(PipelinePartitionCompute, TheKeyNamesItsValues) {
  EXPECT_EQ(parse_partition_method("compute"), PartitionMethod::Compute);
  EXPECT_EQ(partition_method_name(PartitionMethod::Compute), "compute");
  try {
    parse_partition_method("flops");
    FAIL();
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find(
                  "pipeline.partition: unknown method 'flops' (choose parameters, compute or "
                  "uniform)"),
              std::string::npos)
        << e.what();
  }
}

// Layers without a declared cost: an Embedding module by its type (its width per token), any
// other by 6 x its parameters; a declared one as declared.
TEST(PipelinePartitionCompute, UndeclaredLayersFallBack) {
  auto embed = std::make_shared<torch::nn::EmbeddingImpl>(1000, 32);
  auto linear = std::make_shared<torch::nn::LinearImpl>(torch::nn::LinearOptions(32, 48));
  std::vector<Layer> layers(3);
  layers[0] = {"embed", embed, nullptr, {}};
  layers[1] = {"mlp", linear, nullptr, {}};
  layers[2] = {"head", linear, nullptr, {}};
  layers[2].flops_per_token = 777;
  const std::vector<LayerCost> c = layer_costs(layers);
  ASSERT_EQ(c.size(), 3u);
  EXPECT_EQ(c[0].flops_per_token, 32);
  EXPECT_EQ(c[0].source, LayerCost::Source::kEmbedding);
  EXPECT_EQ(c[1].flops_per_token, 6 * (32 * 48 + 48));  // weight and bias
  EXPECT_EQ(c[1].source, LayerCost::Source::kParameters);
  EXPECT_EQ(c[2].flops_per_token, 777);
  EXPECT_EQ(describe_layer_costs(layers, c),
            "pipeline.partition compute: FLOPs per token (forward + backward) of 3 layers: 1 "
            "declared; an Embedding's lookup (its width) for embed; 6 x parameters (no "
            "flops_per_token declared) for mlp");
  layers[2].flops_per_token = -1;
  EXPECT_THROW(layer_costs(layers), std::invalid_argument);
  // A vocabulary-parallel embedding is a lookup too, not 6 x its shard's parameters.
  layers[0] = {"vembed",
               std::make_shared<tensor_parallel::VocabParallelEmbeddingImpl>(
                   comm::Group::single(), tensor_parallel::VocabParallelEmbeddingOptions(1000, 32)),
               nullptr,
               {}};
  layers[2].flops_per_token = 777;
  const std::vector<LayerCost> v = layer_costs(layers);
  EXPECT_EQ(v[0].flops_per_token, 32);
  EXPECT_EQ(v[0].source, LayerCost::Source::kEmbedding);
}

// gpt-25m (V = 8192, h = 384, 12 blocks, f = 1024, tied) trained on s = 256 tokens:
//   block: 4h² + 3hf + 2h = 589824 + 1179648 + 768 = 1770240 parameters;
//          6·1770240 + 12·256·384 = 10621440 + 1179648 = 11801088 FLOPs per token (call it b)
//   embed: V·h = 3145728 parameters; 384 FLOPs (e)
//   head:  V·h + h = 3146112 parameters (the tied table registered on it); 6·3146112 + 8·8192 =
//          18942208 FLOPs (H, 1.6 b)
constexpr int64_t kSeq = 256, kBlock = 11801088, kEmbed = 384, kHead = 18942208;

std::vector<int> runtime_bounds(const Gpt& model, PartitionMethod m, int stages) {
  StageLayers s(models::gpt_pipeline_layers(model, kSeq), m, stages, 0);
  return s.bounds();
}

// The planner's input for the example GPT `c` at P stages of T tensor-parallel ranks, D = 1,
// 8 micro-batches of one kSeq-token sequence.
PlanInput plan_input(const GptConfig& c, int p, int t = 1) {
  PlanInput in;
  in.shape = {c.layers, c.dim, c.heads, c.ffn_dim(), c.vocab, c.tied, c.kv_heads};
  in.num_params = c.num_params();
  in.world_size = t * p;
  in.tensor_parallel = t;
  in.pipeline_stages = p;
  in.micro_batch = 1;
  in.seq_len = kSeq;
  in.accumulation = 8;
  return in;
}

TEST(PipelinePartitionCompute, TheExampleGptCutsAsMegatronsFormulaSays) {
  const GptConfig c = models::gpt_preset("gpt-25m");
  ASSERT_EQ(c.ffn_dim(), 1024);
  const Gpt model(c);
  const std::vector<Layer> layers = models::gpt_pipeline_layers(model, kSeq);
  ASSERT_EQ(layers.size(), 14u);
  const std::vector<LayerCost> costs = layer_costs(layers);
  EXPECT_EQ(costs[0].flops_per_token, kEmbed);
  for (int i = 1; i <= 12; ++i) EXPECT_EQ(costs[i].flops_per_token, kBlock) << i;
  EXPECT_EQ(costs[13].flops_per_token, kHead);

  // P = 2. By parameters: embed + 6 blocks = 13767168 against 6 blocks + head = 13767552, so
  // layers 0..6 and 7..13; in FLOPs that is 6b against 6b + H = 89748736. By compute: embed + 7
  // blocks = 82608000 against 5 blocks + H = 77947648, the smallest largest stage (embed + 6
  // blocks leaves the second 89748736).
  EXPECT_EQ(runtime_bounds(model, PartitionMethod::Parameters, 2), (std::vector<int>{0, 7, 14}));
  EXPECT_EQ(runtime_bounds(model, PartitionMethod::Compute, 2), (std::vector<int>{0, 8, 14}));
  // P = 4. 13.6 b over 4 stages: the head's stage takes 1 or 2 blocks (2.6 b or 3.6 b), leaving
  // 11 or 10 blocks for three stages, so some stage holds 4 blocks: the smallest largest stage
  // is 4b. Under that cap the earlier stages take what fits: embed + 3 blocks (4b + e is over),
  // 4, 4, then block 11 and the head. By parameters: embed + 2 blocks (8456448 with a third, over
  // the 4-block cap 7080960), 4, 4, 2 blocks + head.
  EXPECT_EQ(runtime_bounds(model, PartitionMethod::Compute, 4),
            (std::vector<int>{0, 4, 8, 12, 14}));
  EXPECT_EQ(runtime_bounds(model, PartitionMethod::Parameters, 4),
            (std::vector<int>{0, 3, 7, 11, 14}));
}

// The planner (zero-memory's time plan) cuts [embedding, blocks, head] with the same costs: its
// stage split is the runtime's for the example GPT, at P = 2 and 4, by compute and by
// parameters.
TEST(PipelinePartitionCompute, ThePlannerCutsAsTheRuntimeDoes) {
  for (const std::string preset : {"gpt-25m", "small"}) {
    const GptConfig c = models::gpt_preset(preset);
    const Gpt model(c);
    for (int p : {2, 4}) {
      if (c.layers % p != 0) continue;  // the planner's layout wants P to divide the blocks
      PlanInput in = plan_input(c, p);
      for (auto [plan, run] :
           {std::pair{PlanInput::Partition::kCompute, PartitionMethod::Compute},
            std::pair{PlanInput::Partition::kParameters, PartitionMethod::Parameters}}) {
        in.partition = plan;
        EXPECT_EQ(pipeline_stage_bounds(in), runtime_bounds(model, run, p))
            << preset << " P=" << p << " " << partition_name(plan);
      }
      // And each stage's FLOPs per token are the runtime layers' declared costs summed.
      in.partition = PlanInput::Partition::kCompute;
      const std::vector<int> b = pipeline_stage_bounds(in);
      const std::vector<LayerCost> costs = layer_costs(models::gpt_pipeline_layers(model, kSeq));
      const std::vector<double> planned = stage_flops_per_token(in);
      ASSERT_EQ(planned.size(), static_cast<size_t>(p));
      for (int s = 0; s < p; ++s) {
        int64_t sum = 0;
        for (int i = b[s]; i < b[s + 1]; ++i) sum += costs[i].flops_per_token;
        EXPECT_EQ(planned[s], static_cast<double>(sum)) << preset << " stage " << s;
      }
    }
  }
}

// The interleaved schedule (v = 2) cuts the same list into P·v chunks, chunk c on stage c % P
// (StageLayers::bounds() has P·v + 1 entries): the planner's chunks are the runtime's, and each
// stage's FLOPs the sum of its two chunks'. gpt-25m at P = 2 is 4 chunks, the cut of P = 4 above
// (0, 4, 8, 12, 14); at P = 4 8 chunks, which 12 blocks do not fill equally (the planner times
// them as cut; equal chunks would be refused).
TEST(PipelinePartitionCompute, ThePlannerCutsInterleavedChunksAsTheRuntimeDoes) {
  const int v = 2;
  int compared = 0;
  for (const std::string preset : {"gpt-25m", "small", "tiny"}) {
    const GptConfig c = models::gpt_preset(preset);
    const Gpt model(c);
    for (int p : {2, 4}) {
      // The planner's layout wants P to divide the blocks; the runtime a layer in every chunk.
      if (c.layers % p != 0 || c.layers + 2 < p * v) continue;
      PlanInput in = plan_input(c, p);
      in.schedule = PlanInput::Schedule::kInterleaved;
      in.virtual_stages = v;
      for (auto [plan, run] :
           {std::pair{PlanInput::Partition::kCompute, PartitionMethod::Compute},
            std::pair{PlanInput::Partition::kParameters, PartitionMethod::Parameters},
            std::pair{PlanInput::Partition::kUniform, PartitionMethod::Uniform}}) {
        in.partition = plan;
        const std::vector<int> runtime =
            StageLayers(models::gpt_pipeline_layers(model, kSeq), run, p, 0, 0, v).bounds();
        ASSERT_EQ(runtime.size(), static_cast<size_t>(p * v + 1));
        EXPECT_EQ(pipeline_stage_bounds(in), runtime)
            << preset << " P=" << p << " " << partition_name(plan);
        ++compared;
      }
      in.partition = PlanInput::Partition::kCompute;
      const std::vector<int> b = pipeline_stage_bounds(in);
      if (preset == "gpt-25m" && p == 2) EXPECT_EQ(b, (std::vector<int>{0, 4, 8, 12, 14}));
      const std::vector<LayerCost> costs = layer_costs(models::gpt_pipeline_layers(model, kSeq));
      const std::vector<double> planned = stage_flops_per_token(in);
      ASSERT_EQ(planned.size(), static_cast<size_t>(p));
      for (int s = 0; s < p; ++s) {
        int64_t sum = 0;
        for (int chunk = 0; chunk < v; ++chunk)
          for (int i = b[chunk * p + s]; i < b[chunk * p + s + 1]; ++i)
            sum += costs[i].flops_per_token;
        EXPECT_EQ(planned[s], static_cast<double>(sum)) << preset << " P=" << p << " stage " << s;
      }
    }
  }
  EXPECT_EQ(compared, 3 * 4) << "gpt-25m P 2 and 4, small P 2, tiny P 2";
}

// Under tensor parallelism each rank weighs its own share (attention and the loss ÷ T, the norms
// whole): gpt-25m's tensor-parallel layers on 2 ranks cut as the planner cuts at T = 2, on both
// ranks alike.
TEST(PipelinePartitionCompute, ThePlannerCutsAsTheTensorParallelRuntimeDoes) {
  const GptConfig c = models::gpt_preset("gpt-25m");
  std::vector<std::vector<std::vector<int>>> got(2);  // per rank, per P
  std::vector<std::vector<int64_t>> costs(2);
  testing::run_ranks(2, [&](std::shared_ptr<comm::Group> world) {
    const auto grid = make_pipeline_grid(world, 1, 2);
    const models::TpGpt model(grid.tp, c);
    for (const LayerCost& l : layer_costs(models::tp_gpt_pipeline_layers(model, kSeq)))
      costs[world->rank()].push_back(l.flops_per_token);
    for (int p : {2, 4})
      got[world->rank()].push_back(
          StageLayers(models::tp_gpt_pipeline_layers(model, kSeq), PartitionMethod::Compute, p, 0)
              .bounds());
  });
  EXPECT_EQ(got[0], got[1]);
  EXPECT_EQ(costs[0], costs[1]);
  // Rank 0's block: 6 x (1770240 - 768) / 2 + 6 x 768 + 12·256·384 / 2 = 5902848.
  ASSERT_EQ(costs[0].size(), 14u);
  EXPECT_EQ(costs[0][1], 5902848);
  for (size_t i = 0; i < 2; ++i) {
    const int p = i == 0 ? 2 : 4;
    PlanInput in = plan_input(c, p, 2);
    in.partition = PlanInput::Partition::kCompute;
    EXPECT_EQ(pipeline_stage_bounds(in), got[0][i]) << "P=" << p;
    const std::vector<int> b = got[0][i];
    const std::vector<double> planned = stage_flops_per_token(in);
    for (int s = 0; s < p; ++s) {
      int64_t sum = 0;
      for (int j = b[s]; j < b[s + 1]; ++j) sum += costs[0][j];
      EXPECT_EQ(planned[s], static_cast<double>(sum)) << "P=" << p << " stage " << s;
    }
  }
}

}  // namespace
}  // namespace zero::pipeline
