// PipelineEngine (include/zero/pipeline_engine.hpp): the stage's layers cut from the list,
// wrapped by the engine over dp with the pipeline group as a norm group, run by PipelineRuntime
// with EngineStage as its optimizer.
#include "zero/pipeline_engine.hpp"

#include <ATen/ATen.h>

#include <optional>
#include <stdexcept>
#include <string>

#include "comm/agree.hpp"
#include "comm/group.hpp"
#include "zero/checkpoint_io.hpp"
#include "zero/comm_overlap.hpp"
#include "zero/pipeline/engine/engine_stage.hpp"
#include "zero/pipeline/engine/save_layout.hpp"
#include "zero/pipeline/engine/stage_groups.hpp"
#include "zero/pipeline/partition.hpp"
#include "zero/pipeline/runtime/runtime.hpp"

namespace zero::pipeline {

struct PipelineEngine::Impl {
  std::vector<int> bounds;
  int stage = 0, stages = 1, micro_batches = 1, virtual_stages = 1;
  std::string partition;            // pipeline.partition, recorded with checkpoints
  std::shared_ptr<Group> pp, dp;    // the checkpoints' agreement spans both, and tp
  std::shared_ptr<Group> tp_group;  // null or of size 1 without tensor parallelism
  int tp = 1, tp_rank = 0;          // tensor-parallel ranks per stage, and this rank's
  EngineStage* engine = nullptr;    // owned by runtime
  std::unique_ptr<PipelineRuntime> runtime;
};

namespace {

void check(const Config& cfg, const Group& pp) {
  if (cfg.pipeline.stages != pp.size())
    throw std::invalid_argument(
        "pipeline.stages is " + std::to_string(cfg.pipeline.stages) +
        " but the pipeline group has " + std::to_string(pp.size()) +
        " ranks; build the mesh with pp = pipeline.stages "
        "(zero::ParallelDims::from_config(cfg).build_mesh(world))");
  if (cfg.zero_optimization.stage >= 2)
    throw std::invalid_argument(
        "zero_optimization.stage " + std::to_string(cfg.zero_optimization.stage) +
        " with pipeline.stages > 1: each stage's gradients would be reduce-scattered after "
        "every micro-batch (gradient_accumulation_steps times the traffic of stage 1), as "
        "DeepSpeed also refuses; set zero_optimization.stage: 1 (or 0)");
}

// A collective over dp, tp and pp: throws CheckpointError on every rank when `err` is non-empty
// on any (this rank's own message, or one naming the stages that failed). The pipeline group
// joins one tensor-parallel rank across the stages, so a failure on another tensor-parallel rank
// of the stage reaches it through tp first.
void agree(const std::shared_ptr<Group>& dp, const std::shared_ptr<Group>& tp,
           const std::shared_ptr<Group>& pp, c10::Device device, const std::string& err,
           const std::string& what, const std::string& failure) {
  // On the stage's device, where its groups move tensors (an NCCL group's GPU; gloo: the
  // host); not dp's bound device, which a data-parallel group of one rank does not have.
  at::Tensor failed =
      at::full({1}, err.empty() ? 0 : 1, at::TensorOptions().dtype(at::kLong).device(device));
  comm::of(dp)->all_reduce_sum(failed, "pipeline " + what + ": agree over dp").wait();
  if (tp && tp->size() > 1)
    comm::of(tp)->all_reduce_sum(failed, "pipeline " + what + ": agree over tp").wait();
  const at::Tensor stages =
      comm::gather_status(*comm::of(pp), failed, "pipeline " + what + ": agree over pp");
  if (!err.empty()) throw CheckpointError(err);
  std::string which;
  for (int64_t s = 0; s < stages.size(0); ++s)
    if (stages[s][0].item<int64_t>() > 0) which += (which.empty() ? "" : ", ") + std::to_string(s);
  if (!which.empty())
    throw CheckpointError(what + ": pipeline stage " + which + " " + failure +
                          " (the error on its ranks says why)");
}

// The engine's batch triple for a stage of v chunks: its accumulation window counts the
// stage's m x v chunk backward passes (EngineStage), so gradient_accumulation_steps and
// train_batch_size are v times the step's, resolved first for the data-parallel group.
Config interleaved_engine_config(Config cfg, int dp_size, int v, int& micro_batches) {
  cfg.resolve_batch(dp_size);
  micro_batches = static_cast<int>(cfg.gradient_accumulation_steps);
  if (v > 1) {
    cfg.gradient_accumulation_steps *= v;
    cfg.train_batch_size *= v;
    cfg.auto_batch_keys.clear();  // reported once, above, for the step's values
  }
  return cfg;
}

}  // namespace

int virtual_stages(const Config& cfg) {
  // The key lived in Config::extra before PipelineConfig had the field: a program still setting
  // it there would silently run one chunk per stage.
  if (cfg.extra.count("pipeline.virtual_stages"))
    throw std::invalid_argument(
        "Config::extra[\"pipeline.virtual_stages\"] is no longer read; set "
        "cfg.pipeline.virtual_stages (the YAML key pipeline.virtual_stages fills it)");
  return cfg.pipeline.virtual_stages;
}

bool pipeline_partitioned(const Config& cfg, const std::string& key) {
  auto it = cfg.extra.find(key);
  return it == cfg.extra.end() || it->second != "false";
}

PipelineEngine::PipelineEngine(std::vector<Layer> layers, LossFn loss, Config cfg,
                               std::shared_ptr<Group> pp, std::shared_ptr<Group> dp,
                               std::optional<c10::Device> device)
    : PipelineEngine(std::move(layers), std::move(loss), std::move(cfg),
                     PipelineGrid{std::move(pp), std::move(dp), nullptr}, device) {}

PipelineEngine::PipelineEngine(std::vector<Layer> layers, LossFn loss, Config cfg,
                               const Mesh& mesh, std::optional<c10::Device> device)
    : PipelineEngine(std::move(layers), std::move(loss), std::move(cfg), PipelineGrid::of(mesh),
                     device) {}

PipelineEngine::PipelineEngine(std::vector<Layer> layers, LossFn loss, Config cfg,
                               const PipelineGrid& grid, std::optional<c10::Device> device)
    : impl_(std::make_unique<Impl>()) {
  const std::shared_ptr<Group>&pp = grid.pp, &dp = grid.dp;
  if (!pp || !dp) throw std::invalid_argument("pipeline: a pipeline and a data-parallel group");
  check(cfg, *pp);
  auto& m = *impl_;
  m.stage = pp->rank();
  m.stages = pp->size();
  const ScheduleKind schedule = parse_schedule_kind(cfg.pipeline.schedule);
  m.virtual_stages = pipeline::virtual_stages(cfg);
  const int v = m.virtual_stages;
  StageLayers stage(std::move(layers), parse_partition_method(cfg.pipeline.partition), m.stages,
                    m.stage, cfg.pipeline.activation_checkpoint_interval, v);
  if (device) stage.to(*device);
  m.bounds = stage.bounds();
  m.partition = cfg.pipeline.partition;
  m.pp = pp;
  m.dp = dp;
  m.tp = grid.tp ? grid.tp->size() : 1;
  m.tp_rank = grid.tp ? grid.tp->rank() : 0;
  m.tp_group = grid.tp;
  // The norm (clipping, the fp16 overflow check) spans the tensor-parallel ranks and the stages:
  // each stage holds its own layers, and a tied weight is trained by its owner alone, so nothing
  // is replicated across the stages.
  // Read before cfg goes to the stage's engine.
  const bool cfg_sp = cfg.tensor_parallel.sequence_parallel;
  const bool overlap_p2p = overlap_p2p_comm(cfg);
  const bool pipe_partitioned = pipeline_partitioned(cfg, "pipeline.pipe_partitioned");
  const bool grad_partitioned = pipeline_partitioned(cfg, "pipeline.grad_partitioned");
  // A stage's own layers decide whether they can run (a sequence-parallel norm left unmarked
  // sits on the last stage only): every rank of the pipeline throws the same text, rather than
  // the other stages waiting comm_timeout_s in the next collective for the one that threw.
  std::optional<Groups> stage_groups_or;
  std::string stage_error;
  try {
    stage_groups_or = stage_groups(*stage.module(), cfg, dp, grid.tp, pp);
  } catch (const std::exception& e) {
    stage_error = e.what();
  }
  c10::Device agree_on = device.value_or(c10::Device(c10::kCPU));
  for (const auto& p : stage.module()->parameters()) {
    agree_on = p.device();
    break;
  }
  const std::string agreed =
      comm::agree_errors(*comm::of(pp), stage_error, agree_on, "pipeline stage checks");
  if (!agreed.empty()) throw std::invalid_argument("pipeline: " + agreed);
  const Groups groups = std::move(*stage_groups_or);
  if (v > 1) cfg = interleaved_engine_config(std::move(cfg), groups.dp->size(), v, m.micro_batches);
  auto engine =
      std::make_unique<EngineStage>(initialize(stage.module(), std::move(cfg), groups), v);
  m.micro_batches =
      static_cast<int>(engine->engine().config().gradient_accumulation_steps) / v;
  m.engine = engine.get();
  RuntimeOptions opts{schedule, m.micro_batches};
  opts.virtual_stages = v;
  opts.early_receives = overlap_p2p;  // pipeline.overlap_p2p_comm
  // On NCCL a receive posted ahead of a send that its message depends on (GPipe: every
  // gradient waits for the last activation; 1F1B with fewer micro-batches than stages;
  // interleaved warm-up) hangs if anything syncs the whole device in between (the caching
  // allocator's retry after an out-of-memory does): review 2026-12-07a M1. Early receives stay
  // where the message depends only on sends already made: 1F1B with m >= P; gloo (host
  // threads) everywhere.
  if (agree_on.is_cuda() &&
      !(schedule == ScheduleKind::OneFOneB && v == 1 && m.micro_batches >= m.stages)) {
    opts.early_receives = false;
  }
  // pipe_partitioned / grad_partitioned split what every tensor-parallel rank holds whole; under
  // sequence parallelism each rank's activation is its own part of the sequence already.
  if (m.tp > 1 && !cfg_sp) {
    opts.partition_group = comm::of(grid.tp);
    opts.partition_activations = pipe_partitioned;
    opts.partition_grads = grad_partitioned;
  }
  m.runtime = std::make_unique<PipelineRuntime>(std::move(stage), std::move(loss), comm::of(pp),
                                                std::move(engine), opts, comm::of(dp));
}

PipelineEngine::PipelineEngine(PipelineEngine&&) noexcept = default;
PipelineEngine& PipelineEngine::operator=(PipelineEngine&&) noexcept = default;
PipelineEngine::~PipelineEngine() = default;

at::Tensor PipelineEngine::train_batch(const std::vector<at::Tensor>& inputs,
                                       const std::vector<at::Tensor>& targets) {
  return impl_->runtime->train_batch(inputs, targets);
}

std::string PipelineEngine::stage_dir(const std::string& dir) const {
  return stage_save_dir(dir, impl_->stage, impl_->tp, impl_->tp_rank);
}

void PipelineEngine::save_checkpoint(const std::string& dir, const std::string& tag,
                                     int keep_last) {
  auto& m = *impl_;
  // The engine's save (agreed over dp), then the layout beside the shards by the first
  // data-parallel rank of each stage's tensor-parallel rank; then every rank of every stage learns
  // whether all of it was written, so that a stage whose save failed does not leave the others
  // waiting, and a load at another P right after finds every stage's.
  std::string err;
  try {
    engine().save_checkpoint(stage_dir(dir), tag, keep_last);
    if (m.dp->rank() == 0) {
      // Interleaved, the stage's v chunks are in its one engine's save (its accumulation window
      // of m x v passes is recorded there, and a load under another window rescales it).
      const PipelineSaveLayout layout{latest_checkpoint_tag(stage_dir(dir)), m.stages, m.tp,
                                      m.virtual_stages, m.bounds};
      write_save_layout(dir, m.stage, m.tp_rank, layout, m.partition);
    }
  } catch (const std::exception& e) {
    err = e.what();
  }
  agree(m.dp, m.tp_group, m.pp, m.runtime->device(), err, "save_checkpoint('" + dir + "')",
        "could not save");
}

std::string PipelineEngine::load_checkpoint(const std::string& dir, const std::string& tag) {
  auto& m = *impl_;
  const std::string what = "load_checkpoint('" + dir + "')";
  // Each phase ends in an agreement over dp and pp, so that no rank enters the engine's
  // collectives, or the tied weights' exchange, while another has given up.
  PipelineSaveLayout saved;
  std::vector<std::string> dirs;
  std::string err;
  try {
    saved = read_pipeline_save(dir, tag);
    dirs = dirs_to_load(dir, saved, m.bounds, m.stages, m.stage, m.tp, m.tp_rank);
  } catch (const std::exception& e) {
    err = e.what();
  }
  agree(m.dp, m.tp_group, m.pp, m.runtime->device(), err, what, "could not read the save's layout");
  std::string loaded;
  try {
    loaded = engine().load_checkpoint(dirs, saved.tag,
                                      layers_part(stage_layer_ranges(m.bounds, m.stages, m.stage)));
  } catch (const std::exception& e) {
    err = e.what();
  }
  agree(m.dp, m.tp_group, m.pp, m.runtime->device(), err, what, "could not load its layers");
  m.runtime->sync_tied_weights();
  return loaded;
}

int PipelineEngine::stage() const { return impl_->stage; }
int PipelineEngine::stages() const { return impl_->stages; }
int PipelineEngine::micro_batches() const { return impl_->micro_batches; }
int PipelineEngine::virtual_stages() const { return impl_->virtual_stages; }
const std::vector<int>& PipelineEngine::bounds() const { return impl_->bounds; }
Engine& PipelineEngine::engine() { return impl_->engine->engine(); }
const Engine& PipelineEngine::engine() const { return impl_->engine->engine(); }
bool PipelineEngine::last_step_applied() const { return impl_->engine->last_step_applied(); }
const StepTimes& PipelineEngine::last_step_times() const { return impl_->runtime->last_times(); }

std::vector<std::vector<double>> PipelineEngine::gather_over_stages(
    const std::vector<double>& values) const {
  const int n = static_cast<int>(values.size()), p = impl_->stages;
  // On the stage's device: an NCCL pipeline group takes no host tensors. One read back below.
  at::Tensor mine =
      at::tensor(values, at::TensorOptions().dtype(at::kDouble)).to(impl_->runtime->device());
  at::Tensor all = at::empty({p * n}, mine.options());
  if (p > 1) {
    comm::of(impl_->pp)
        ->all_gather(all, mine, "all_gather of a report's values over the stages")
        .wait();
  } else {
    all.copy_(mine);
  }
  all = all.cpu();
  const double* v = all.data_ptr<double>();
  std::vector<std::vector<double>> out(p, std::vector<double>(n));
  for (int s = 0; s < p; ++s)
    for (int i = 0; i < n; ++i) out[s][i] = v[s * n + i];
  return out;
}

}  // namespace zero::pipeline
