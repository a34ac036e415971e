#include "train_summary.hpp"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <stdexcept>
#include <unordered_map>
#include <unordered_set>

#include "json_text.hpp"
#include "zero/device.hpp"
#include "zero/tensor_parallel.hpp"

namespace zero::examples {
namespace {

int64_t status_bytes(const char* key) {
  std::ifstream status("/proc/self/status");
  std::string line;
  const size_t n = std::char_traits<char>::length(key);
  while (std::getline(status, line)) {
    if (line.rfind(key, 0) == 0) return std::stoll(line.substr(n)) * 1024;
  }
  return 0;
}

}  // namespace

ParamStats parameter_stats(const std::vector<at::Tensor>& params, int64_t chunk_numel) {
  std::unordered_set<const void*> seen;
  std::vector<at::Tensor> sums, squares;
  for (const at::Tensor& p : params) {
    if (!p.requires_grad() || p.numel() == 0 || !seen.insert(p.unsafeGetTensorImpl()).second) {
      continue;
    }
    // fp64 sums: an fp32 norm of a million elements is already off by ~3e-5 on the CPU. A
    // chunk at a time, so that the fp64 copy a reduction may make stays small.
    for (const at::Tensor& c : p.detach().reshape({-1}).split(chunk_numel)) {
      sums.push_back(at::sum(c, at::kDouble));
      squares.push_back(at::linalg_vector_norm(c, 2, std::nullopt, false, at::kDouble).square());
    }
  }
  if (sums.empty()) return {};
  // One read of the host for all parameters; added up in order (the same on every run).
  const at::Tensor s = at::stack(sums).cpu();
  const at::Tensor q = at::stack(squares).cpu();
  ParamStats out;
  double sq = 0;
  for (int64_t i = 0; i < s.numel(); ++i) {
    out.checksum += s.data_ptr<double>()[i];
    sq += q.data_ptr<double>()[i];
  }
  out.norm = std::sqrt(sq);
  return out;
}

namespace {

// The whole model's figures from this tensor-parallel rank's values: `split` summed over `tp`,
// `replicated` counted once; `device`: the group's.
ParamStats over_tensor_parallel(const std::vector<at::Tensor>& split,
                                const std::vector<at::Tensor>& replicated,
                                const c10::Device& device, const std::shared_ptr<Group>& tp) {
  const ParamStats mine = parameter_stats(split), once = parameter_stats(replicated);
  at::NoGradGuard no_grad;
  const at::Tensor sums =
      tensor_parallel::reduce_from_region(
          at::tensor({mine.checksum, mine.norm * mine.norm}, at::kDouble).to(device), tp)
          .cpu();
  ParamStats out;
  out.checksum = sums[0].item<double>() + once.checksum;
  out.norm = std::sqrt(sums[1].item<double>() + once.norm * once.norm);
  return out;
}

}  // namespace

ParamStats gathered_model_stats(const Engine& engine, const torch::nn::Module& model,
                                const std::shared_ptr<Group>& tp) {
  std::unordered_set<std::string> trainable;
  for (const auto& item : model.named_parameters()) {
    if (item.value().requires_grad()) trainable.insert(item.key());
  }
  StateDictOptions opts;
  opts.master = false;  // the compute-dtype values, what the other stages' summaries read
  opts.cpu = false;
  std::unordered_map<std::string, at::Tensor> values;
  std::vector<at::Tensor> all;
  for (auto& [name, t] : engine.state_dict(opts)) {
    if (!trainable.count(name)) continue;
    values[name] = t.detach().requires_grad_(true);
    all.push_back(values[name]);
  }
  if (!tp || tp->size() == 1) return parameter_stats(all);
  // Stage 3 under tensor parallelism: this tp rank's shards, gathered over dp by state_dict.
  std::vector<at::Tensor> split, replicated;
  for (const auto& p : tensor_parallel::placements(model, /*sequence_parallel=*/false)) {
    const auto it = values.find(p.name);
    if (it != values.end()) (p.placement.sharded ? split : replicated).push_back(it->second);
  }
  const c10::Device device = all.empty() ? c10::Device(c10::kCPU) : all.front().device();
  return over_tensor_parallel(split, replicated, device, tp);
}

ParamStats whole_model_stats(const torch::nn::Module& model, const std::shared_ptr<Group>& tp) {
  if (!tp || tp->size() == 1) return parameter_stats(model.parameters());
  std::vector<at::Tensor> split, replicated;
  for (const auto& p : tensor_parallel::placements(model, /*sequence_parallel=*/false))
    (p.placement.sharded ? split : replicated).push_back(p.param);
  // The group's device (an NCCL group refuses host tensors): any parameter's, the split ones'
  // first, since a rank may hold none of them.
  const std::vector<at::Tensor> all = model.parameters();
  const c10::Device device = !split.empty() ? split.front().device()
                             : !all.empty() ? all.front().device()
                                            : c10::Device(c10::kCPU);
  return over_tensor_parallel(split, replicated, device, tp);
}

int64_t peak_rss_bytes() { return status_bytes("VmHWM:"); }
int64_t rss_bytes() { return status_bytes("VmRSS:"); }

namespace {

// Every rank's value: over the whole world when the trainer set it (under tensor or pipeline
// parallelism the engine's group is one data-parallel group), else the engine's group.
std::vector<int64_t> over_ranks(const TrainSummary& s, const Engine& engine, int64_t v) {
  return s.world ? gather_over(s.world, v, s.device) : engine.all_gather_values(v);
}

}  // namespace

void TrainSummary::record_startup(const Engine& engine, int64_t peak, int64_t after) {
  // Max over ranks, like every memory figure of the summary.
  const auto peaks = over_ranks(*this, engine, peak), afters = over_ranks(*this, engine, after);
  startup_peak_rss_bytes = *std::max_element(peaks.begin(), peaks.end());
  rss_after_initialize_bytes = *std::max_element(afters.begin(), afters.end());
}

void TrainSummary::add(const StepRecord& r) {
  if (records.empty()) first_loss = r.loss;
  final_loss = r.loss;
  records.push_back(r);
}

void TrainSummary::record_phases(const Engine& engine, const PhasePeaks& phases,
                                 const std::array<int64_t, kPhases>& predicted,
                                 int64_t bucket_bytes, int64_t activations) {
  auto max_over_ranks = [&](int64_t v) {
    const auto all = over_ranks(*this, engine, v);
    return *std::max_element(all.begin(), all.end());
  };
  for (int i = 0; i < kPhases; ++i) {
    phase_measured[i] = max_over_ranks(phases.measured(static_cast<Phase>(i)));
  }
  phase_predicted = predicted;
  phase_overall_ = phases.overall();
  // Every rank ran the same steps, so each gathers the same number of values.
  step_peaks.clear();
  for (int64_t p : phases.step_peaks()) step_peaks.push_back(max_over_ranks(p));
  steady_states = max_over_ranks(phases.after_step());
  // The split of the rank whose last step peaked highest (every rank takes part: collectives).
  last_step_split.clear();
  if (phases.available() && device.is_cpu() && !phases.step_peaks().empty()) {
    const auto peaks = over_ranks(*this, engine, phases.step_peaks().back());
    const auto top = std::max_element(peaks.begin(), peaks.end()) - peaks.begin();
    for (int t = 0; t < kHostTags; ++t) {
      last_step_split.push_back(over_ranks(*this, engine, phases.last_step_split()[t])[top]);
    }
  }
  phase_bound = steady_states >= 0 ? steady_states + 2 * bucket_bytes + activations : -1;
}

void TrainSummary::finish(const Engine& engine, torch::nn::Module& model,
                          const zero::ActivationOffloader* offloader,
                          const models::CheckpointPolicy& policy,
                          const std::string& data_description, double loader_wait_s, RunShape run) {
  // Every rank's peak, not rank 0's alone: ranks differ (rank 0 serves the store, shards and
  // buckets are uneven), and what must fit is the largest.
  peak_rss_per_rank = over_ranks(*this, engine, examples::peak_rss_bytes());
  peak_rss_bytes = *std::max_element(peak_rss_per_rank.begin(), peak_rss_per_rank.end());
  offload_peak_host_bytes = offloader ? offloader->stats().peak_host_bytes : 0;
  const auto params = model.parameters();
  if (!params.empty()) {
    const DeviceMemory m = device_memory(params.front().device());
    // The allocator's peak restarts with each phase (phase_peaks.hpp): the run's is theirs.
    device_peak_per_rank =
        over_ranks(*this, engine, m.available ? std::max(m.peak_allocated, phase_overall_) : 0);
    device_peak_allocated_bytes =
        *std::max_element(device_peak_per_rank.begin(), device_peak_per_rank.end());
  }
  // Only now, so that the peaks above are training's: the checksum allocates (one parameter's
  // worth at most).
  // At stage 3 the marked blocks' parameters are released between steps: their values come
  // gathered from the shards (a whole-model copy, the one place the example makes it).
  const ParamStats stats = engine.stage() == 3
                               ? gathered_model_stats(engine, model, tensor_parallel)
                               : whole_model_stats(model, tensor_parallel);
  param_checksum = stats.checksum;
  param_norm = stats.norm;
  checkpointing = policy.enabled;
  cpu_offload = policy.cpu_offload;
  data = data_description;
  data_wait_s = loader_wait_s;
  // On a GPU the caching allocator's peak; on CPU activations show up in the process's RSS.
  run.memory_used = device_peak_allocated_bytes > 0 ? device_peak_allocated_bytes : peak_rss_bytes;
  verdict = diagnose(mean_times(), run);
}

StepTimes TrainSummary::mean_times() const {
  StepTimes t;
  const size_t first = records.size() > 1 ? 1 : 0;
  for (size_t i = first; i < records.size(); ++i) {
    const StepRecord& r = records[i];
    t.step_s += r.step_s, t.data_s += r.data_s, t.forward_s += r.forward_s;
    t.backward_s += r.backward_s, t.comm_exposed_s += r.comm_exposed_s;
    t.optimizer_s += r.optimizer_s;
  }
  const double n = static_cast<double>(std::max<size_t>(1, records.size() - first));
  double util = 0;
  int64_t util_n = 0;
  for (size_t i = first; i < records.size(); ++i) {
    if (records[i].utilisation >= 0) util += records[i].utilisation, ++util_n;
  }
  if (util_n > 0) t.utilisation = util / static_cast<double>(util_n);
  for (double* f :
       {&t.step_s, &t.data_s, &t.forward_s, &t.backward_s, &t.comm_exposed_s, &t.optimizer_s}) {
    *f /= n;
  }
  return t;
}

double TrainSummary::median_step_s() const {
  std::vector<double> t;
  for (size_t i = records.size() > 1 ? 1 : 0; i < records.size(); ++i) {
    t.push_back(records[i].step_s);
  }
  if (t.empty()) return NAN;
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

MemoryFigures TrainSummary::memory_figures() const {
  MemoryFigures m;
  m.peak_rss_bytes = peak_rss_bytes;
  m.peak_rss_per_rank = peak_rss_per_rank;
  m.device_peak_per_rank = device_peak_per_rank;
  m.device_peak_allocated_bytes = device_peak_allocated_bytes;
  m.startup_peak_rss_bytes = startup_peak_rss_bytes;
  m.rss_after_initialize_bytes = rss_after_initialize_bytes;
  m.phase_measured = phase_measured;
  m.phase_predicted = phase_predicted;
  m.step_peaks = step_peaks;
  m.steady_states = steady_states;
  m.phase_bound = phase_bound;
  m.last_step_split = last_step_split;
  return m;
}

std::string TrainSummary::phase_json() const { return memory_figures().phase_json(); }

void TrainSummary::write_json(const std::string& path, const Engine& engine,
                              const std::string& preset, const models::GptConfig& mc,
                              int64_t seq_len, const std::vector<MemoryReport>& reports) const {
  std::ofstream out(path);
  if (!out) throw std::runtime_error("cannot write the --summary-json file '" + path + "'");
  const Config& c = engine.config();
  auto mean = [&](double StepRecord::*field) {
    double s = 0;
    for (size_t i = records.size() > 1 ? 1 : 0; i < records.size(); ++i) s += records[i].*field;
    return s / std::max<size_t>(1, records.size() - (records.size() > 1 ? 1 : 0));
  };
  auto b = [](bool v) { return v ? "true" : "false"; };
  out.precision(17);
  out << "{\n  \"world_size\": " << engine.world_size() << ",\n  \"stage\": " << engine.stage()
      << ",\n  \"steps\": " << records.size() << ",\n  \"model\": " << quoted(preset)
      << ",\n  \"num_params\": " << mc.num_params() << ",\n  \"data\": " << quoted(data)
      << ",\n  \"first_loss\": " << Num{first_loss} << ",\n  \"final_loss\": " << Num{final_loss}
      << ",\n  \"param_checksum\": " << Num{param_checksum}
      << ",\n  \"param_norm\": " << Num{param_norm}
      << ",\n  \"step_seconds_median\": " << Num{median_step_s()}
      << ",\n  \"forward_s_mean\": " << Num{mean(&StepRecord::forward_s)}
      << ",\n  \"backward_s_mean\": " << Num{mean(&StepRecord::backward_s)}
      << ",\n  \"comm_exposed_s_mean\": " << Num{mean(&StepRecord::comm_exposed_s)}
      << ",\n  \"optimizer_s_mean\": " << Num{mean(&StepRecord::optimizer_s)}
      << ",\n  \"data_s_mean\": " << Num{mean(&StepRecord::data_s)}
      << ",\n  \"tokens_per_s_mean\": " << Num{mean(&StepRecord::tokens_per_s)}
      << ",\n  \"mfu_mean\": " << Num{mean(&StepRecord::mfu)}
      << ",\n  \"data_wait_s\": " << Num{data_wait_s}
      << ",\n  \"comm_wait_seconds\": " << Num{engine.stats().comm_wait_seconds}
      << ",\n  \"skipped_steps\": " << engine.settled_stats().skipped_steps
      << ",\n  \"allocator_retries\": " << engine.stats().allocator_retries
      << ",\n  \"bf16\": " << b(c.bf16) << ",\n  \"activation_checkpointing\": " << b(checkpointing)
      << ",\n  \"cpu_offload\": " << b(cpu_offload)
      << ",\n  \"optimizer_offload\": " << b(c.zero_optimization.offload_optimizer.enabled)
      << ",\n  \"offload_peak_host_bytes\": " << offload_peak_host_bytes
      << ",\n  \"allgather_wait_s_mean\": " << Num{mean(&StepRecord::allgather_wait_s)}
      << memory_figures().json_fields() << ",\n  \"seq_len\": " << seq_len
      << ",\n  \"train_batch_size\": " << c.train_batch_size;
  const Verdict& v = verdict;
  out << ",\n  \"bottleneck\": {\"verdict\": " << quoted(bottleneck_name(v.kind))
      << ", \"data\": " << Num{v.data} << ", \"exposed_comm\": " << Num{v.comm}
      << ", \"optimizer\": " << Num{v.optimizer} << ", \"compute\": " << Num{v.compute}
      << ", \"other\": " << Num{v.other} << ", \"utilisation\": ";
  if (v.utilisation >= 0) {
    out << Num{v.utilisation};
  } else {
    out << "null";
  }
  out << ", \"memory_headroom\": ";
  if (v.memory_headroom >= 0) {
    out << Num{v.memory_headroom};
  } else {
    out << "null";
  }
  out << ",\n    \"reason\": " << quoted(v.reason) << ", \"knob\": " << quoted(v.knob) << "}";
  out << ",\n  \"memory\": [";
  for (size_t r = 0; r < reports.size(); ++r) {
    out << (r ? ",\n" : "\n") << "    {\"rank\": " << r
        << ", \"measured\": " << to_json(reports[r].measured) << ", \"predicted\": "
        << to_json(reports[r].predicted)
        // Optimizer offload: what lives in host memory (master, states, gradient shard, the
        // transfer buffers); 0 without it. Also counted in measured/predicted above.
        << ", \"host_measured\": " << reports[r].host_measured
        << ", \"host_pinned\": " << reports[r].host_pinned
        << ", \"host_predicted\": " << reports[r].host_predicted << "}";
  }
  out << "\n  ]\n}\n";
}

}  // namespace zero::examples
