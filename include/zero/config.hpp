// Training configuration: DeepSpeed's key names and meanings, loaded from YAML or JSON.
//
// A DeepSpeed JSON config loads unchanged (JSON is a subset of YAML) and means what it means to
// DeepSpeed 0.19: same defaults, same schedule timing. Every key is checked against one policy
// (zero/config/): a key zero honours is applied; a key that has no effect in this setting (for
// DeepSpeed too) is a warning naming the key and why; a key whose meaning zero cannot honour is
// a ConfigError naming the file, the line and the fix. Nothing is silently ignored.
// Unset fields below hold DeepSpeed's defaults.
#pragma once

#include <chrono>
#include <cstdint>
#include <limits>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "zero/errors.hpp"

namespace zero {

enum class Dtype { kFloat32, kBFloat16, kFloat16 };
const char* dtype_name(Dtype d);

struct OptimizerConfig {
  std::string type = "AdamW";  // "AdamW", "Adam" (DeepSpeed's Adam is AdamW by default), "SGD"
  double lr = 1e-3;            // FusedAdam's, torch.optim.AdamW's and torch.optim.SGD's default
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  // FusedAdam's and SGD's default; with `torch_adam: true` DeepSpeed builds torch.optim.AdamW,
  // whose default is 0.01, and the loader sets that when the key is absent.
  double weight_decay = 0.0;
  double momentum = 0.0;  // SGD
  double dampening = 0.0;
  bool nesterov = false;
  // DeepSpeed's `optimizer.params.torch_adam` (AdamW): DeepSpeed then steps with
  // torch.optim.AdamW and unscales and clips the gradient as separate ops. zero then does the
  // same, op for op (bit for bit torch's AdamW, ~9 passes over the shard, one host read of the
  // overflow verdict per step) instead of its one-pass fused kernel with the clip folded in.
  // Not under optimizer offload, whose CPU kernel is zero's own (a warning says so).
  bool torch_adam = false;

