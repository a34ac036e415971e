#include "zero/optimizer_factory.hpp"

#include <ATen/ATen.h>

#include <algorithm>
#include <cctype>

#include "optim/adamw.hpp"
#include "optim/cpu_adamw.hpp"
#include "optim/sgd.hpp"

namespace zero {
namespace {

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  return s;
}

std::unique_ptr<optim::LrSchedule> make_schedule(const Config& cfg) {
  const SchedulerConfig& s = cfg.scheduler;
  const double base = cfg.optimizer.lr;
  if (s.type.empty()) return optim::make_constant(base);
  TORCH_CHECK(s.type == "WarmupLR" || s.total_num_steps > 0 || !s.total_num_steps_auto,
              "zero: ", cfg.source,
              ": 'scheduler.params.total_num_steps' is \"auto\" and was not "
              "filled in; set it to the run's number of optimizer steps (HF's Trainer fills it "
              "with max_steps; an application sets cfg.scheduler.total_num_steps)");
  optim::WarmupOptions w;
  w.warmup_min_lr = s.warmup_min_lr;
  // DeepSpeed 0.19: WarmupLR(warmup_max_lr=None) takes the optimizer's lr, WarmupDecayLR's
  // constructor default is 0.001.
  w.warmup_max_lr = s.warmup_max_lr.value_or(s.type == "WarmupDecayLR" ? 1e-3 : base);
  w.warmup_num_steps = s.warmup_num_steps;
  w.warmup_type = s.warmup_type;
  if (s.type == "WarmupLR") return optim::make_warmup(w);
  if (s.type == "WarmupDecayLR") return optim::make_warmup_decay(w, s.total_num_steps);
  if (s.type == "WarmupCosineLR") {
    optim::WarmupCosineOptions c;
    c.base_lr = base;
    c.total_num_steps = s.total_num_steps;
    c.warmup_num_steps = s.warmup_num_steps;
    c.warmup_min_ratio = s.warmup_min_ratio;
    c.cos_min_ratio = s.cos_min_ratio;
    c.warmup_type = s.warmup_type;
    return optim::make_warmup_cosine(c);
  }
  TORCH_CHECK(false, "zero: unknown scheduler.type '", s.type,
              "'; use WarmupLR, WarmupDecayLR or WarmupCosineLR");
}

}  // namespace

OptimizerBundle make_optimizer(const Config& cfg, const FlatLayout& layout, int owner,
                               const at::TensorOptions& opts) {
  const auto& excluded = cfg.no_weight_decay;
  std::vector<optim::Range> decay;
  for (const Range& r : layout.owned_ranges(owner, [&](const ParamSlot& p) {
         return std::none_of(excluded.begin(), excluded.end(), [&](const std::string& s) {
           return p.name.find(s) != std::string::npos;
         });
       })) {
    decay.push_back({r.begin, r.end});
  }
  const int64_t n = layout.shard_numel();
  const OptimizerConfig& o = cfg.optimizer;
  // Optimizer offload: the host kernels, which also write the compute-dtype copy.
  const auto& off = cfg.zero_optimization.offload_optimizer;
  const bool offload = off.enabled;
  const optim::HostOptimizerOptions host{off.threads, off.pin_memory};
  OptimizerBundle b;
  const std::string type = lower(o.type);
  if (type == "adamw" || type == "adam") {
    optim::AdamWOptions a;
    a.beta1 = o.beta1;
    a.beta2 = o.beta2;
    a.eps = o.eps;
    a.weight_decay = o.weight_decay;
    b.optimizer = offload ? optim::make_cpu_adamw(a, n, std::move(decay), opts, host)
                          : optim::make_adamw(a, n, std::move(decay), opts);
  } else if (type == "sgd") {
    optim::SgdOptions s;
    s.momentum = o.momentum;
    s.dampening = o.dampening;
    s.weight_decay = o.weight_decay;
    s.nesterov = o.nesterov;
    b.optimizer = offload ? optim::make_cpu_sgd(s, n, std::move(decay), opts, host)
                          : optim::make_sgd(s, n, std::move(decay), opts);
  } else {
    TORCH_CHECK(false, "zero: unknown optimizer.type '", o.type, "'; use AdamW, Adam or SGD");
  }
  b.schedule = make_schedule(cfg);
  return b;
}

}  // namespace zero
