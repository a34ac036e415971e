// The training engine: wraps a torch::nn::Module for data-parallel training with ZeRO sharding.
//
//   auto cfg = zero::Config::from_file("configs/zero2.yaml");
//   auto engine = zero::initialize(model, cfg);   // process group from torchrun's environment
//   for (...) {
//     auto loss = compute_loss(model, batch);     // ordinary LibTorch code
//     engine.backward(loss);                      // scaled for accumulation, reduced as it goes
//     engine.step();                              // optimizer step at accumulation boundaries
//   }
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "zero/config.hpp"
#include "zero/deferred_init.hpp"
#include "zero/group.hpp"
#include "zero/groups.hpp"
#include "zero/memory.hpp"
#include "zero/parallel_dims.hpp"

namespace torch::nn {
class Module;
template <typename Contained>
class ModuleHolder;
}  // namespace torch::nn

namespace zero {

// Counters a user (and our tests) can read to see what the engine did.
struct EngineStats {
  int64_t buckets_launched_in_backward = 0;  // reductions started while autograd was running
  int64_t buckets_launched_after_backward = 0;
  double comm_wait_seconds = 0;  // time spent waiting on reductions after backward returned
  // Time step() spent waiting for parameter all-gathers after the last bucket's update was
  // queued (the part of the gather the update did not hide; host-blocking on gloo only). Stage
  // 3 adds the waits for the units' gathers in forward and backward since the previous step:
  // what neither prefetch nor the compute before the wait hid.
  double allgather_wait_seconds = 0;
  double last_grad_norm = 0;  // global norm before clipping, of the last optimizer step
  int64_t optimizer_steps = 0;
  int64_t micro_steps = 0;
  int64_t skipped_steps = 0;  // fp16 overflows: the step was skipped on every rank
  // Whether the last optimizer step was skipped (fp16 overflow): last_grad_norm is then the
  // norm of the last step that was applied, not of this one.
  bool last_step_skipped = false;
  // The gradient bucket pool: its buffers (a fixed number; gradients that arrive for a bucket
  // further ahead wait in autograd's tensor instead of growing it) and the most in use at once.
  int64_t bucket_buffers = 0;
  int64_t bucket_buffers_in_use_peak = 0;
  // The device's caching allocator: allocations it served only after freeing its cache and
  // retrying (CUDA's num_alloc_retries, each a device sync with cudaFree/cudaMalloc), for the
  // whole device since the process started; read after each backward and step, 0 on CPU. A
  // count that keeps growing means the allocator thrashes near capacity: see
  // PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True in docs/zero-stages.md.
  int64_t allocator_retries = 0;
};

// What Engine::state_dict returns and where.
struct StateDictOptions {
  // true: the fp32 master weights (exact, what the optimizer updates); false: the values the
  // module computes with (bf16/fp16 under mixed precision, the master rounded).
  bool master = true;
  // -1: every rank gets the full dictionary; r >= 0: rank r does, the others an empty one.
  int to_rank = -1;
  // Copies land in host memory (a full model rarely fits beside the training state on a GPU);
  // false keeps them on the module's device.
  bool cpu = true;
};
using StateDict = std::vector<std::pair<std::string, at::Tensor>>;

// Which saved parameters belong to an engine that trains part of a model (a pipeline stage's
// layers), by name: Engine::load_checkpoint(dirs, tag, part) skips the others. Empty: the
// engine holds the whole model.
using ModelPart = std::function<bool(const std::string& name)>;

class Engine {
 public:
  struct Impl;
  explicit Engine(std::unique_ptr<Impl> impl);
  Engine(Engine&&) noexcept;
  Engine& operator=(Engine&&) noexcept;
  ~Engine();

