// Pipeline parallelism trained by the ZeRO engine: this rank's stage of a model given as a list
// of layers (pipeline.hpp), wrapped by zero::initialize at ZeRO stage 0 or 1 over the stage's
// data-parallel group, its micro-batches run by the GPipe, 1F1B or interleaved 1F1B schedule
// (cfg.pipeline; interleaved: pipeline.virtual_stages model chunks per stage).
//
//   zero::Mesh mesh = zero::ParallelDims{.pp = 2}.build_mesh(world);   // zero/parallel_dims.hpp
//   zero::pipeline::PipelineEngine pipe(layers, loss_fn, cfg, mesh);
//   at::Tensor loss = pipe.train_batch(micro_inputs, micro_targets);  // one optimizer step
//
// As DeepSpeed's PipelineEngine: micro-batches = gradient_accumulation_steps, the step after
// the last one; only the last stage scales (its backward(loss)); every other stage
// back-propagates what the next one sent with engine.backward(outputs, grad_outputs). The
// gradient norm (clipping, fp16's overflow check, hence the skip decision and the loss scale)
// is summed over dp, then over the pipeline group, so every stage clips by the same global
// norm and skips the same steps; a tied weight counts once (its owner's). The loss is the
// last stage's, averaged over micro-batches and data-parallel replicas, on every rank.
//
// With tensor parallelism (3D: pp x dp x tp, Megatron's order, tensor innermost) each stage's
// layers are tensor-parallel layers over the grid's tp group (zero/tensor_parallel), and the
// pipeline group joins the ranks of one tensor-parallel rank across the stages, so stage s's
// tensor-parallel rank r sends its activations to stage s + 1's rank r, as Megatron does. The
// norm then sums over dp, then tp (a replicated parameter, a norm's weight, counted on tensor
// rank 0 only), then pp:
//
//   zero::Mesh mesh = zero::ParallelDims{.tp = 2, .pp = 2}.build_mesh(world);
//   PipelineEngine pipe(tp_layers_built_on(mesh.tp), loss_fn, cfg, mesh);
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "zero/config.hpp"
#include "zero/engine.hpp"
#include "zero/group.hpp"
#include "zero/parallel_dims.hpp"
#include "zero/pipeline.hpp"

