#include "metrics.hpp"

#include <cstdio>
#include <stdexcept>

#include "zero/memory.hpp"

namespace zero::examples {

double flops_per_token(const models::GptConfig& c, int64_t seq_len) {
  // The embedding table is a lookup, not a matmul; a tied table is also the head, which is one.
  const double matmul_params = static_cast<double>(c.num_params() - (c.tied ? 0 : c.vocab * c.dim));
  const double head_dim = static_cast<double>(c.dim / c.heads);
  return 6.0 * matmul_params +
         12.0 * static_cast<double>(c.layers * c.heads) * head_dim * static_cast<double>(seq_len);
}

std::string format_progress(const StepRecord& r) {
  char mfu[32] = "n/a";
  if (r.mfu >= 0) std::snprintf(mfu, sizeof mfu, "%.1f%%", 100 * r.mfu);
  // A skipped step has no norm of its own; the engine's is the last applied step's.
  char norm[32] = "skipped (overflow)";
  if (!r.skipped) std::snprintf(norm, sizeof norm, "%.3f", r.grad_norm);
  char util[32] = "";
  if (r.utilisation >= 0) std::snprintf(util, sizeof util, "  util %.0f%%", 100 * r.utilisation);
  char line[360];
  std::snprintf(line, sizeof line,
                "step %5lld/%lld  loss %.4f  lr %.3e  grad_norm %s  tokens/s %.0f  MFU %s%s  "
                "mem %s  (fwd %.0f%% bwd %.0f%% comm %.0f%% opt %.0f%%)  eta %.0fs",
                static_cast<long long>(r.step), static_cast<long long>(r.total_steps), r.loss, r.lr,
                norm, r.tokens_per_s, mfu, util, format_bytes(r.memory_bytes).c_str(),
                100 * r.forward_s / r.step_s, 100 * r.backward_s / r.step_s,
                100 * r.comm_exposed_s / r.step_s, 100 * r.optimizer_s / r.step_s, r.eta_s);
  return line;
}

MetricsLog::MetricsLog(const std::string& path) {
  if (path.empty()) return;
  out_.open(path);
  if (!out_) throw std::runtime_error("cannot write the metrics file '" + path + "'");
}

void MetricsLog::write(const StepRecord& r) {
  if (!out_.is_open()) return;
  char line[680];
  char norm[32] = "null";  // a skipped step has no norm
  if (!r.skipped) std::snprintf(norm, sizeof norm, "%.6f", r.grad_norm);
  std::snprintf(line, sizeof line,
                "{\"step\": %lld, \"loss\": %.6f, \"lr\": %.6e, \"grad_norm\": %s, "
                "\"skipped\": %s, "
                "\"loss_scale\": %.1f, \"tokens_per_s\": %.1f, \"mfu\": %s, \"step_s\": %.6f, "
                "\"forward_s\": %.6f, \"backward_s\": %.6f, \"comm_exposed_s\": %.6f, "
                "\"optimizer_s\": %.6f, \"data_s\": %.6f, \"memory_bytes\": %lld, "
                "\"utilisation\": %s}\n",
                static_cast<long long>(r.step), r.loss, r.lr, norm, r.skipped ? "true" : "false",
                r.loss_scale, r.tokens_per_s, r.mfu >= 0 ? std::to_string(r.mfu).c_str() : "null",
                r.step_s, r.forward_s, r.backward_s, r.comm_exposed_s, r.optimizer_s, r.data_s,
                static_cast<long long>(r.memory_bytes),
                r.utilisation >= 0 ? std::to_string(r.utilisation).c_str() : "null");
  out_ << line;
  out_.flush();  // a crashed run keeps its metrics up to the last step
}

}  // namespace zero::examples