  // Back-propagates loss / gradient_accumulation_steps and reduces gradients as their buckets
  // fill. Call it instead of loss.backward().
  void backward(const at::Tensor& loss);
  // A pipeline stage's backward: back-propagates `outputs` with `grad_outputs` (one each, same
  // shapes) through the same hooks, buckets and accumulation window as backward(loss), and
  // scales nothing: the gradients are used as they are. As in DeepSpeed's PipelineEngine, only
  // the last stage scales: its backward(loss) multiplies the loss by
  //   loss_scale() / (gradient_accumulation_steps x predivide)
  // (loss_scale() is 1 without fp16; predivide is gradient_predivide_factor, world_size() under
  // prescale_gradients or by default under fp16, else 1), and the gradients it sends back carry
  // that factor, which every stage shares. A caller with gradients of its own making (dL/dout of
  // the micro-batch's loss) multiplies them by the same factor. A micro-step calls one of the
  // two backward()s, then step().
  void backward(const std::vector<at::Tensor>& outputs,
                const std::vector<at::Tensor>& grad_outputs);
  // Applies the optimizer at a gradient-accumulation boundary; returns whether it did (false
  // also when fp16 found an overflow and skipped the step on every rank).
  //
  // On CUDA, step() never waits for the device: the norm, the inf check, the clip coefficient
  // and the fp16 loss scale stay on the device, and the outcome (norm, overflow) reaches the
  // host at the next step() (or when settled_stats(), loss_scale() or save_checkpoint() ask).
  // There, step() returns true at every boundary; an fp16 overflow it skipped on the device shows
  // in stats().skipped_steps one step later, and a non-finite norm in bf16/fp32 (the step is
  // skipped on the device too) is thrown by the next step(). On CPU the outcome is known at
  // once and step() reports it exactly.
  bool step();
  bool is_gradient_accumulation_boundary() const;

  int rank() const;
  int world_size() const;
  // The dtype the module's parameters hold (and compute in) since initialize: bf16 or fp16
  // under mixed precision, else fp32. Feed the model inputs of this dtype.
  at::ScalarType compute_dtype() const;
  int stage() const;
  double lr() const;          // the learning rate the next optimizer step will use
  double loss_scale() const;  // fp16: the current dynamic loss scale; 1 otherwise
  const Config& config() const;
  // DeepSpeed's fp16.auto_cast, which its engine applies to each positional input of the
  // model's forward: with fp16 enabled and auto_cast set, a floating-point `input` comes back
  // as fp16; anything else (auto_cast off, integer token ids, masks) comes back unchanged.
  // zero does not call the model's forward, so the application passes its inputs through here.
  at::Tensor cast_input(const at::Tensor& input) const;
  // Counters as the host knows them now, without waiting for the device. On CUDA the last
  // step's outcome (last_grad_norm, an fp16 skip) arrives with the next step(); settled_stats()
  // waits for it (a sync: call it at print time, not every step). On CPU both are the same.
  const EngineStats& stats() const;
  const EngineStats& settled_stats() const;
  std::shared_ptr<torch::nn::Module> module() const;
  // The process group the engine shards over (rank(), size(); opaque otherwise): groups().dp.
  Group& group() const;
  // The groups it was handed (initialize(model, cfg, group): {group}, no norm groups).
  const Groups& groups() const;

  // This rank's memory for model states (no collective).
  MemoryReport memory_report() const;
  // Every rank's report, in rank order (a collective: call on all ranks).
  std::vector<MemoryReport> gather_memory_reports() const;
  // Mean of `value` over ranks (a collective), e.g. to log the loss of the global batch.
  double all_reduce_mean(double value) const;
  // The same for a tensor on the model's device, without reading it on the host (the trainer
  // averages a window of losses in one collective and reads them at print time).
  at::Tensor all_reduce_mean(const at::Tensor& values) const;
  // Every rank's `value`, in rank order (a collective), e.g. each rank's peak memory.
  std::vector<int64_t> all_gather_values(int64_t value) const;
  // The full flat parameters as fp32 (every rank holds them), padding excluded, in the module's
  // named_parameters() order (checksums, comparisons); at stage 3 a collective: every rank calls.
  at::Tensor flat_parameters() const;
  // Every parameter by name, in named_parameters() order (tied parameters under their first
  // name, frozen ones included), as full tensors: for evaluation, export or comparison without
  // going through disk. A collective when opts.master and the stage shards the master weights
  // (1, 2), and always at stage 3: call it on every rank. Gathers one bucket at a time, so the
  // transient memory on top of the result is one bucket's fp32 values.
  StateDict state_dict(const StateDictOptions& opts = {}) const;