  // optimizer.param_groups: options for the parameters whose name matches a pattern, as
  // torch.optim's param groups give them. Each parameter is in at most one group; the others
  // keep the options above. A pattern matching no trainable parameter, or a parameter matched
  // by two groups, is an error at initialize.
  struct ParamGroup {
    std::string params;     // ECMAScript regex, searched in the parameter's name ("bias$")
    double lr_scale = 1.0;  // the group's lr is the scheduled lr times this
    std::optional<double> weight_decay;  // unset: weight_decay above (and no_weight_decay)
  };
  std::vector<ParamGroup> param_groups;
};

// "[{params: bias$, lr_scale: 0.1, weight_decay: 0}]", "" for none: how a checkpoint records
// the groups, so that a resume with other groups is refused.
std::string param_groups_text(const std::vector<OptimizerConfig::ParamGroup>& groups);

struct SchedulerConfig {
  // "" (constant lr), "WarmupLR", "WarmupDecayLR", "WarmupCosineLR" (DeepSpeed's names).
  std::string type;
  double warmup_min_lr = 0.0;
  // Unset: optimizer.lr for WarmupLR, 0.001 for WarmupDecayLR (DeepSpeed 0.19's constructors).
  std::optional<double> warmup_max_lr;
  int64_t warmup_num_steps = 1000;
  std::string warmup_type = "log";  // "log" or "linear", as DeepSpeed
  // Required by the decaying schedules. 0 with total_num_steps_auto: "auto" in the file, to be
  // filled by the application (HF's Trainer fills it with max_steps) before zero::initialize.
  int64_t total_num_steps = 0;
  bool total_num_steps_auto = false;
  double warmup_min_ratio = 0.0;  // WarmupCosineLR
  double cos_min_ratio = 1e-4;    // WarmupCosineLR
};

struct ZeroOptimizationConfig {
  int stage = 0;
  // stage: "auto": the planner picks at initialize (include/zero/auto_strategy.hpp), for the
  // budget below or the device's free memory.
  bool stage_auto = false;
  int64_t auto_device_memory = 0;  // bytes per rank "auto" plans for; 0: the device's free memory
  int64_t reduce_bucket_size = 500'000'000;     // elements, as DeepSpeed
  int64_t allgather_bucket_size = 500'000'000;  // elements in flight while gathering params
  // DeepSpeed's default is false below stage 3; it only changes timing, and zero overlaps.
  bool overlap_comm = true;
  bool contiguous_gradients = true;
  bool reduce_scatter = true;
  // ZeRO-Offload (zero_optimization.offload_optimizer: {device: cpu}, or the legacy
  // cpu_offload: true), stages 1 and 2: see OffloadOptimizerConfig.
  struct OffloadOptimizerConfig {
    bool enabled = false;
    // Page-locked host buffers (DeepSpeed 0.19's default): asynchronous, full-bandwidth copies
    // between the GPU and the host. No effect on CPU-only runs.
    bool pin_memory = true;
    // Threads of this rank's CPU optimizer step (zero's key); 0: torch's intra-op thread count
    // (OMP_NUM_THREADS). Give each rank its own cores: cores per node / ranks per node, with
    // the ranks bound to disjoint cores (numactl --physcpubind, taskset).
    int threads = 0;
  } offload_optimizer;
  // Quantized gradient reduction, stages 1 and 2 (ZeRO++'s qgZ; DeepSpeed reads
  // zero_quantized_gradients at stage 3 only): each bucket is quantized blockwise (int8 or int4,
  // one fp32 scale per block) and exchanged with one all-to-all, so every rank receives only
  // its shard's blocks, dequantizes them and sums in fp32. Error feedback keeps each rank's
  // quantization residual (one full gradient's worth of elements) and adds it to the next step.
  struct QuantizedGradientsConfig {
    bool enabled = false;        // zero_quantized_gradients
    int bits = 8;                // zero_quantized_gradients_bits: 8 or 4
    int64_t block = 2048;        // zero_quantized_gradients_block: elements per scale
    bool error_feedback = true;  // zero_quantized_gradients_error_feedback
    // zero_quantized_gradients_error_feedback_dtype: how the residual is stored, per gradient
    // element per rank: "auto" the dtype gradients travel in (communication_data_type: 2 bytes
    // for a bf16/fp16 model, 4 for fp32), "fp32" 4, "bf16"/"fp16" 2, "int8" 1 + 4/block (codes
    // and one fp32 scale per zero_quantized_gradients_block, as DeepSpeed's LoCo keeps it).
    std::string error_feedback_dtype = "auto";
    // zero_quantized_gradients_hierarchical: within the node first, then across nodes, when
    // the data-parallel group spans several nodes with several ranks on each (as ZeRO++'s qgZ);
    // false: one flat all-to-all.
    bool hierarchical = true;
  } quantized_gradients;
  // ZeRO-3's keys, with DeepSpeed's names (each also without its "stage3_" prefix, as
  // DeepSpeed's aliases allow), meanings and defaults (deepspeed/runtime/zero/config.py). Stage 3
  // reads them (docs/zero-stages.md says which take effect); below stage 3 they have no effect,
  // in DeepSpeed as here (a warning says so).
  struct Stage3Config {
    // Elements gathered ahead of use; 0: no prefetch. "auto": 0.9 x hidden^2 (transformers'
    // HfTrainerDeepSpeedConfig), resolved from the model by resolve_auto().
    int64_t prefetch_bucket_size = 50'000'000;
    bool prefetch_bucket_size_auto = false;
    // Parameters of at most this many elements are never partitioned. "auto": 10 x hidden.
    int64_t param_persistence_threshold = 100'000;
    bool param_persistence_threshold_auto = false;
    // Cap on the elements kept whole that way (DeepSpeed: sys.maxsize).
    int64_t model_persistence_threshold = std::numeric_limits<int64_t>::max();
    // The most elements gathered at once (caps prefetch).
    int64_t max_live_parameters = 1'000'000'000;
    // A unit used again within this many elements is not released in between.
    int64_t max_reuse_distance = 1'000'000'000;
    // Checkpoints also hold the gathered 16-bit weights (DeepSpeed's save_16bit_model). "auto":
    // false, accelerate's zero3_save_16bit_model default. Also read under DeepSpeed's deprecated
    // stage3_gather_fp16_weights_on_model_save.
    bool gather_16bit_weights_on_model_save = false;
    // Fills the "auto" values from the model's hidden size as transformers does (0.9 x hidden^2
    // rounded down, 10 x hidden); clears the flags. hidden must be positive.
    void resolve_auto(int64_t hidden);
  } stage3;
};

struct Fp16Config {
  bool enabled = false;
  double loss_scale = 0.0;  // 0 = dynamic
  int initial_scale_power = 16;
  int loss_scale_window = 1000;
  int hysteresis = 2;
  double min_loss_scale = 1.0;
  // DeepSpeed's fp16.auto_cast: the model's floating-point inputs are cast to fp16 before its
  // forward (integer inputs such as token ids are left alone, as DeepSpeed 0.19 does). zero
  // does not call the model's forward, so the application applies it with Engine::cast_input.
  bool auto_cast = false;
};

// tensor_parallel: DeepSpeed's AutoTP section (tensor_parallel.autotp_size) and Megatron's
// sequence parallelism. The layers and the tp x dp groups: zero/tensor_parallel.hpp.
struct TensorParallelConfig {
  // Ranks per tensor-parallel group (YAML alias: tensor_parallel.size). 1 (DeepSpeed's 0 means
  // the same): no tensor parallelism. Must divide the world size; the data-parallel size is
  // world size / autotp_size.
  int autotp_size = 1;
  // Megatron-SP: activations outside attention and the MLP split along the sequence.
  bool sequence_parallel = false;
};

// DeepSpeed's `pipeline` section (stages, partition, activation_checkpoint_interval) and
// zero's pipeline.schedule. stages 1: no pipeline. The runtime is zero/pipeline/runtime/.
struct PipelineConfig {
  int stages = 1;  // P; "auto" (DeepSpeed's default): 1
  // How the layers are cut: "parameters" (DeepSpeed PipelineModule's default: balanced by
  // parameter count), "compute" (by FLOPs per token) or "uniform" (layers per stage).
  std::string partition = "parameters";
  int activation_checkpoint_interval = 0;  // 0: off; n: runs of n layers recomputed in backward
  // "1f1b" (PipeDream-Flush), "gpipe" or "interleaved" (Megatron-LM's interleaved 1F1B, with
  // virtual_stages >= 2).
  std::string schedule = "1f1b";
  // Model chunks per stage under the interleaved schedule (Megatron-LM's
  // virtual_pipeline_model_parallel_size): stage s holds chunks s, s + P, ..., and the bubble is
  // (P - 1) / (virtual_stages x micro-batches). 1: one chunk per stage (GPipe, 1F1B).
  int virtual_stages = 1;
};

struct Config {
  // Batch triple: 0 means "derive from the other two and the world size" (see resolve_batch).
  int64_t train_batch_size = 0;
  int64_t train_micro_batch_size_per_gpu = 0;
  int64_t gradient_accumulation_steps = 0;
  // train_micro_batch_size_per_gpu: "auto". Derived from the other two when they fix it (as
  // DeepSpeed); otherwise the planner picks it where there is a memory budget.
  bool micro_batch_auto = false;

