// The time model: formulas in include/zero/time_plan.hpp.
#include "zero/time_plan.hpp"

#include <algorithm>
#include <cstdio>
#include <stdexcept>

namespace zero {
namespace {

std::string joined(const std::vector<std::string>& v) {
  std::string out;
  for (const auto& s : v) out += (out.empty() ? "" : ", ") + s;
  return out;
}

struct DevicePreset {
  const char* name;
  double peak_flops;  // dense bf16, data sheet
  double memory_bw;   // HBM, data sheet
  double nvlink_bw;   // NVLink per direction, data sheet
  double host_bw;     // PCIe per direction
};
// Data-sheet figures (SXM parts). Achieved rates below are stated fractions of them.
constexpr DevicePreset kDevices[] = {
    {"a100", 312e12, 2.039e12, 300e9, 32e9},  // A100 80GB: NVLink 3, PCIe 4 x16
    {"h100", 989e12, 3.35e12, 450e9, 64e9},   // H100 SXM: NVLink 4, PCIe 5 x16
    {"h200", 989e12, 4.8e12, 450e9, 64e9},    // H200 SXM: H100's compute, faster HBM
};
struct LinkPreset {
  const char* name;
  double gbit;  // per device (one NIC per GPU, as DGX nodes have)
};
constexpr LinkPreset kLinks[] = {{"ib100", 100}, {"ib200", 200}, {"ib400", 400}};

// What nccl-tests typically reaches: ~80% of NVLink's per-direction rate, ~90% of a NIC's line
// rate; HBM-bound elementwise kernels (the optimizer) ~80% of the data sheet.
constexpr double kNvlinkEff = 0.8, kNicEff = 0.9, kHbmEff = 0.8, kPcieEff = 0.8;
constexpr double kNvlinkLatency = 10e-6, kNicLatency = 25e-6;

}  // namespace

std::vector<std::string> device_preset_names() {
  std::vector<std::string> v;
  for (const auto& d : kDevices) v.push_back(d.name);
  return v;
}

std::vector<std::string> link_preset_names() {
  std::vector<std::string> v{"nvlink"};
  for (const auto& l : kLinks) v.push_back(l.name);
  return v;
}

Hardware hardware_preset(const std::string& device, const std::string& inter_link, int world,
                         int per_node) {
  const DevicePreset* d = nullptr;
  for (const auto& x : kDevices) {
    if (device == x.name) d = &x;
  }
  if (!d) {
    throw std::invalid_argument("unknown device '" + device +
                                "'; known: " + joined(device_preset_names()));
  }
  const LinkPreset* l = nullptr;
  for (const auto& x : kLinks) {
    if (inter_link == x.name) l = &x;
  }
  if (!l && inter_link != "nvlink") {
    throw std::invalid_argument("unknown link '" + inter_link +
                                "'; known: " + joined(link_preset_names()));
  }
  Hardware hw;
  hw.peak_flops = d->peak_flops;
  hw.memory_bw = d->memory_bw * kHbmEff;
  hw.host_bw = d->host_bw * kPcieEff;
  // A ring runs at its slowest hop: NVLink inside a node, the NIC once it spans nodes.
  const bool spans = l && world > std::max(1, per_node);
  const double bus = spans ? l->gbit / 8 * 1e9 * kNicEff : d->nvlink_bw * kNvlinkEff;
  hw.all_reduce_bw = hw.reduce_scatter_bw = hw.all_gather_bw = bus;
  hw.latency_s = spans ? kNicLatency : kNvlinkLatency;
  hw.ranks_per_node = per_node;
  hw.intra_node_bw = d->nvlink_bw * kNvlinkEff;
  hw.intra_node_latency_s = kNvlinkLatency;
  hw.name = std::string(d->name) + (spans ? std::string(" + ") + l->name : " + nvlink");
  return hw;
}

double model_flops_per_token(const PlanInput& in) {
  const ModelShape& m = in.shape;
  if (!m.known()) return 6.0 * static_cast<double>(in.num_params);
  const double table = m.tied ? 0.0 : static_cast<double>(m.vocab * m.hidden);
  const double matmul = static_cast<double>(in.num_params) - table;
  return 6.0 * matmul + 12.0 * static_cast<double>(m.layers * m.hidden * in.seq_len);
}

double recompute_flops_per_token(const PlanInput& in) {
  const ModelShape& m = in.shape;
  if (!m.known()) return 2.0 * static_cast<double>(in.num_params);  // all of it, a bound
  const double block =
      static_cast<double>(m.attention_params() + 3 * m.hidden * m.ffn_dim() + 2 * m.hidden);
  return 2.0 * static_cast<double>(m.layers) * block +
         4.0 * static_cast<double>(m.layers * m.hidden * in.seq_len);
}

namespace {

double ring_s(double factor, double bytes, int world, double bw, double latency) {
  if (world <= 1 || bytes <= 0) return 0;
  if (bw <= 0) throw std::invalid_argument("a collective's bus bandwidth must be positive");
  return factor * (world - 1) / world * bytes / bw + latency;
}

}  // namespace

double all_reduce_s(double bytes, int world, const Hardware& hw) {
  return ring_s(2, bytes, world, hw.all_reduce_bw, hw.latency_s);
}
double reduce_scatter_s(double bytes, int world, const Hardware& hw) {
  return ring_s(1, bytes, world, hw.reduce_scatter_bw, hw.latency_s);
}
double all_gather_s(double bytes, int world, const Hardware& hw) {
  return ring_s(1, bytes, world, hw.all_gather_bw, hw.latency_s);
}

std::vector<int64_t> bucket_sizes(const PlanInput& in) {
  const int64_t bucket = std::max<int64_t>(1, in.bucket_elements);
  const ModelShape& m = in.shape;
  std::vector<int64_t> out;
  if (!m.known() || m.vocab == 0 || m.num_params() != in.num_params) {
    // Unknown parameter order: equal buckets.
    for (int64_t left = in.num_params; left > 0; left -= bucket)
      out.push_back(std::min(left, bucket));
    return out;
  }
  const std::vector<int64_t> sizes = m.parameter_sizes();
  int64_t open = 0;
  for (auto it = sizes.rbegin(); it != sizes.rend(); ++it) {
    // FlatLayout::build's rule: close before a parameter that would overflow the bucket.
    if (open > 0 && open + *it > bucket) out.push_back(open), open = 0;
    open += *it;
    if (open >= bucket) out.push_back(open), open = 0;
  }
  if (open > 0) out.push_back(open);
  return out;
}

double exposed_after_backward(const std::vector<int64_t>& buckets,
                              const std::vector<double>& comm_s, double backward_s) {
  double total = 0;
  for (int64_t b : buckets) total += static_cast<double>(b);
  double produced = 0, free_at = 0;
  for (size_t i = 0; i < buckets.size(); ++i) {
    produced += static_cast<double>(buckets[i]);
    const double ready = total > 0 ? backward_s * produced / total : backward_s;
    free_at = std::max(free_at, ready) + comm_s[i];  // one collective at a time
  }
  return std::max(0.0, free_at - backward_s);
}

double optimizer_bytes(const PlanInput& in, int stage) {
  const double psi = static_cast<double>(in.num_params);
  const int n = std::max(1, in.world_size);
  const double e = stage == 0 ? psi : psi / n;  // elements this rank updates
  const double k = in.optimizer_states;
  double bytes = 4 * e + 4 * e + 8 * e + 8 * k * e;  // norm, gradient, master, states
  // fp32 parameters are the master (stepped in place); 16-bit ones are written from it.
  if (in.param_bytes != 4) bytes += in.param_bytes * e;
  // Zeroing the accumulators: the full one where the stage keeps one (stage 0; stage 1 under
  // accumulation), and the reduced shard at stages 1-2.
  const bool full = keeps_full_gradient(stage, in.accumulation, in.overlap_comm);
  bytes +=
      (full ? in.grad_accum_bytes * psi : 0.0) + (stage > 0 ? in.grad_accum_bytes * psi / n : 0.0);
  return bytes;
}

Stage3Pass stage3_micro_step(const PlanInput& in, double forward_s, double backward_s, int world,
                             const Hardware& hw, double* grad_tail_s) {
  const std::vector<int64_t> units = stage3_gathered_units(in);
  std::vector<double> g, f, b, rs;
  for (int64_t u : units) {
    const double share = in.num_params > 0 ? static_cast<double>(u) / in.num_params : 0.0;
    g.push_back(all_gather_s(static_cast<double>(u) * in.param_bytes, world, hw));
    f.push_back(forward_s * share);
    b.push_back(backward_s * share);
    rs.push_back(reduce_scatter_s(static_cast<double>(u) * in.comm_bytes, world, hw));
  }
  // A tied head runs the embedding's unit again (stage3_pass gathers it where the engine does):
  // the head's matmul is that unit's share of the compute (the table counts as a matmul in
  // model_flops_per_token), the lookup none.
  TiedHead head;
  const bool tied = stage3_tied_head(in) && !units.empty();
  if (tied) {
    head = {f[0], b[0]};
    f[0] = b[0] = 0;
  }
  // Without a tail asked for, the reduce-scatters run after backward (overlap_comm off).
  const Stage3Pass p = stage3_pass(units, g, f, b, in, grad_tail_s ? rs : std::vector<double>{},
                                   tied ? &head : nullptr);
  if (grad_tail_s) {
    // The root unit's gradients (the embedding's last) are reduced after the last unit's.
    const double root =
        reduce_scatter_s(static_cast<double>(stage3_root_params(in)) * in.comm_bytes, world, hw);
    *grad_tail_s = std::max(0.0, p.link_free_s + root - (p.forward_s + p.backward_s));
  }
  return p;
}

TimeEstimate predict_step_time(const PlanInput& in, const StepShape& step, const Hardware& hw) {
  if (hw.peak_flops <= 0 || hw.efficiency <= 0 || hw.memory_bw <= 0) {
    throw std::invalid_argument(
        "the time model needs a positive peak FLOP/s, efficiency and "
        "memory bandwidth");
  }
  TimeEstimate t;
  const int n = std::max(1, in.world_size);
  const int64_t ga = std::max<int64_t>(1, step.grad_accum);
  const double tokens = static_cast<double>(in.micro_batch * in.seq_len * ga);  // per rank
  const double rate = hw.peak_flops * hw.efficiency;
  t.model_flops_per_token = model_flops_per_token(in);
  const bool recompute = step.recompute != Recompute::kNone;
  t.flops_per_token = t.model_flops_per_token + (recompute ? recompute_flops_per_token(in) : 0.0);
  t.forward_s = tokens * t.model_flops_per_token / 3 / rate;
  t.backward_s = tokens * t.model_flops_per_token * 2 / 3 / rate;
  t.recompute_s = recompute ? tokens * recompute_flops_per_token(in) / rate : 0.0;

  // Gradient collectives, bucket by bucket, overlapping the backward of the micro-step(s) that
  // reduce.
  const std::vector<int64_t> buckets = bucket_sizes(in);
  t.buckets = static_cast<int64_t>(buckets.size());
  std::vector<double> comm;
  // zero_quantized_gradients (stages 1, 2): an all-to-all of bits/8 bytes per element plus a
  // scale per block, which sends (N-1)/N of it per rank as a reduce-scatter does; timed at the
  // reduce-scatter's bus bandwidth. Hierarchical (the engine's choice when the group spans
  // nodes of several ranks each): within the node at its bandwidth, then 1/L of it across
  // nodes. The quantize/dequantize passes are not modelled.
  const bool quantized = step.stage > 0 && in.quantized_bits > 0;
  const double per_element =
      quantized ? in.quantized_bits / 8.0 + 4.0 / static_cast<double>(in.quantized_block)
                : static_cast<double>(in.comm_bytes);
  const int per_node = hw.ranks_per_node;
  const bool two_level = quantized && in.quantized_hierarchical && per_node > 1 && n > per_node &&
                         n % per_node == 0 && hw.intra_node_bw > 0;
  Hardware intra = hw;
  intra.reduce_scatter_bw = hw.intra_node_bw;
  intra.latency_s = hw.intra_node_latency_s;
  for (int64_t b : buckets) {
    const double bytes = static_cast<double>(b) * per_element;
    const bool rs = step.stage > 0 && (step.reduce_scatter || quantized);
    if (two_level) {
      comm.push_back(reduce_scatter_s(bytes, per_node, intra) +
                     reduce_scatter_s(bytes / per_node, n / per_node, hw));
    } else {
      comm.push_back(rs ? reduce_scatter_s(bytes, n, hw) : all_reduce_s(bytes, n, hw));
    }
  }
  const int64_t reducing = step.stage >= 2 ? ga : 1;
  const double micro_backward = (t.backward_s + t.recompute_s) / static_cast<double>(ga);
  double per_reduce = 0;
  for (double c : comm) per_reduce += c;
  t.grad_comm_s = per_reduce * static_cast<double>(reducing);
  t.grad_comm_exposed_s =
      (step.overlap_comm ? exposed_after_backward(buckets, comm, micro_backward) : per_reduce) *
      static_cast<double>(reducing);
  if (step.stage > 0) {
    // Stage 3 publishes only the root unit by all-gather; the others are gathered on use.
    const double published =
        static_cast<double>(step.stage == 3 ? stage3_root_params(in) : in.num_params);
    t.param_gather_s = all_gather_s(published * in.param_bytes, n, hw) +
                       all_reduce_s(4, n, hw);  // and the gradient norm's scalar
  }
  if (step.stage == 3) {
    double tail = 0;
    const Stage3Pass pass =
        stage3_micro_step(in, t.forward_s / static_cast<double>(ga), micro_backward, n, hw,
                          step.overlap_comm ? &tail : nullptr);
    t.unit_gathers = pass.gathers;
    t.unit_gather_s = (pass.forward_gather_s + pass.backward_gather_s) * static_cast<double>(ga);
    t.unit_gather_exposed_s = pass.exposed_s * static_cast<double>(ga);
    // The reduce-scatters ran on the link between the backward's gathers (stage3_pass).
    if (step.overlap_comm) t.grad_comm_exposed_s = tail * static_cast<double>(ga);
  }
  t.optimizer_s = optimizer_bytes(in, step.stage) / hw.memory_bw;
  if (step.recompute == Recompute::kCheckpointOffload && in.shape.known()) {
    if (hw.host_bw <= 0) throw std::invalid_argument("offload needs a host bandwidth");
    const double bytes = 2.0 * static_cast<double>(in.shape.layers) * in.param_bytes * tokens *
                         static_cast<double>(in.shape.hidden);
    t.offload_s = bytes / hw.host_bw;
    t.offload_exposed_s = std::max(0.0, t.offload_s - t.compute_s());
  }
  t.step_s = t.compute_s() + t.exposed_comm_s() + t.optimizer_s + t.offload_exposed_s;
  t.tokens_per_s = tokens * n / t.step_s;
  t.mfu = t.tokens_per_s * t.model_flops_per_token / (n * hw.peak_flops);
  return t;
}

std::string describe_time(const TimeEstimate& t) {
  char buf[400];
  std::snprintf(buf, sizeof buf,
                "step %.4g s = compute %.4g (recompute %.3g) + exposed comm %.3g (gradients %.3g "
                "of which %.3g hidden behind backward; parameter all-gather %.3g) + optimizer "
                "%.3g",
                t.step_s, t.compute_s(), t.recompute_s, t.exposed_comm_s(), t.grad_comm_s,
                t.grad_comm_s - t.grad_comm_exposed_s, t.param_gather_s, t.optimizer_s);
  std::string s = buf;
  if (t.unit_gather_s > 0) {
    std::snprintf(buf, sizeof buf, " + unit gathers %.3g (of %.3g, %lld per micro-step)",
                  t.unit_gather_exposed_s, t.unit_gather_s, static_cast<long long>(t.unit_gathers));
    s += buf;
  }
  if (t.offload_s > 0) {
    std::snprintf(buf, sizeof buf, " + offload %.3g (of %.3g)", t.offload_exposed_s, t.offload_s);
    s += buf;
  }
  std::snprintf(buf, sizeof buf, "; %.4g tokens/s, MFU %.1f%%", t.tokens_per_s, 100 * t.mfu);
  return s + buf;
}

}  // namespace zero
