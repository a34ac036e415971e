// ParallelDims and its mesh (include/zero/parallel_dims.hpp): the validation a user reads, then
// comm::Mesh's Megatron layout, which is rank arithmetic the public API does not expose. The
// engine defines from_config and engine_groups (it knows Config and the placements).
#include "zero/parallel_dims.hpp"

#include <stdexcept>
#include <string>

#include "comm/mesh.hpp"

namespace zero {

namespace {

std::string dims_text(const ParallelDims& d) {
  return "dp " + std::to_string(d.dp) + " x tp " + std::to_string(d.tp) + " x pp " +
         std::to_string(d.pp);
}

[[noreturn]] void fail(const ParallelDims& d, int world, const std::string& why) {
  throw std::invalid_argument("zero::ParallelDims{" + dims_text(d) +
                              (d.sp ? ", sp" : "") + "} on " + std::to_string(world) +
                              " ranks: " + why);
}

}  // namespace

std::string ParallelDims::describe() const {
  return "pp " + std::to_string(pp) + " x dp " + std::to_string(dp) + " x tp " +
         std::to_string(tp);
}

ParallelDims ParallelDims::resolved(int world) const {
  if (world < 1) fail(*this, world, "the world needs at least one rank");
  if (tp < 1)
    fail(*this, world,
         "tp (tensor_parallel.autotp_size) must be >= 1; 1 means no tensor parallelism");
  if (pp < 1)
    fail(*this, world, "pp (pipeline.stages) must be >= 1; 1 means no pipeline parallelism");
  if (dp < 0)
    fail(*this, world, "dp must be >= 1, or 0 for whatever tp and pp leave of the world");
  if (sp && tp == 1)
    fail(*this, world,
         "sp (tensor_parallel.sequence_parallel) splits the sequence over the tensor-parallel "
         "ranks and needs tp > 1; set tp > 1 or sp false");
  const int64_t model_ranks = static_cast<int64_t>(tp) * pp;
  if (world % model_ranks != 0)
    fail(*this, world,
         "tp x pp = " + std::to_string(model_ranks) + " does not divide the world size " +
             std::to_string(world) + "; choose tp and pp whose product divides " +
             std::to_string(world) + ", or launch a multiple of " + std::to_string(model_ranks) +
             " ranks");
  ParallelDims out = *this;
  if (dp == 0) {
    out.dp = static_cast<int>(world / model_ranks);
  } else if (model_ranks * dp != world) {
    fail(*this, world,
         "dp x tp x pp = " + std::to_string(model_ranks * dp) + " is not the world size " +
             std::to_string(world) + "; set dp = " + std::to_string(world / model_ranks) +
             " (or 0: whatever tp and pp leave), or launch " +
             std::to_string(model_ranks * dp) + " ranks");
  }
  return out;
}

Mesh ParallelDims::build_mesh(std::shared_ptr<Group> world) const {
  if (!world) throw std::invalid_argument("zero::ParallelDims::build_mesh: the world group is null");
  Mesh m;
  m.dims = resolved(world->size());
  // Splits in the order pp, dp, tp (comm/mesh_layout.hpp): every rank the same.
  comm::Mesh mesh = comm::Mesh::megatron(comm::of(world), m.dims.tp, m.dims.pp, m.dims.dp);
  m.world = std::move(world);
  m.dp = mesh.group("dp");
  m.tp = mesh.group("tp");
  m.pp = mesh.group("pp");
  return m;
}

}  // namespace zero