  double gradient_clipping = 1.0;  // 0 = off; DeepSpeed 0.19 clips at 1.0 unless told otherwise
  // DeepSpeed's gradient_predivide_factor f: gradients are multiplied by 1/f before they are
  // summed over ranks and by f/N after, so an fp16 sum cannot overflow where the average would
  // not. Unset: N under fp16 (DeepSpeed's reduce-scatter path divides by N first), 1 otherwise.
  // prescale_gradients: true means f = N.
  std::optional<double> gradient_predivide_factor;
  bool prescale_gradients = false;
  bool bf16 = false;
  Fp16Config fp16;
  ZeroOptimizationConfig zero_optimization;
  OptimizerConfig optimizer;
  SchedulerConfig scheduler;
  TensorParallelConfig tensor_parallel;
  PipelineConfig pipeline;
  int steps_per_print = 10;  // logging only (DeepSpeed: unset, no periodic print)

  // Dtype gradients travel in; defaults to the model's compute dtype.
  std::optional<Dtype> communication_data_type;
  // data_types.grad_accum_dtype: the dtype micro-steps' gradients are summed in; unset means the
  // model dtype, as in DeepSpeed (see accum_dtype()). fp32 or the model dtype only. The
  // accumulator and the reduced gradient shard are kept in this dtype (DeepSpeed's arithmetic
  // and its memory); only an offloaded host shard stays fp32.
  std::optional<Dtype> grad_accum_dtype;