namespace zero::pipeline {

// Deprecated: a view of zero::Mesh (ParallelDims{.tp = tp, .pp = stages}.build_mesh(world)),
// kept for the programs written against it. Megatron's rank order over `world`: tensor parallel
// innermost, then data parallel, pipeline outermost (world rank = tp_rank + tp * (dp_rank + dp *
// stage)). A collective over `world`; std::invalid_argument naming the numbers when stages x tp
// does not divide its size.
struct PipelineGrid {
  std::shared_ptr<Group> pp, dp, tp;  // tp: size 1 without tensor parallelism
  int stage = 0, dp_rank = 0, tp_rank = 0;
  std::string describe() const;  // "pp 2 x dp 2 x tp 1"
  static PipelineGrid of(const Mesh& mesh);
};
PipelineGrid make_pipeline_grid(std::shared_ptr<Group> world, int stages, int tp = 1);

// How a pipelined checkpoint was cut: PipelineEngine::save_checkpoint records it beside each
// stage's shards (dir/stage<s>/<tag>/pipeline.json; under tensor parallelism beside each stage's
// tensor-parallel rank's, dir/stage<s>/tp<r>/<tag>/pipeline.json), and a load at another
// pipeline.stages or tensor-parallel size reads it to find every layer's parameters.
struct PipelineSaveLayout {
  std::string tag;
  int stages = 0;  // the saving run's pipeline.stages
  int tp = 1;      // its tensor-parallel size: > 1 saved into dir/stage<s>/tp<r>/
  // Its pipeline.virtual_stages v (the interleaved schedule's model chunks per stage; 1 for
  // 1F1B, GPipe and saves from before the field).
  int virtual_stages = 1;
  // Its virtual stage c (chunk c / stages of stage c % stages) held layers bounds[c] ..
  // bounds[c + 1] - 1 (stages x virtual_stages + 1 entries): with one chunk per stage, stage s
  // held bounds[s] .. bounds[s + 1] - 1.
  std::vector<int> bounds;
  // false: a save from before the layout was recorded (no pipeline.json): `stages` counts the
  // stage directories holding the tag, `bounds` is empty, and it loads at that P only.
  bool recorded = true;
};
// The layout of `dir`'s pipelined save `tag` ("" = the one dir/stage0/latest, or
// dir/stage0/tp0/latest, names; the newer when both do), checked against every stage and
// tensor-parallel directory it names. Reads files only; throws CheckpointError naming the
// directory when there is no such save, one of its directories is missing, or they disagree.
PipelineSaveLayout read_pipeline_save(const std::string& dir, const std::string& tag = "");
// Every directory holding a part of the save `saved` of `dir`, stage by stage: dir/stage<s>, or
// dir/stage<s>/tp0 .. tp<T-1> under tensor parallelism. Together they hold the whole model (the
// parameters named "<layer index>.<name in the layer>", split weights as blocks with their
// offsets): read_consolidated(pipeline_save_dirs(dir, saved), saved.tag) puts it together.
std::vector<std::string> pipeline_save_dirs(const std::string& dir,
                                            const PipelineSaveLayout& saved);

// cfg.pipeline.virtual_stages (1 when unset). Throws std::invalid_argument when Config::extra
// still holds the key "pipeline.virtual_stages" (where it was kept before the field existed).
int virtual_stages(const Config& cfg);

// DeepSpeed's pipeline.pipe_partitioned / pipeline.grad_partitioned (`key`, the dotted name):
// true unless Config::extra[key] is "false" (the YAML keys fill it; DeepSpeed's default, true).
// Under tensor parallelism without sequence parallelism each tensor-parallel rank then sends 1/T
// of the activation (its gradient) between stages; the receiving stage all-gathers the parts.
bool pipeline_partitioned(const Config& cfg, const std::string& key);

class PipelineEngine {
 public:
  // `layers`: the whole model's (each rank passes the same list; only this stage's are kept).
  // `pp`: the pipeline group (rank s = stage s, size cfg.pipeline.stages); `dp`: this stage's
  // data-parallel group. Collective over both. Refuses ZeRO stage 2 and 3 (the step needs each
  // micro-batch's gradients reduced, m times the traffic of stage 1: see config_pipeline.cpp).
  //
  // `device`: where this stage's layers go before the engine wraps them; the other stages' layers
  // stay where they are. A model built on the host then reaches each GPU only its stage's share
  // (what P > 1 is for); drop the other layers afterwards to free their host memory. Unset: the
  // layers train where they are (the caller moved them).
  PipelineEngine(std::vector<Layer> layers, LossFn loss, Config cfg, std::shared_ptr<Group> pp,
                 std::shared_ptr<Group> dp, std::optional<c10::Device> device = std::nullopt);
  // The grid's groups; with grid.tp of size > 1 the layers are tensor-parallel over it: the
  // engine's norm spans tp (the parameters zero/tensor_parallel/placement.hpp calls replicated
  // counted once) and its checkpoints record each rank's block of the split weights. With
  // tensor_parallel.sequence_parallel each stage's engine sums, over tp after its dp reduction,
  // the gradients of the replicated parameters the layers' modules mark partial
  // (tensor_parallel::SequenceParallelModule; an unmarked one is refused, named); the activations
  // between stages are then each tensor-parallel rank's part of the sequence.
  PipelineEngine(std::vector<Layer> layers, LossFn loss, Config cfg, const PipelineGrid& grid,
                 std::optional<c10::Device> device = std::nullopt);
  // The same over a mesh's pp, dp and tp groups (mesh.dims.pp must be pipeline.stages).
  PipelineEngine(std::vector<Layer> layers, LossFn loss, Config cfg, const Mesh& mesh,
                 std::optional<c10::Device> device = std::nullopt);
  PipelineEngine(PipelineEngine&&) noexcept;
  PipelineEngine& operator=(PipelineEngine&&) noexcept;
  ~PipelineEngine();

