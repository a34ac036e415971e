#include "zero/step/optimizer_factory.hpp"

#include <ATen/ATen.h>

#include <algorithm>
#include <cctype>
#include <optional>
#include <regex>

#include "optim/adamw.hpp"
#include "optim/cpu_adamw.hpp"
#include "optim/sgd.hpp"
#include "zero/step/optimizer_offload.hpp"

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

std::vector<int> param_group_of(const Config& cfg, const FlatLayout& layout) {
  const auto& groups = cfg.optimizer.param_groups;
  std::vector<int> of(layout.params().size(), -1);
  std::vector<bool> used(groups.size(), false);
  for (size_t k = 0; k < groups.size(); ++k) {
    const std::regex re(groups[k].params, std::regex::ECMAScript);
    for (size_t i = 0; i < of.size(); ++i) {
      const std::string& name = layout.params()[i].name;
      if (!std::regex_search(name, re)) continue;
      if (of[i] >= 0) {
        throw ConfigError("zero: " + cfg.source + ": parameter '" + name +
                          "' matches both optimizer.param_groups[" + std::to_string(of[i]) +
                          "] ('" + groups[of[i]].params + "') and [" + std::to_string(k) + "] ('" +
                          groups[k].params +
                          "'); a parameter belongs to one group: make the patterns exclusive");
      }
      of[i] = static_cast<int>(k);
      used[k] = true;
    }
  }
  for (size_t k = 0; k < groups.size(); ++k) {
    if (used[k]) continue;
    std::string some;
    for (size_t i = 0; i < of.size() && i < 3; ++i) {
      some += (i ? "', '" : "'") + layout.params()[i].name;
    }
    throw ConfigError("zero: " + cfg.source + ": optimizer.param_groups[" + std::to_string(k) +
                      "].params '" + groups[k].params +
                      "' matches no trainable parameter (names look like " + some +
                      "'); fix the pattern or remove the group");
  }
  return of;
}

int optimizer_state_count(const Config& cfg) {
  const std::string type = lower(cfg.optimizer.type);
  if (type == "adamw" || type == "adam") return 2;
  return type == "sgd" && cfg.optimizer.momentum != 0 ? 1 : 0;
}

OptimizerBundle make_optimizer(const Config& cfg, const FlatLayout& layout, int owner,
                               const at::TensorOptions& opts) {
  const std::vector<int> group_of = param_group_of(cfg, layout);
  const auto& excluded = cfg.no_weight_decay;
  const auto decays = [&](const ParamSlot& p) {
    return std::none_of(excluded.begin(), excluded.end(),
                        [&](const std::string& s) { return p.name.find(s) != std::string::npos; });
  };
  const auto index = [&](const ParamSlot& p) {
    return static_cast<size_t>(&p - layout.params().data());
  };
  // One optimizer group per (config group or none, weight decay or not) that holds elements;
  // a config group with its own weight_decay overrides no_weight_decay for its parameters.
  std::vector<optim::ParamGroup> groups;
  const auto& cfg_groups = cfg.optimizer.param_groups;
  for (int k = -1; k < static_cast<int>(cfg_groups.size()); ++k) {
    const std::optional<double> own_wd = k < 0 ? std::nullopt : cfg_groups[k].weight_decay;
    for (const bool decay : {true, false}) {
      if (own_wd && !decay) continue;
      optim::ParamGroup g;
      g.lr_scale = k < 0 ? 1.0 : cfg_groups[k].lr_scale;
      g.weight_decay = own_wd ? own_wd : (decay ? std::nullopt : std::optional<double>(0.0));
      for (const Range& r : layout.owned_ranges(owner, [&](const ParamSlot& p) {
             return group_of[index(p)] == k && (own_wd || decays(p) == decay);
           })) {
        g.ranges.push_back({r.begin, r.end});
      }
      groups.push_back(std::move(g));
    }
  }
  const int64_t n = layout.shard_numel();
  // The shard's padding belongs to no parameter: it goes with the default no-decay group
  // (groups[1]), as the decay/no-decay split always had it, so the groups tile the shard.
  {
    std::vector<optim::Range> taken;
    for (const auto& g : groups) taken.insert(taken.end(), g.ranges.begin(), g.ranges.end());
    std::sort(taken.begin(), taken.end(), [](auto a, auto b) { return a.begin < b.begin; });
    auto& pad = groups[1].ranges;
    int64_t at = 0;
    for (const auto& r : taken) {
      if (r.begin > at) pad.push_back({at, r.begin});
      at = std::max(at, r.end);
    }
    if (at < n) pad.push_back({at, n});
    std::sort(pad.begin(), pad.end(), [](auto a, auto b) { return a.begin < b.begin; });
  }
  const OptimizerConfig& o = cfg.optimizer;
  // Optimizer offload: the host kernels, which also write the compute-dtype copy.
  const auto& off = cfg.zero_optimization.offload_optimizer;
  const bool offload = off.enabled;
  const optim::HostOptimizerOptions host{host_step_threads(off.threads), off.pin_memory};
  OptimizerBundle b;
  const std::string type = lower(o.type);
  if (type == "adamw" || type == "adam") {
    optim::AdamWOptions a;
    a.beta1 = o.beta1;
    a.beta2 = o.beta2;
    a.eps = o.eps;
    a.weight_decay = o.weight_decay;
    a.op_by_op = o.torch_adam && !offload;
    b.deepspeed_clip = a.op_by_op;
    b.optimizer = offload ? optim::make_grouped_cpu_adamw(a, n, std::move(groups), opts, host)
                          : optim::make_grouped_adamw(a, n, std::move(groups), opts);
  } else if (type == "sgd") {
    optim::SgdOptions s;
    s.momentum = o.momentum;
    s.dampening = o.dampening;
    s.weight_decay = o.weight_decay;
    s.nesterov = o.nesterov;
    b.optimizer = offload ? optim::make_grouped_cpu_sgd(s, n, std::move(groups), opts, host)
                          : optim::make_grouped_sgd(s, n, std::move(groups), opts);
  } else {
    TORCH_CHECK(false, "zero: unknown optimizer.type '", o.type, "'; use AdamW, Adam or SGD");
  }
  b.schedule = make_schedule(cfg);
  return b;
}

}  // namespace zero
