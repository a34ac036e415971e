// optimizer (AdamW, Adam, SGD and their DeepSpeed spellings) and scheduler (the WarmupLR family).
#include <algorithm>
#include <cmath>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "zero/config/config_sections.hpp"

namespace zero::config_detail {

namespace {
const char* const kSchedulerList = "WarmupLR, WarmupDecayLR, WarmupCosineLR";

// optimizer.param_groups: a list of {params: regex, lr_scale, weight_decay}.
std::vector<OptimizerConfig::ParamGroup> load_param_groups(Loader& l, const Entry& s) {
  std::vector<OptimizerConfig::ParamGroup> out;
  if (Loader::is_null(s)) return out;
  if (!s.value.IsSequence()) {
    l.fail(s, "'" + s.path + "' must be a list of groups such as [{params: \"bias$\", " +
                  "lr_scale: 0.1, weight_decay: 0.0}], got " + describe(s.value));
  }
  for (size_t i = 0; i < s.value.size(); ++i) {
    const Entry g{s.path + "[" + std::to_string(i) + "]", s.value[i], s.value[i]};
    OptimizerConfig::ParamGroup pg;
    bool has_params = false;
    l.walk(g, {
                  {"params",
                   [&](const Entry& e) {
                     has_params = true;  // given, even if its value is refused below
                     pg.params = l.string(e);
                     l.require(e, !pg.params.empty(), "a non-empty regular expression");
                     try {
                       std::regex check(pg.params, std::regex::ECMAScript);
                     } catch (const std::regex_error& err) {
                       l.fail(e, "'" + e.path + "' is not a valid regular expression (" +
                                     err.what() + "): '" + pg.params + "'");
                     }
                     has_params = true;
                   }},
                  {"lr_scale",
                   [&](const Entry& e) {
                     pg.lr_scale = l.number(e);
                     l.require(e, std::isfinite(pg.lr_scale) && pg.lr_scale >= 0,
                               "a finite number >= 0");
                   }},
                  {"weight_decay", [&](const Entry& e) { pg.weight_decay = non_negative(l, e); }},
              });
    if (!has_params) {
      l.fail(g, "'" + g.path + "' needs 'params', the regular expression of the parameter " +
                    "names it holds");
    }
    out.push_back(std::move(pg));
  }
  return out;
}

}  // namespace

void load_optimizer(Loader& l, const Entry& s, OptimizerConfig& o) {
  bool adam_w_mode = true, deepspeed_adam = false, torch_adam = false;
  // "auto" keys resolve after the walk, when the optimizer type (and so the default) is known.
  std::vector<const Entry*> autos;
  const auto unless_auto = [&l, &autos](double& out) {
    return [&l, &autos, p = &out](const Entry& e) {
      if (Loader::is_auto(e)) {
        autos.push_back(l.seen(e.path));
      } else {
        *p = non_negative(l, e);
      }
    };
  };
  const std::vector<Field> params = {
      {"lr", unless_auto(o.lr)},
      {"betas",
       [&](const Entry& e) {
         if (Loader::is_auto(e)) {
           autos.push_back(l.seen(e.path));
           return;
         }
         const auto b = l.numbers(e);
         if (b.size() != 2) {
           l.fail(e, "'" + e.path + "' must be a list of two numbers [beta1, beta2]");
         }
         for (double v : b) {
           if (!(v >= 0 && v < 1)) {
             l.fail(e, "'" + e.path + "' values must be in [0, 1), got " + std::to_string(v));
           }
         }
         o.beta1 = b[0], o.beta2 = b[1];
       }},
      {"eps", unless_auto(o.eps)},
      {"weight_decay", unless_auto(o.weight_decay)},
      {"momentum", [&](const Entry& e) { o.momentum = non_negative(l, e); }},
      {"dampening", [&](const Entry& e) { o.dampening = non_negative(l, e); }},
      {"nesterov", [&](const Entry& e) { o.nesterov = l.boolean(e); }},
      {"adam_w_mode", [&](const Entry& e) { adam_w_mode = l.boolean(e); }},
      // DeepSpeed then builds torch.optim.AdamW/Adam instead of FusedAdam: the same update, op by
      // op (OptimizerConfig::torch_adam), and torch.optim.AdamW's default weight_decay is 0.01
      // where FusedAdam's is 0.
      {"torch_adam", [&](const Entry& e) { torch_adam = l.boolean(e); }},
      l.no_effect("foreach", "it only selects torch.optim's multi-tensor kernel"),
      l.no_effect("fp32_optimizer_states", "it only applies to DeepSpeed's CPU Adam"),
      {"max_grad_norm",
       [&](const Entry& e) {
         // DeepSpeed's own answer (engine._configure_basic_optimizer raises the same).
         l.fail_at_key(e, "'" + e.path +
                              "' is not an optimizer parameter in DeepSpeed; use the top-level "
                              "'gradient_clipping' key instead");
       },
       false},
      only_bool(l, "amsgrad", false, "is not supported yet"),
      only_bool(l, "bias_correction", true, "turns off Adam's bias correction"),
      l.unsupported("max_coeff"),
      l.unsupported("min_coeff"),
      l.unsupported("freeze_step"),
      l.unsupported("cuda_aware"),
      l.unsupported("comm_backend_name"),
  };
  const size_t errors_before = l.error_count();
  l.walk(s,
         {
             {"type",
              [&](const Entry& e) {
                const std::string t = lower(l.string(e));
                if (t == "adamw" || t == "adam") {
                  o.type = "AdamW";
                  deepspeed_adam = t == "adam";
                } else if (t == "sgd") {
                  o.type = "SGD";
                } else {
                  l.fail(e, "'" + e.path + "' " + describe(e.value) +
                                " is not supported by zero; use AdamW, Adam or SGD");
                }
              }},
             {"params", [&](const Entry& e) { l.walk(e, params); }},
             {"param_groups", [&](const Entry& e) { o.param_groups = load_param_groups(l, e); }},
             l.no_effect("legacy_fusion",
                         "it only picks DeepSpeed's fused or unfused fp16 optimizer "
                         "implementation, which compute the same update"),
         },
         Loader::Unknown::kIgnore);              // DeepSpeed reads type and params only
  if (l.error_count() != errors_before) return;  // no cross-checks on values that failed
  if (deepspeed_adam && !adam_w_mode) {
    l.fail(*l.seen("optimizer.params.adam_w_mode"),
           "Adam with L2-coupled weight decay (adam_w_mode: false) is not supported; use "
           "adam_w_mode: true (AdamW)");
  }
  const bool sgd = o.type == "SGD";
  for (const char* k : sgd ? std::vector<const char*>{"betas", "eps", "adam_w_mode", "torch_adam",
                                                      "amsgrad", "bias_correction"}
                           : std::vector<const char*>{"momentum", "dampening", "nesterov"}) {
    if (const Entry* e = l.seen(std::string("optimizer.params.") + k)) {
      l.fail_at_key(*e, "'" + e->path + "' does not apply to optimizer type " + o.type);
    }
  }
  const bool adamw = o.type == "AdamW";
  o.torch_adam = adamw && torch_adam;
  if (adamw && torch_adam && !l.seen("optimizer.params.weight_decay")) o.weight_decay = 0.01;
  for (const Entry* e : autos) {
    const std::string key = e->path.substr(e->path.rfind('.') + 1);
    std::string v;
    if (key == "lr") v = "1e-3";
    if (key == "eps") v = "1e-8";
    if (key == "betas") v = "[0.9, 0.999]";
    if (key == "weight_decay") {
      if (adamw && torch_adam) o.weight_decay = 0.01;
      v = adamw && torch_adam ? "0.01" : "0";
    }
    l.note_auto(*e, v,
                std::string("the default of ") +
                    (sgd          ? "torch.optim.SGD"
                     : torch_adam ? "torch.optim.AdamW, which torch_adam selects"
                                  : "DeepSpeed's FusedAdam"));
  }
  if (o.nesterov && (o.momentum <= 0 || o.dampening != 0)) {
    l.fail(*l.seen("optimizer.params.nesterov"),
           "'optimizer.params.nesterov' needs momentum > 0 and dampening 0");
  }
}

void load_scheduler(Loader& l, const Entry& s, SchedulerConfig& sc) {
  std::vector<const Entry*> autos;  // resolved once the type is known
  const auto or_auto = [&](const Entry& e, auto&& set) {
    if (Loader::is_auto(e)) {
      autos.push_back(l.seen(e.path));
    } else {
      set();
    }
  };
  const std::vector<Field> params = {
      {"warmup_min_lr",
       [&](const Entry& e) { or_auto(e, [&] { sc.warmup_min_lr = non_negative(l, e); }); }},
      {"warmup_max_lr",
       [&](const Entry& e) { or_auto(e, [&] { sc.warmup_max_lr = non_negative(l, e); }); }},
      // DeepSpeed raises for a non-positive warmup_num_steps.
      {"warmup_num_steps",
       [&](const Entry& e) { or_auto(e, [&] { sc.warmup_num_steps = count(l, e, 1); }); }},
      {"warmup_type",
       [&](const Entry& e) {
         sc.warmup_type = lower(l.string(e));
         l.require(e, sc.warmup_type == "log" || sc.warmup_type == "linear", "log or linear");
       }},
      {"total_num_steps",
       [&](const Entry& e) {
         if (Loader::is_auto(e)) {
           sc.total_num_steps_auto = true;
         } else {
           sc.total_num_steps = count(l, e, 0);
         }
       }},
      {"warmup_min_ratio",
       [&](const Entry& e) { or_auto(e, [&] { sc.warmup_min_ratio = ratio(l, e); }); }},
      {"cos_min_ratio",
       [&](const Entry& e) { or_auto(e, [&] { sc.cos_min_ratio = ratio(l, e); }); }},
      l.unsupported("last_batch_iteration"),
  };
  const size_t errors_before = l.error_count();
  l.walk(s,
         {
             {"type",
              [&](const Entry& e) {
                const std::string t = lower(l.string(e));
                for (const char* known : {"WarmupLR", "WarmupDecayLR", "WarmupCosineLR"}) {
                  if (t == lower(known)) sc.type = known;
                }
                if (!sc.type.empty()) return;
                const bool deepspeed = t == "onecycle" || t == "lrrangetest";
                const std::string near =
                    config_detail::nearest(t, {"WarmupLR", "WarmupDecayLR", "WarmupCosineLR"});
                l.fail(e, "'" + e.path + "' " + describe(e.value) +
                              (deepspeed ? " is not supported by zero" : " is unknown") +
                              (near.empty() ? "" : "; did you mean '" + near + "'?") +
                              "; supported: " + kSchedulerList);
              }},
             {"params", [&](const Entry& e) { l.walk(e, params); }},
         },
         Loader::Unknown::kIgnore);  // DeepSpeed reads type and params only
  const Entry* type = l.seen("scheduler.type");
  if (!type) l.fail_at_key(s, std::string("'scheduler.type' is required: ") + kSchedulerList);
  if (l.error_count() != errors_before) return;  // no cross-checks on values that failed
  // DeepSpeed passes params to the scheduler's constructor, which rejects foreign ones.
  std::vector<const char*> foreign = {"warmup_min_ratio", "cos_min_ratio"};
  if (sc.type == "WarmupLR") foreign.push_back("total_num_steps");
  if (sc.type == "WarmupCosineLR") foreign = {"warmup_min_lr", "warmup_max_lr"};
  for (const char* k : foreign) {
    if (const Entry* e = l.seen(std::string("scheduler.params.") + k)) {
      l.fail_at_key(*e, "'" + e->path + "' does not apply to scheduler type " + sc.type);
    }
  }
  for (const Entry* e : autos) {
    const std::string key = e->path.substr(e->path.rfind('.') + 1);
    std::string v = key == "warmup_num_steps" ? "1000" : key == "cos_min_ratio" ? "0.0001" : "0";
    if (key == "warmup_max_lr") {
      v = sc.type == "WarmupDecayLR" ? "0.001" : "optimizer.params.lr";
    }
    l.note_auto(*e, v, "the default of DeepSpeed's " + sc.type);
  }
  if (sc.type == "WarmupLR") return;
  if (const Entry* e = l.seen("scheduler.params.total_num_steps")) {
    if (!sc.total_num_steps_auto) {
      l.require(*e, sc.total_num_steps > 0, "a positive integer for " + sc.type);
    }
  } else {
    l.fail(*type, "'scheduler.params.total_num_steps' (> 0) is required for " + sc.type);
  }
  if (!sc.total_num_steps_auto && sc.warmup_num_steps > sc.total_num_steps) {
    l.warn(*type,
           "'scheduler.params.warmup_num_steps' (" + std::to_string(sc.warmup_num_steps) +
               ") exceeds 'scheduler.params.total_num_steps' (" +
               std::to_string(sc.total_num_steps) +
               "): after the warmup the lr falls straight to the schedule's floor (DeepSpeed "
               "warns too)");
  }
}

}  // namespace zero::config_detail

namespace zero {

std::string param_groups_text(const std::vector<OptimizerConfig::ParamGroup>& groups) {
  if (groups.empty()) return "";
  std::ostringstream os;
  os.precision(17);
  os << "[";
  for (size_t i = 0; i < groups.size(); ++i) {
    const auto& g = groups[i];
    os << (i ? ", " : "") << "{params: " << g.params << ", lr_scale: " << g.lr_scale;
    if (g.weight_decay) os << ", weight_decay: " << *g.weight_decay;
    os << "}";
  }
  os << "]";
  return os.str();
}

}  // namespace zero