  // One optimizer step over micro_batches() micro-batches: `inputs` read on the first stage,
  // `targets` on the last (the others may pass empty lists). Returns the step's mean loss on
  // every rank as a one-element fp32 tensor on the stage's device, as DeepSpeed's train_batch:
  // reading it (item()) waits for the device, so read it when printing, not every step. Every
  // step's activations must have the first step's shape (zero/pipeline/runtime/
  // runtime.hpp).
  at::Tensor train_batch(const std::vector<at::Tensor>& inputs,
                         const std::vector<at::Tensor>& targets);

  // Checkpoints per stage: each stage's engine writes its own shards under dir/stage<s>/ (over
  // its data-parallel group; every rank calls it; under tensor parallelism each tensor-parallel
  // rank its blocks under dir/stage<s>/tp<r>/, so no two ranks write one file), its parameters
  // named by their layer's index
  // in the whole list ("3.wq.weight"), a tied weight once, under its owner's name; beside them
  // pipeline.json records P, v and the partition (PipelineSaveLayout). Under the interleaved
  // schedule a stage's v chunks are saved together, by the stage's one engine, still named by
  // their layers' global indices (Megatron keeps model0 .. model<v-1> per pipeline rank instead,
  // numbered within the chunk), so a save loads at any P, v and schedule. save_checkpoint returns
  // once every stage's save is complete (an all-reduce over dp and pp: a failure throws on all).
  // load_checkpoint resumes a save of any pipeline.stages, partition, tensor-parallel and
  // data-parallel size of the same model: each stage reads its layers' parameters, master
  // weights, optimizer states and step counters from whichever stage directories (and their
  // tensor-parallel ranks' blocks) hold them (Engine::load_checkpoint(dirs,
  // tag, part): the part is its layers), then sends the loaded tied weights to their copies on the
  // other stages. Returns the tag.
  void save_checkpoint(const std::string& dir, const std::string& tag = "", int keep_last = 0);
  std::string load_checkpoint(const std::string& dir, const std::string& tag = "");
  // dir/stage<s>, or dir/stage<s>/tp<r> under tensor parallelism: where this rank's stage's
  // checkpoints go (and the directory keep_last prunes).
  std::string stage_dir(const std::string& dir) const;

  int stage() const;
  int stages() const;
  int micro_batches() const;  // gradient_accumulation_steps
  // Model chunks per stage: pipeline.virtual_stages (1 unless the schedule is interleaved).
  int virtual_stages() const;
  bool is_first_stage() const { return stage() == 0; }
  bool is_last_stage() const { return stage() == stages() - 1; }
  // Virtual stage c (chunk c / P of stage c % P) holds layers bounds()[c] .. bounds()[c + 1] - 1
  // of the list; with one chunk per stage, stage s holds bounds()[s] .. bounds()[s + 1] - 1.
  const std::vector<int>& bounds() const;
  // The engine of this stage (its parameters are named "<layer index>.<name in the layer>").
  // Interleaved, it trains all the stage's chunks and its accumulation window counts their
  // backward passes: its config() says gradient_accumulation_steps m x v and a train_batch_size
  // v times the step's (micro_batches() is m).
  Engine& engine();
  const Engine& engine() const;
  // Whether the last step was applied (false: an fp16 overflow skipped it on every stage).
  bool last_step_applied() const;
  // Where this rank's last train_batch spent its time (this stage's own view).
  const StepTimes& last_step_times() const;
  // Every stage's `values` (the same count on every rank), by stage: an all-gather over the
  // pipeline group, for reports that show each stage (its times, its memory). A collective.
  std::vector<std::vector<double>> gather_over_stages(const std::vector<double>& values) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace zero::pipeline
