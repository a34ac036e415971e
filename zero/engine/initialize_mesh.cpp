// initialize(model, cfg, mesh) and the refusal of initialize(model, cfg) for what needs a mesh
// (include/zero/engine.hpp); ParallelDims::from_config (include/zero/parallel_dims.hpp).
#include <torch/nn/module.h>

#include <string>
#include <utility>

#include "zero/config.hpp"
#include "zero/engine.hpp"
#include "zero/engine/engine_impl.hpp"

namespace zero {

namespace {

const char* const kBuildMesh =
    "zero::Mesh mesh = zero::ParallelDims::from_config(cfg).build_mesh(world) "
    "(zero/parallel_dims.hpp; world = zero::process_group_from_env(cfg, device))";

}  // namespace

ParallelDims ParallelDims::from_config(const Config& cfg) {
  ParallelDims d;
  d.tp = cfg.tensor_parallel.autotp_size;
  d.pp = cfg.pipeline.stages;
  d.sp = cfg.tensor_parallel.sequence_parallel;
  return d;
}

void refuse_model_parallel_without_mesh(const Config& cfg) {
  // Silently training data-parallel over every rank would run, and train something else than
  // the config says (DeepSpeed's initialize reads mpu / the pipeline module for these).
  if (cfg.tensor_parallel.autotp_size > 1)
    throw ConfigError(
        "tensor_parallel.autotp_size = " + std::to_string(cfg.tensor_parallel.autotp_size) +
        ": zero::initialize(model, cfg) trains data-parallel only and cannot split a model; "
        "build the model's tensor-parallel layers over a mesh's tp group and call "
        "zero::initialize(model, cfg, mesh), with " +
        kBuildMesh);
  if (cfg.pipeline.stages > 1)
    throw ConfigError("pipeline.stages = " + std::to_string(cfg.pipeline.stages) +
                      ": zero::initialize(model, cfg) does not cut a model into stages; use "
                      "zero::pipeline::PipelineEngine(layers, loss, cfg, mesh) "
                      "(zero/pipeline_engine.hpp), with " +
                      kBuildMesh);
}

Engine initialize(std::shared_ptr<torch::nn::Module> model, Config cfg, const Mesh& mesh) {
  TORCH_CHECK(model, "zero::initialize: the model is null");
  if (!mesh.dp)
    throw std::invalid_argument(
        "zero::initialize(model, cfg, mesh): mesh.dp is null; make the mesh with "
        "zero::ParallelDims::build_mesh(world)");
  const int tp = mesh.tp ? mesh.tp->size() : 1;
  const int pp = mesh.pp ? mesh.pp->size() : 1;
  if (pp > 1 || cfg.pipeline.stages > 1)
    throw ConfigError("zero::initialize(model, cfg, mesh) with pipeline.stages = " +
                      std::to_string(cfg.pipeline.stages) + " and a mesh of " +
                      mesh.describe() +
                      ": initialize trains a whole model; a model cut into stages trains "
                      "through zero::pipeline::PipelineEngine(layers, loss, cfg, mesh) "
                      "(zero/pipeline_engine.hpp)");
  // The config and the mesh say the same, or the config is silent (its defaults).
  if (cfg.tensor_parallel.autotp_size != 1 && cfg.tensor_parallel.autotp_size != tp)
    throw ConfigError("tensor_parallel.autotp_size = " +
                      std::to_string(cfg.tensor_parallel.autotp_size) + " but the mesh is " +
                      mesh.describe() + "; build the mesh from the config (" + kBuildMesh +
                      ") or set tensor_parallel.autotp_size: " + std::to_string(tp));
  if (cfg.tensor_parallel.sequence_parallel && !mesh.dims.sp)
    throw ConfigError(
        "tensor_parallel.sequence_parallel is true but the mesh's dims have sp false; build the "
        "mesh from the config (" +
        std::string(kBuildMesh) + ") or set tensor_parallel.sequence_parallel: false");
  cfg.tensor_parallel.autotp_size = tp;
  cfg.tensor_parallel.sequence_parallel = mesh.dims.sp && tp > 1;
  Groups groups = engine_groups(*model, mesh);
  return initialize(std::move(model), std::move(cfg), std::move(groups));
}

}  // namespace zero