  // Checkpoints (zero/engine/engine_save.cpp, engine_load.cpp; the on-disk format is
  // zero/checkpoint/, consolidation checkpoint_io.hpp). Both are collectives: every rank calls
  // them, and a failure throws zero::CheckpointError on every rank. save_checkpoint writes dir/tag/
  // (tag "" = "step<optimizer_steps>") atomically, then points dir/latest at it and, with keep_last
  // > 0, deletes older checkpoints. Call it right after a step() that returned true.
  void save_checkpoint(const std::string& dir, const std::string& tag = "", int keep_last = 0);
  // Restores parameters, optimizer states and step counters from dir/tag (tag "" = the one
  // dir/latest names; returns the tag), on any number of ranks and any stage: the files hold
  // parameters by name, so a checkpoint of N ranks loads on M.
  std::string load_checkpoint(const std::string& dir, const std::string& tag = "");
  // The same from several checkpoints that together hold the model: the saves of the
  // tensor-parallel ranks of one run (dir/tp0, dir/tp1, ...; tensor_parallel_checkpoint_dirs in
  // checkpoint_io.hpp lists them), each recording where its parameters' blocks lie in the whole
  // tensors (Groups::parts). Every rank reads the blocks that cover its own part under its own
  // Groups::parts, masters and optimizer states alike: a checkpoint saved under tensor-parallel
  // size 2 loads under 1 or 4, and one of size 1 under 2. The step counters come from dirs[0],
  // and so do this rank's random-generator states when dirs[0] holds the same blocks as this
  // rank (else it keeps its own). `tag` ("" = dirs[0]/latest's) must exist in every directory.
  // `part` set: this engine trains a part of the saved model (a pipeline stage loading the
  // stage directories of a save at another pipeline.stages): saved parameters outside the part
  // are skipped; each inside it must be this engine's, and each of this engine's saved.
  std::string load_checkpoint(const std::vector<std::string>& dirs, const std::string& tag = "",
                              const ModelPart& part = {});

 private:
  std::unique_ptr<Impl> impl_;
};

// The process group initialize(model, cfg) makes, from the launcher's environment (torchrun,
// Open MPI, Slurm; world size 1 needs none), with cfg's comm_timeout_s: for an application that
// needs the group before initialize (resolve_auto in auto_strategy.hpp, or to pass it on).
// `device`: where the model's tensors live (CPU: gloo, CUDA: NCCL).
std::shared_ptr<Group> process_group_from_env(const Config& cfg, c10::DeviceType device);
// Mixed precision changes the model in place: under bf16: {enabled: true} (fp16 likewise)
// initialize turns the module's floating-point parameters and buffers (frozen ones too, as
// DeepSpeed casts the whole module) into bf16 tensors; the engine keeps the fp32 master weights
// itself. The model's inputs must then be bf16 too, or LibTorch stops with "mat1 and mat2 must
// have the same dtype": x.to(engine.compute_dtype()).
//
// Data parallelism over the process group from the launcher's environment (world size 1 needs
// none). Refuses (ConfigError) tensor_parallel.autotp_size or pipeline.stages > 1, which need the
// model built over a mesh's groups: initialize(model, cfg, mesh) and pipeline::PipelineEngine.
Engine initialize(std::shared_ptr<torch::nn::Module> model, Config cfg);
// Over a given group (tests, or programs that manage their own): Groups{group}.
Engine initialize(std::shared_ptr<torch::nn::Module> model, Config cfg,
                  std::shared_ptr<Group> group);
// Over the groups of a mesh (groups.hpp): data parallel over groups.dp, the gradient norm over
// dp and then groups.norm. rank(), world_size() and the collectives below are dp's.
Engine initialize(std::shared_ptr<torch::nn::Module> model, Config cfg, Groups groups);
// A deferred model (deferred_init.hpp, docs/start-up.md): each rank fills what it keeps from
// `values` (stage 3: its shard and the root unit; stages 0-2: the whole flat buffer in the
// compute dtype on the model's device) and nothing is broadcast; every parameter must be
// deferred. An empty `values` is the overload without it.
Engine initialize(std::shared_ptr<torch::nn::Module> model, Config cfg,
                  std::shared_ptr<Group> group, const InitialValues& values);
Engine initialize(std::shared_ptr<torch::nn::Module> model, Config cfg, Groups groups,
                  const InitialValues& values);
// A model whose tensor-parallel layers were built over mesh.tp (parallel_dims.hpp): the engine
// shards over mesh.dp and sums the gradient norm over dp and tp, with the parameters every
// tensor-parallel rank holds whole counted once (engine_groups(*model, mesh)). cfg's
// tensor_parallel.autotp_size and sequence_parallel must agree with mesh.dims (the defaults, 1 and
// false, take the mesh's); mesh.dims.pp > 1 is refused: pipeline::PipelineEngine trains stages.
Engine initialize(std::shared_ptr<torch::nn::Module> model, Config cfg, const Mesh& mesh);

template <typename M>
Engine initialize(const torch::nn::ModuleHolder<M>& model, Config cfg) {
  return initialize(std::shared_ptr<torch::nn::Module>(model.ptr()), std::move(cfg));
}
template <typename M>
Engine initialize(const torch::nn::ModuleHolder<M>& model, Config cfg, const Mesh& mesh) {
  return initialize(std::shared_ptr<torch::nn::Module>(model.ptr()), std::move(cfg), mesh);
}

}  // namespace zero
