// initialize(model, cfg, mesh) and the refusal of initialize(model, cfg) for what needs a mesh
// (include/zero/engine.hpp); ParallelDims::from_config (include/zero/parallel_dims.hpp).
#include <torch/nn/module.h>

#include <string>
#include <utility>

#include "zero/config.hpp"
#include "zero/engine.hpp"
#include "zero/engine/engine_impl.hpp"
#include "zero/tensor_parallel/embedding.hpp"
#include "zero/tensor_parallel/linear.hpp"

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

namespace {

// The tp group's size of a layer of this library; 0 for a TensorParallelLayer of the user's own
// (its split cannot be known, so it counts as split), -1 for any other module.
int split_size(const torch::nn::Module& m) {
  namespace tp = tensor_parallel;
  if (const auto* c = dynamic_cast<const tp::ColumnParallelLinearImpl*>(&m))
    return c->group()->size();
  if (const auto* r = dynamic_cast<const tp::RowParallelLinearImpl*>(&m)) return r->group()->size();
  if (const auto* e = dynamic_cast<const tp::VocabParallelEmbeddingImpl*>(&m))
    return e->group()->size();
  if (dynamic_cast<const tp::TensorParallelLayer*>(&m)) return 0;
  return -1;
}

}  // namespace

void refuse_tensor_parallel_model_on_one_group(const torch::nn::Module& model) {
  for (const auto& item : model.named_modules("model")) {
    const int size = split_size(*item.value());
    if (size == -1 || size == 1) continue;
    throw ConfigError(
        "zero::initialize(model, cfg, group): " + item.key() + " (" + item.value()->name() +
        ") is a tensor-parallel layer" +
        (size > 1 ? " split over " + std::to_string(size) + " ranks" : std::string()) +
        "; with one group the gradient norm (gradient_clipping, fp16's overflow check) would "
        "cover each rank's own shard only and checkpoints would not record the blocks. Call "
        "zero::initialize(model, cfg, mesh) with " +
        std::string(kBuildMesh) +
        ", or hand it zero::engine_groups(*model, mesh) (zero/parallel_dims.hpp)");
  }
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
                      std::to_string(cfg.pipeline.stages) + " and a mesh of " + mesh.describe() +
                      ": initialize trains a whole model; a model cut into stages trains "
                      "through zero::pipeline::PipelineEngine(layers, loss, cfg, mesh) "
                      "(zero/pipeline_engine.hpp)");
  // The config and the mesh say the same, or the config is silent (its defaults).
  if (cfg.tensor_parallel.autotp_size != 1 && cfg.tensor_parallel.autotp_size != tp)
    throw ConfigError(
        "tensor_parallel.autotp_size = " + std::to_string(cfg.tensor_parallel.autotp_size) +
        " but the mesh is " + mesh.describe() + "; build the mesh from the config (" + kBuildMesh +
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
