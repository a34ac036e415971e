#include "zero/units/unit_plan.hpp"

#include <stdexcept>
#include <string>

namespace zero::units {
namespace {

bool owns(const std::string& module, const std::string& param) {
  return param.size() > module.size() && param.compare(0, module.size(), module) == 0 &&
         param[module.size()] == '.';
}

}  // namespace

UnitPlan plan_units(const PlanInput& in) {
  const size_t n = in.params.size();
  // Tie groups as "leader" per parameter: the group's first member, or itself.
  std::vector<int> leader(n);
  for (size_t i = 0; i < n; ++i) leader[i] = static_cast<int>(i);
  std::vector<bool> grouped(n, false);
  for (const auto& group : in.ties) {
    int first = -1;
    for (int i : group) {
      if (i < 0 || static_cast<size_t>(i) >= n) {
        throw std::invalid_argument("zero: unit plan: tie index " + std::to_string(i) +
                                    " is not a parameter index (there are " + std::to_string(n) +
                                    ")");
      }
      if (grouped[i]) {
        throw std::invalid_argument("zero: unit plan: parameter '" + in.params[i].name +
                                    "' is in two tie groups");
      }
      grouped[i] = true;
      if (first < 0 || i < first) first = i;
    }
    for (int i : group) leader[i] = first;
  }

  // The innermost (longest) marked prefix; index into in.marked, or -1.
  std::vector<int> module_of(n, -1);
  for (size_t i = 0; i < n; ++i) {
    size_t best = 0;
    for (size_t m = 0; m < in.marked.size(); ++m) {
      const std::string& name = in.marked[m];
      if (name.empty() || !owns(name, in.params[i].name)) continue;
      if (module_of[i] < 0 || name.size() > best) {
        module_of[i] = static_cast<int>(m);
        best = name.size();
      }
    }
  }
  // A tied group is one tensor: it stays in a unit only if all its names agree on the module.
  for (size_t i = 0; i < n; ++i) {
    const int l = leader[i];
    if (module_of[i] != module_of[l]) module_of[l] = -2;  // mixed: the root
  }
  for (size_t i = 0; i < n; ++i)
    module_of[i] = module_of[leader[i]] == -2 ? -1 : module_of[leader[i]];

  UnitPlan plan;
  plan.persistent.assign(n, false);
  for (size_t i = 0; i < n; ++i) {
    if (leader[i] != static_cast<int>(i)) continue;  // counted at the group's first member
    const int64_t numel = in.params[i].numel;
    if (numel > in.model_persistence_threshold - plan.persistent_numel) continue;
    if (numel <= in.param_persistence_threshold) {
      plan.persistent[i] = true;
      plan.persistent_numel += numel;
    }
  }
  for (size_t i = 0; i < n; ++i) plan.persistent[i] = plan.persistent[leader[i]];

  // Number the modules that keep a parameter, in marked order.
  std::vector<int> unit_of_module(in.marked.size(), 0);
  std::vector<bool> used(in.marked.size(), false);
  for (size_t i = 0; i < n; ++i) {
    if (module_of[i] >= 0 && !plan.persistent[i]) used[module_of[i]] = true;
  }
  plan.names.emplace_back("<root>");
  for (size_t m = 0; m < in.marked.size(); ++m) {
    if (!used[m]) continue;
    unit_of_module[m] = plan.units();
    plan.names.push_back(in.marked[m]);
  }
  plan.unit_of.assign(n, UnitPlan::kRoot);
  for (size_t i = 0; i < n; ++i) {
    if (module_of[i] >= 0 && !plan.persistent[i]) plan.unit_of[i] = unit_of_module[module_of[i]];
  }
  return plan;
}

}  // namespace zero::units
