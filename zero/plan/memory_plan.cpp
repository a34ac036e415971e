// The memory planner: formulas in include/zero/memory_plan.hpp.
// The search over configurations and its ranking: memory_search.cpp.
#include "zero/memory_plan.hpp"
#include "zero/plan/plan_shape.hpp"

#include "zero/params/shard_info.hpp"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <regex>
#include <stdexcept>

namespace zero {

int64_t ModelShape::ffn_dim() const {
  if (ffn > 0) return ffn;
  const int64_t h = 2 * 4 * hidden / 3;  // examples/gpt.cpp's rule
  return (h + 255) / 256 * 256;
}

int64_t ModelShape::head_count() const {
  return heads > 0 ? heads : std::max<int64_t>(1, hidden / 128);
}

int64_t ModelShape::kv_head_count() const { return kv_heads > 0 ? kv_heads : head_count(); }

int64_t ModelShape::kv_dim() const { return kv_head_count() * (hidden / head_count()); }

int64_t ModelShape::attention_params() const { return 2 * hidden * hidden + 2 * hidden * kv_dim(); }

std::vector<int64_t> ModelShape::parameter_sizes() const {
  const int64_t h = hidden, f = ffn_dim(), kv = kv_dim();
  std::vector<int64_t> sizes{vocab * h};  // the embedding
  for (int64_t l = 0; l < layers; ++l) {
    // examples/gpt.cpp's Block: wq, wk, wv, wo, w_gate, w_up, w_down, then the two norms.
    for (int64_t n : {h * h, kv * h, kv * h, h * h, f * h, f * h, h * f, h, h}) sizes.push_back(n);
  }
  sizes.push_back(h);                     // the final norm
  if (!tied) sizes.push_back(vocab * h);  // the head
  return sizes;
}

int64_t ModelShape::num_params() const {
  const int64_t per_layer = attention_params() + 3 * hidden * ffn_dim() + 2 * hidden;
  return vocab * hidden * (tied ? 1 : 2) + layers * per_layer + hidden;
}

const char* recompute_name(Recompute r) {
  static const char* const names[] = {"no checkpointing", "checkpointing",
                                      "checkpointing + CPU offload"};
  return names[static_cast<int>(r)];
}

int64_t ActivationEstimate::peak() const {
  // Without checkpointing everything is alive when backward starts. With it, the loss and head
  // tensors are gone before the first block is rebuilt.
  return checkpointed ? blocks + std::max(head + loss, recompute) : blocks + head + loss;
}

int64_t block_activation_bytes(const ModelShape& m, int64_t b, int64_t s, int p) {
  const int64_t sb = s * b;
  return sb * m.hidden * (8 * p + 8) + 4 * p * sb * m.ffn_dim() + 4 * m.head_count() * sb + 8 * sb;
}

ActivationEstimate predict_activations(const PlanInput& in, Recompute r) {
  ActivationEstimate a;
  const ModelShape& m = in.shape;
  if (!m.known()) return a;
  const int p = in.param_bytes;
  const int64_t sb = in.seq_len * in.micro_batch;
  const int64_t input = p * sb * m.hidden;  // what a checkpointed block keeps
  const int64_t block = block_activation_bytes(m, in.micro_batch, in.seq_len, p);
  a.head = sb * m.hidden * (4 + 2 * p) + 4 * sb + 8 * sb;
  a.loss = 12 * sb * m.vocab;
  a.checkpointed = r != Recompute::kNone;
  switch (r) {
    case Recompute::kNone:
      a.blocks = m.layers * block;
      break;
    case Recompute::kCheckpoint:
      a.blocks = m.layers * input;
      a.recompute = block;
      break;
    case Recompute::kCheckpointOffload:
      a.blocks = std::min<int64_t>(m.layers, 2) * input;
      a.host = m.layers * input;
      a.recompute = block;
      break;
  }
  return a;
}

namespace {

// FlatLayout::build's rule over sizes in the engine's order: a bucket closes before a parameter
// that would overflow it, and once it reaches the size. The largest bucket.
int64_t largest_bucket(const std::vector<int64_t>& ordered, int64_t bucket) {
  int64_t open = 0, largest = 0;
  for (int64_t n : ordered) {
    if (open > 0 && open + n > bucket) largest = std::max(largest, open), open = 0;
    open += n;
    if (open >= bucket) largest = std::max(largest, open), open = 0;
  }
  return std::max(largest, open);
}

}  // namespace

bool shape_is_model(const PlanInput& in) {
  const ModelShape& m = in.shape;
  return m.known() && m.vocab > 0 && m.num_params() == in.num_params;
}

int64_t max_bucket_elements(const PlanInput& in) {
  // 0 (DeepSpeed's reduce_bucket_size 0): every parameter its own bucket, as a bucket of 1.
  const int64_t bucket = std::max<int64_t>(1, in.bucket_elements);
  if (!shape_is_model(in)) return std::min(bucket, in.num_params);
  std::vector<int64_t> sizes = in.shape.parameter_sizes();
  std::reverse(sizes.begin(), sizes.end());  // the engine's order: reversed
  return largest_bucket(sizes, bucket);
}

int64_t bucket_buffer_elements(const PlanInput& in, int stage) {
  // As FlatLayout::chunk_numel with the engine's 64-element alignment: a rank's part of a buffer
  // is the largest bucket's shard, but at most reduce_bucket_size / N.
  constexpr int64_t kAlign = 64;
  const int64_t n = stage == 0 ? 1 : in.world_size;
  int64_t largest = max_bucket_elements(in);
  if (stage == 3) {
    const auto units = stage3_units(in);
    if (!units.empty()) largest = 0;
    for (const auto& u : units) {
      largest = std::max(largest, largest_bucket(u, std::max<int64_t>(1, in.bucket_elements)));
    }
  }
  const int64_t largest_shard = round_up(largest, n * kAlign) / n;
  if (in.bucket_elements == 0) return n * largest_shard;  // each parameter reduced whole
  const int64_t bounded =
      std::max(kAlign, std::max<int64_t>(1, in.bucket_elements) / n / kAlign * kAlign);
  return n * std::min(largest_shard, bounded);
}

namespace {

// One bucket buffer and its 1/N shard buffer (none at stage 0), in the communication dtype.
int64_t bucket_pair_bytes(const PlanInput& in, int stage) {
  const int64_t b = bucket_buffer_elements(in, stage);
  const int64_t out = stage == 0 ? 0 : b / in.world_size;
  return static_cast<int64_t>(in.comm_bytes) * (b + out);
}

// The compute-dtype copy of the shard that the CPU step writes (OptimizerOffload::reserve).
int64_t staging_bytes(const PlanInput& in) {
  return static_cast<int64_t>(static_cast<double>(in.param_bytes) *
                              static_cast<double>(in.num_params) /
                              static_cast<double>(in.world_size));
}

// The page-locked ring each reduced gradient shard lands in on its way to the host (GradToHost:
// three slots of one bucket shard, in the communication dtype).
int64_t landing_ring_bytes(const PlanInput& in, int stage) {
  return 3 * static_cast<int64_t>(in.comm_bytes) *
         (bucket_buffer_elements(in, stage) / in.world_size);
}

}  // namespace

int64_t stage3_gradient_path_bytes(const PlanInput& in, int stage) {
  if (stage != 3) return 0;
  const bool offload = in.offload_optimizer;
  const int64_t shard = offload ? 0
                                : static_cast<int64_t>(static_cast<double>(in.grad_accum_bytes) *
                                                       static_cast<double>(in.num_params) /
                                                       static_cast<double>(in.world_size));
  return shard + 2 * bucket_pair_bytes(in, stage);
}

namespace {

// Bytes of a residual of `numel` elements in the configured storage (compress::residual_bytes).
int64_t residual_bytes(const PlanInput& in, int64_t numel) {
  const int store =
      in.error_feedback_store_bytes > 0 ? in.error_feedback_store_bytes : in.comm_bytes;
  if (store != 1) return store * numel;
  const int64_t blocks = (numel + in.quantized_block - 1) / in.quantized_block;
  return blocks * (in.quantized_block + 4);
}

}  // namespace

int64_t error_feedback_bytes(const PlanInput& in, int stage) {
  if (stage == 0 || in.quantized_bits == 0 || !in.error_feedback) return 0;
  // A residual of every gradient element this rank sends (the whole gradient, not its shard):
  // the error of a peer's chunk is known only where it was quantized.
  return residual_bytes(in, in.num_params);
}

int64_t error_feedback_staging_bytes(const PlanInput& in, int stage) {
  if (stage != 3 || error_feedback_bytes(in, stage) == 0) return 0;
  return 2 * residual_bytes(in, bucket_buffer_elements(in, stage));
}

MemoryBreakdown plan_model_states(const PlanInput& in, int stage) {
  MemoryModelInput mi;
  mi.num_params = in.num_params;
  mi.world_size = in.world_size;
  mi.stage = stage;
  mi.param_bytes = in.param_bytes;
  mi.grad_accum_bytes = in.grad_accum_bytes;
  mi.optimizer_states = in.optimizer_states;
  mi.accumulation = in.accumulation;
  mi.overlap_comm = in.overlap_comm;
  // Two buffers where gradients go through them (stage 2, and stage 1 when it reduces during
  // backward as stage 2 does), otherwise only when the gradients or their accumulator are not
  // fp32 (fp32 in an fp32 accumulator reduces in place). Each holds a bucket (at most
  // reduce_bucket_size elements) and, where the reduction is a reduce-scatter (stages 1/2), its 1/N
  // shard; stage 0 all-reduces in place in the bucket buffer and needs no second one.
  // Under optimizer offload the gradients always go through them, on their way to the host
  // (stages 1-3; stage 3 also keeps its compute shard on the device, memory.cpp).
  const bool offload = in.offload_optimizer && stage > 0;
  const bool partitioned = !keeps_full_gradient(stage, in.accumulation, in.overlap_comm);
  const bool quantized = stage > 0 && in.quantized_bits > 0;  // out of place
  // Stage 3 frees them between steps (stage3_gradient_path_bytes).
  const int buffers =
      stage == 3                                                                                ? 0
      : (partitioned || in.comm_bytes != 4 || in.grad_accum_bytes != 4 || offload || quantized) ? 2
                                                                                                : 0;
  mi.comm_buffer_bytes = buffers * bucket_pair_bytes(in, stage);
  mi.offload = offload;
  if (offload) mi.comm_buffer_bytes += staging_bytes(in) + landing_ring_bytes(in, stage);
  mi.comm_buffer_bytes += error_feedback_bytes(in, stage) + error_feedback_staging_bytes(in, stage);
  // Stage 3: the root unit whole (memory.cpp); each block's parameters a 1/N shard.
  if (stage == 3) mi.root_params = stage3_root_params(in);
  return predict_model_states(mi);
}

int64_t plan_host_states(const PlanInput& in, int stage) {
  // Stage 3 keeps its error-feedback residuals in host memory (compress/error_feedback.hpp).
  const int64_t residuals = stage == 3 ? error_feedback_bytes(in, stage) : 0;
  if (!in.offload_optimizer || stage == 0) return residuals;
  const MemoryBreakdown st = plan_model_states(in, stage);
  const int64_t grad_shard = static_cast<int64_t>(4.0 * static_cast<double>(in.num_params) /
                                                  static_cast<double>(in.world_size));
  return st.master + st.optimizer + grad_shard + staging_bytes(in) + landing_ring_bytes(in, stage) +
         residuals;
}

int64_t deferred_cast_bytes(const PlanInput& in, int stage) {
  if (in.param_bytes == 4) return 0;  // the slot goes into fp32 as it is
  // flat_params.cpp's StagingRing::kSlotBytes of fp32: what one upload moves (and casts) at once.
  constexpr int64_t kSlotElements = (int64_t{16} << 20) / 4;
  int64_t largest = in.num_params;  // without a shape: the slot bounds it
  if (shape_is_model(in)) {
    largest = 0;
    if (stage == 3) {
      const auto units = stage3_units(in);
      if (!units.empty()) {
        for (int64_t n : units[0]) largest = std::max(largest, n);  // the root, whole
      }
      if (in.offload_optimizer) {
        // The master is in host memory: this rank's piece of each parameter goes up into the
        // compute shard from the host, at most one bucket's shard.
        int64_t param = 0;
        for (int64_t n : in.shape.parameter_sizes()) param = std::max(param, n);
        const int64_t piece = bucket_buffer_elements(in, stage) / in.world_size;
        largest = std::max(largest, std::min(param, piece));
      }
    } else {
      for (int64_t n : in.shape.parameter_sizes()) largest = std::max(largest, n);
    }
  }
  return 4 * std::min(kSlotElements, largest);
}

int64_t plan_startup_peak(const PlanInput& in, int stage) {
  const MemoryBreakdown st = plan_model_states(in, stage);
  // A device figure, as the phases after it are (trainer_loop.cpp's bounds, zero-memory's
  // device rows): what plan_host_states puts in host memory is left out - stage 3's
  // error-feedback residual (page-locked host memory, as large as the fp32 gradient: it alone
  // would have doubled a 7B stage-3 start-up figure) and, under optimizer offload, the master,
  // the optimizer states and the host gradient shard.
  const int64_t device_states = st.total() - plan_host_states(in, stage);
  const bool host_master = in.offload_optimizer && stage > 0;
  // Allocated up front by flattening, eager or deferred: the compute-dtype parameters (stage 3:
  // the root unit, and the shard only under optimizer offload) and the master, on the device unless offloaded. Then the
  // gradient path and the optimizer states: the steady state.
  const int64_t buffers = st.params + (host_master ? 0 : st.master);
  if (in.deferred_start) return std::max(buffers + deferred_cast_bytes(in, stage), device_states);
  // Eager: the user's parameters (built in fp32, each freed once its bucket is copied) and one
  // fp32 staging bucket under 16-bit parameters; at stage 3 every unit's buffer whole
  // (allocate_flat_and_master), of which st.params counted only the root. A caching allocator
  // holds all of it at the first bucket; RSS counts pages as they are touched and so sees less.
  const int64_t staging = in.param_bytes == 4 ? 0 : 4 * max_bucket_elements(in);
  const int64_t units = stage == 3 ? in.param_bytes * (in.num_params - stage3_root_params(in)) : 0;
  const int64_t flatten = 4 * in.num_params + buffers + units + staging;
  return std::max(flatten, device_states);
}

std::string model_state_formula(const PlanInput& in, int stage) {
  const int n = in.world_size;
  const bool split = stage > 0 && n > 1;
  std::string out;
  double sum = 0;
  auto term = [&](double c, bool divided) {
    char buf[48];
    if (divided && n > 1) {
      std::snprintf(buf, sizeof buf, "%gΨ/%d", c, n);
      sum += c / n;
    } else {
      std::snprintf(buf, sizeof buf, "%gΨ", c);
      sum += c;
    }
    out += (out.empty() ? "" : " + ") + std::string(buf);
  };
  if (stage == 3) {
    // The root unit whole; each block a p-byte shard (fp32: the master is the shard), the fp32
    // master shard, the gradient shard and the optimizer states' shards.
    const double root = in.num_params > 0 ? static_cast<double>(stage3_root_params(in)) /
                                                static_cast<double>(in.num_params)
                                          : 0.0;
    char buf[64];
    std::snprintf(buf, sizeof buf, "%dΨ_root (Ψ_root = %.3gΨ)", in.param_bytes, root);
    out = buf;
    sum = in.param_bytes * root;
    if (in.param_bytes != 4) term(in.param_bytes, split);
    // The gradient shard only from backward to the step (stage3_gradient_path_bytes); under
    // optimizer offload its fp32 host copy stays.
    if (in.offload_optimizer) term(4, split);
    term(4, split);
    term(4.0 * in.optimizer_states, split);
    char total[40];
    std::snprintf(total, sizeof total, " = %.4gΨ", sum);
    return out + total;
  }
  term(in.param_bytes, false);
  if (keeps_full_gradient(stage, in.accumulation, in.overlap_comm)) {
    term(in.grad_accum_bytes, false);
  }
  if (stage >= 1) term(in.grad_accum_bytes, true);  // the reduced gradient shard
  if (in.param_bytes != 4) term(4, split);          // fp32 parameters are their own master
  term(4.0 * in.optimizer_states, split);
  char total[40];
  std::snprintf(total, sizeof total, " = %.4gΨ", sum);
  return out + total;
}

int64_t parse_byte_size(const std::string& text) {
  static const std::regex re(R"(\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([A-Za-z]*)\s*)");
  std::smatch m;
  if (!std::regex_match(text, m, re)) {
    throw std::invalid_argument("not a size: '" + text + "' (try 80GB, 80GiB or 80e9)");
  }
  std::string unit = m[2].str();
  for (char& c : unit) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (!unit.empty() && unit.back() == 'b') unit.pop_back();  // "gb" -> "g", "gib" -> "gi"
  const std::string prefixes = "kmgt";
  double scale = 1;
  if (!unit.empty()) {
    const auto k = prefixes.find(unit[0]);
    const bool binary = unit.size() == 2 && unit[1] == 'i';
    if (k == std::string::npos || (unit.size() > 1 && !binary)) {
      throw std::invalid_argument("unknown size unit in '" + text + "' (B, KB..TB, KiB..TiB)");
    }
    scale = std::pow(binary ? 1024.0 : 1000.0, static_cast<double>(k + 1));
  }
  return static_cast<int64_t>(std::llround(std::stod(m[1].str()) * scale));
}

}  // namespace zero