  // Our own keys.
  // comm_timeout_s: DeepSpeed's and torch.distributed's 30 minutes (README: comm_timeout_s).
  std::chrono::milliseconds comm_timeout{std::chrono::seconds(1800)};
  uint64_t seed = 42;
  // Parameters whose name contains one of these substrings get no weight decay. Empty by
  // default: DeepSpeed decays every parameter it is given (our presets exclude bias and norm).
  std::vector<std::string> no_weight_decay;

  // Application-defined section (`trainer:` by default): keys declared by the application
  // through ConfigExtension, values kept as strings.
  std::map<std::string, std::string> extra;

  // Non-fatal remarks found while loading (a key with no effect here, the value an "auto" key
  // resolved to, ...). The engine prints them once, on rank 0.
  std::vector<std::string> warnings;

  // Batch keys the file gave as "auto": resolve_batch reports the values it chose for them.
  std::vector<std::string> auto_batch_keys;

  // Where this config came from, for error messages ("configs/zero2.yaml" or "<string>").
  std::string source = "<defaults>";

  // Keys an application adds under one top-level section, with their types, so they are
  // checked like ours. Values land in Config::extra as "section.key" -> text.
  struct Extension {
    enum class Type { kInt, kFloat, kBool, kString };
    struct Key {
      std::string name;  // without the section prefix
      Type type;
      std::string default_value;
      std::string help;
    };
    std::string section = "trainer";
    std::vector<Key> keys;
  };

  // `overrides` are "dotted.key=value" strings (from --set); they are checked like file keys.
  static Config from_file(const std::string& path, const std::vector<std::string>& overrides = {},
                          const Extension* ext = nullptr);
  // `source_name` names the text in messages ("<string>" when the caller has no better name).
  static Config from_string(const std::string& text, const std::string& source_name = "<string>",
                            const std::vector<std::string>& overrides = {},
                            const Extension* ext = nullptr);

  // Fills in the batch triple for `world_size` ranks and checks
  // train_batch_size == micro * accumulation * world_size. Throws ConfigError. Unset ("auto")
  // keys are derived from the others; what cannot be derived is 1 (micro batch, then
  // accumulation). The values chosen for "auto" keys are added to `warnings`.
  void resolve_batch(int world_size);

  // Typed access to Config::extra (throws ConfigError for an undeclared key).
  int64_t extra_int(const std::string& key) const;
  double extra_float(const std::string& key) const;
  bool extra_bool(const std::string& key) const;
  const std::string& extra_string(const std::string& key) const;

  // The compute dtype of the model's parameters.
  Dtype param_dtype() const {
    return bf16 ? Dtype::kBFloat16 : (fp16.enabled ? Dtype::kFloat16 : Dtype::kFloat32);
  }
  // The dtype gradients accumulate in across micro-steps.
  Dtype accum_dtype() const { return grad_accum_dtype.value_or(param_dtype()); }
};

}  // namespace zero
