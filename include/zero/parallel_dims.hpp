// The topology of a run: how many ranks go to data, tensor and pipeline parallelism
// (ParallelDims), and the process groups that split makes (Mesh). One type for the idea, as
// torchtitan's ParallelDims and world mesh are; the older zero::tensor_parallel::Groups
// (make_groups) and zero::pipeline::PipelineGrid (make_pipeline_grid) are views of it.
//
//   auto cfg = zero::Config::from_file("configs/tp.yaml");           // tensor_parallel.autotp_size: 2
//   auto world = zero::process_group_from_env(cfg, c10::DeviceType::CPU);
//   zero::Mesh mesh = zero::ParallelDims::from_config(cfg).build_mesh(world);
//   MyModel model(mesh.tp, ...);                       // tensor-parallel layers over mesh.tp
//   auto engine = zero::initialize(model.ptr(), cfg, mesh);  // ZeRO over mesh.dp
//
// Ranks are laid out in Megatron-LM's order: tensor parallel innermost (one node's GPUs, the
// fastest links), then data parallel, pipeline outermost:
//
//   world rank = tp_rank + tp * (dp_rank + dp * pp_rank)
//
// 8 ranks as pp 2 x dp 2 x tp 2: tp groups {0,1} {2,3} {4,5} {6,7}; dp groups {0,2} {1,3} {4,6}
// {5,7}; pp groups {0,4} {1,5} {2,6} {3,7}.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "zero/group.hpp"
#include "zero/groups.hpp"

namespace torch::nn {
class Module;
}  // namespace torch::nn

namespace zero {

struct Config;
struct Mesh;
namespace tensor_parallel {
struct NamedPlacement;
}  // namespace tensor_parallel

struct ParallelDims {
  // Data-parallel ranks: the engine shards (ZeRO) and averages over them. 0: whatever tp and pp
  // leave of the world (world size / (tp x pp)).
  int dp = 0;
  // Tensor-parallel ranks per model replica (Megatron's column/row-parallel layers;
  // tensor_parallel.autotp_size). 1: none.
  int tp = 1;
  // Pipeline stages (pipeline.stages). 1: none.
  int pp = 1;
  // Megatron's sequence parallelism (tensor_parallel.sequence_parallel): the activations outside
  // the tensor-parallel layers split along the sequence over the tp group. It has no ranks of
  // its own, so it needs tp > 1.
  bool sp = false;

  // tensor_parallel.autotp_size, pipeline.stages and tensor_parallel.sequence_parallel; dp 0.
  static ParallelDims from_config(const Config& cfg);

  // These dims on `world_size` ranks, dp filled in when 0. Throws std::invalid_argument naming
  // the dims, the world size and the fix when a dim is below 1 (dp below 0), tp x pp does not
  // divide the world size, dp x tp x pp is not the world size, or sp is set with tp 1.
  ParallelDims resolved(int world_size) const;
  // dp x tp x pp (dp as given: resolve first).
  int world_size() const { return dp * tp * pp; }
  // "pp 2 x dp 2 x tp 2" (dp as given).
  std::string describe() const;

  // The process groups of these dims over `world` (resolved against its size first; the same
  // errors). A collective: every rank of `world` calls it with the same dims.
  Mesh build_mesh(std::shared_ptr<Group> world) const;
};

// This rank's groups along each dimension of a ParallelDims (ParallelDims::build_mesh sets every
// group, a dimension of size 1 giving a group of one rank; a null tp or pp in a mesh a program
// puts together means that dimension is 1).
struct Mesh {
  ParallelDims dims;  // resolved: dims.world_size() == world->size()
  std::shared_ptr<Group> world;
  std::shared_ptr<Group> dp;  // what the engine shards and averages over
  std::shared_ptr<Group> tp;  // what the tensor-parallel layers split over
  std::shared_ptr<Group> pp;  // rank s = stage s
  int dp_rank() const { return dp->rank(); }
  int tp_rank() const { return tp->rank(); }
  int pp_rank() const { return pp->rank(); }
  std::string describe() const { return dims.describe(); }
};

// What the engine is handed for a model whose parameters are placed over `mesh` (the one place
// the translation is made; initialize(model, cfg, mesh) and the pipeline's stages use it): it
// shards and averages over mesh.dp; its gradient norm sums over dp, then over tp (a parameter
// every tensor-parallel rank holds whole, a norm's weight, counted once: Megatron's
// param_is_not_tensor_parallel_duplicate), then over pp (each stage holds its own layers). Under
// sequence parallelism the replicated parameters' gradients are partial sums over tp, which the
// engine sums as they arrive (NormGroup::partial). Checkpoints record each rank's block of the
// split weights (Groups::parts), so a save at one tp loads at another. A tied weight counts once,
// under its first name. No communication.
Groups engine_groups(const torch::nn::Module& model, const Mesh& mesh);
// The same from the placements already listed (tensor_parallel::placements(model, mesh.dims.sp)).
Groups engine_groups(const std::vector<tensor_parallel::NamedPlacement>& placements,
                     const Mesh& mesh);

}  // namespace zero
