#include <cstdio>
#include <sstream>

#include "zero/memory.hpp"

namespace zero {

bool keeps_full_gradient(int stage, int64_t accumulation, bool overlap_comm) {
  return stage == 0 || (stage == 1 && (accumulation > 1 || !overlap_comm));
}

MemoryBreakdown predict_model_states(const MemoryModelInput& in) {
  const double psi = static_cast<double>(in.num_params);
  const double n = in.world_size;
  // Stage 0 keeps whole optimizer partitions; stages 1 and 2 keep 1/N of them.
  const double part = in.stage == 0 ? psi : psi / n;
  MemoryBreakdown b;
  b.params = static_cast<int64_t>(psi * in.param_bytes);
  if (in.stage == 0) {
    b.grads = static_cast<int64_t>(psi * in.grad_accum_bytes);  // reduced in place
  } else {
    // The reduced shard (in the accumulation dtype; fp32 in host memory under optimizer
    // offload), and the full accumulator where stage 1 keeps one.
    const bool full = keeps_full_gradient(in.stage, in.accumulation, in.overlap_comm);
    const double shard_bytes = in.offload ? 4.0 : in.grad_accum_bytes;
    b.grads =
        static_cast<int64_t>((full ? psi * in.grad_accum_bytes : 0.0) + shard_bytes * psi / n);
  }
  // fp32 parameters are the master weights: whole at stage 0, this rank's shard of each bucket
  // of the flat buffer at stages 1 and 2; optimizer offload keeps a separate (host) master.
  b.master = (in.param_bytes == 4 && !in.offload) ? 0 : static_cast<int64_t>(4.0 * part);
  if (in.stage == 3) {
    // The root unit whole; every other parameter a 1/N shard between uses (the gathered unit
    // of the moment is an activation-time cost, not a model state). With the master on the
    // device the gathers send it (fp32) or round it into their output (bf16/fp16, as FSDP2's
    // MixedPrecisionPolicy): no compute shard. Under optimizer offload (the master on the host)
    // the device keeps a compute-dtype shard for the gathers.
    const double root = static_cast<double>(in.root_params);
    b.params =
        static_cast<int64_t>(root * in.param_bytes + (in.offload ? psi / n * in.param_bytes : 0.0));
    b.master = static_cast<int64_t>(4.0 * part);
    // The gradient shard exists only from the window's first reduction to the step (FSDP2's
    // zero_grad(set_to_none=True)); under optimizer offload its fp32 host copy stays.
    b.grads = in.offload ? static_cast<int64_t>(4.0 * psi / n) : 0;
  }
  b.optimizer = static_cast<int64_t>(4.0 * in.optimizer_states * part);
  b.comm_buffers = in.comm_buffer_bytes;
  return b;
}

std::string format_bytes(int64_t bytes) {
  // A difference may be negative: its magnitude in units, with the sign.
  if (bytes < 0) return "-" + format_bytes(bytes == INT64_MIN ? INT64_MAX : -bytes);
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(bytes);
  int u = 0;
  while (v >= 1024.0 && u < 4) {
    v /= 1024.0;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, u == 0 ? "%.0f %s" : "%.2f %s", v, units[u]);
  return buf;
}

std::string to_json(const MemoryBreakdown& b) {
  char buf[256];
  std::snprintf(buf, sizeof buf,
                "{\"params\": %lld, \"grads\": %lld, \"master\": %lld, \"optimizer\": %lld, "
                "\"comm_buffers\": %lld, \"total\": %lld}",
                static_cast<long long>(b.params), static_cast<long long>(b.grads),
                static_cast<long long>(b.master), static_cast<long long>(b.optimizer),
                static_cast<long long>(b.comm_buffers), static_cast<long long>(b.total()));
  return buf;
}

namespace {
std::string format_per_element(int64_t bytes, int64_t elements) {
  char s[32];
  std::snprintf(s, sizeof s, "%.3f B",
                elements > 0 ? static_cast<double>(bytes) / static_cast<double>(elements) : 0.0);
  return s;
}
}  // namespace

std::string format_memory_report(const MemoryReport& r) {
  std::ostringstream os;
  os << "rank " << r.rank << "/" << r.world_size << "  ZeRO stage " << r.stage << "  params "
     << r.num_params << " (padded " << r.padded_params << ")\n";
  char line[200];
  std::snprintf(line, sizeof line, "  %-14s %14s %14s %18s\n", "", "measured", "predicted",
                "stage 0 (plain DP)");
  os << line;
  auto row = [&](const char* name, int64_t m, int64_t p, int64_t b) {
    std::snprintf(line, sizeof line, "  %-14s %14s %14s %18s\n", name, format_bytes(m).c_str(),
                  format_bytes(p).c_str(), format_bytes(b).c_str());
    os << line;
  };
  row("parameters", r.measured.params, r.predicted.params, r.stage0.params);
  row("gradients", r.measured.grads, r.predicted.grads, r.stage0.grads);
  row("fp32 master", r.measured.master, r.predicted.master, r.stage0.master);
  row("optimizer", r.measured.optimizer, r.predicted.optimizer, r.stage0.optimizer);
  row("comm buffers", r.measured.comm_buffers, r.predicted.comm_buffers, r.stage0.comm_buffers);
  if (r.error_feedback > 0) {
    os << "    of which error-feedback residuals: " << format_bytes(r.error_feedback) << " ("
       << format_per_element(r.error_feedback, r.padded_params) << " per gradient element"
       << (r.error_feedback_on_host ? ", in host memory" : "") << ")\n";
  }
  if (r.error_feedback_staging > 0) {
    os << "    of which their staging buffers on the device: "
       << format_bytes(r.error_feedback_staging) << "\n";
  }
  row("total", r.measured.total(), r.predicted.total(), r.stage0.total());
  if (r.host_measured > 0 || r.host_predicted > 0) {
    std::snprintf(line, sizeof line, "  %-14s %14s %14s\n  %-14s %14s %14s\n", "  in host mem",
                  format_bytes(r.host_measured).c_str(), format_bytes(r.host_predicted).c_str(),
                  "  on device", format_bytes(r.measured.total() - r.host_measured).c_str(),
                  format_bytes(r.predicted.total() - r.host_predicted).c_str());
    os << line;
    if (r.host_pinned != r.host_measured) {
      os << "  page-locked, as the caching host allocator rounds it: "
         << format_bytes(r.host_pinned) << "\n";
    }
  }
  if (!r.allocator.empty()) {
    // Negative when the engine's device buffers are smaller than the parameters it replaced
    // (optimizer offload: the states live on the host): initialize then freed device memory.
    const int64_t expected = r.measured.total() - r.replaced_param_bytes;
    os << "  allocator (" << r.allocator << "): initialize "
       << (r.allocator_delta >= 0 ? "added " : "freed ")
       << format_bytes(r.allocator_delta >= 0 ? r.allocator_delta : -r.allocator_delta)
       << (r.allocator_delta >= 0 ? "" : " net (the parameters it replaced held more)")
       << "; the tensors above less the model's replaced parameters: " << format_bytes(expected)
       << "\n";
  }
  const int64_t saved = r.stage0.total() - r.measured.total();
  if (r.stage0.total() > 0) {
    std::snprintf(line, sizeof line, "  %s vs plain data parallel: %s (%.1f%%)\n",
                  saved >= 0 ? "saved" : "extra", format_bytes(saved >= 0 ? saved : -saved).c_str(),
                  100.0 * static_cast<double>(saved >= 0 ? saved : -saved) /
                      static_cast<double>(r.stage0.total()));
    os << line;
  }
  return os.str();
}

std::string format_memory_reports(const std::vector<MemoryReport>& reports) {
  if (reports.empty()) return "";
  std::ostringstream os;
  os << format_memory_report(reports[0]);
  if (reports.size() == 1) return os.str();
  char line[160];
  for (const MemoryReport& r : reports) {
    const double err = r.predicted.total() > 0
                           ? 100.0 * static_cast<double>(r.measured.total() - r.predicted.total()) /
                                 static_cast<double>(r.predicted.total())
                           : 0.0;
    std::snprintf(line, sizeof line, "  rank %-3d total %12s measured, %12s predicted (%+.2f%%)\n",
                  r.rank, format_bytes(r.measured.total()).c_str(),
                  format_bytes(r.predicted.total()).c_str(), err);
    os << line;
  }
  return os.str();
}

}  // namespace zero
