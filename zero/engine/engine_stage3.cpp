// Stage 3 in the engine (docs/design/sharded-units.md §7 parts 2-7): the unit plan put into the
// layout, one ShardedUnit per layout unit (the root resident, the marked modules gathered on
// use), their binding to zero::run_unit, and their release once backward is done with them.
#include <torch/nn/module.h>

#include <algorithm>
#include <cstdint>
#include <sstream>
#include <unordered_set>

#include "comm/agree.hpp"
#include "zero/engine/engine_impl.hpp"
#include "zero/grads/grad_buckets.hpp"
#include "zero/units/unit_plan.hpp"
#include "zero/units/unit_registry.hpp"

namespace zero {

std::unordered_map<const void*, int> plan_stage3_units(
    torch::nn::Module& model, const ZeroOptimizationConfig::Stage3Config& z3,
    std::vector<std::string>& names) {
  TORCH_CHECK(!z3.param_persistence_threshold_auto,
              "zero: zero_optimization.stage3_param_persistence_threshold is \"auto\", which "
              "needs the model's hidden size: call cfg.zero_optimization.stage3.resolve_auto("
              "hidden) before zero::initialize, or give a number (DeepSpeed's default: 100000)");
  units::PlanInput in;
  std::unordered_map<const void*, int> first;      // TensorImpl -> its first entry in in.params
  std::unordered_map<const void*, size_t> tie_of;  // TensorImpl -> its group in in.ties
  for (const auto& item : model.named_parameters(/*recurse=*/true)) {
    const int idx = static_cast<int>(in.params.size());
    in.params.push_back({item.key(), item.value().numel()});
    const void* impl = item.value().unsafeGetTensorImpl();
    const auto [it, fresh] = first.emplace(impl, idx);
    if (fresh) continue;
    auto t = tie_of.find(impl);
    if (t == tie_of.end()) {
      t = tie_of.emplace(impl, in.ties.size()).first;
      in.ties.push_back({it->second});
    }
    in.ties[t->second].push_back(idx);
  }
  in.marked = units::marked_names(model);
  in.param_persistence_threshold = z3.param_persistence_threshold;
  in.model_persistence_threshold = z3.model_persistence_threshold;
  const units::UnitPlan plan = units::plan_units(in);
  names = plan.names;
  std::unordered_map<const void*, int> unit_of;
  for (const auto& [impl, idx] : first) unit_of[impl] = plan.unit_of[idx];
  return unit_of;
}

namespace {

uint64_t fnv1a(const std::string& s, uint64_t h) {
  for (const unsigned char c : s) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) out.push_back(line);
  return out;
}

}  // namespace

void agree_stage3_units(comm::Group& group, const at::Device& device,
                        const torch::nn::Module& model,
                        const std::unordered_map<const void*, int>& unit_of,
                        const std::vector<std::string>& names, int64_t bucket_numel) {
  if (group.size() == 1) return;
  const size_t n = names.size();
  std::vector<int64_t> count(n, 0), numel(n, 0);
  std::unordered_set<const void*> seen;
  for (const auto& item : model.named_parameters(/*recurse=*/true)) {
    const void* impl = item.value().unsafeGetTensorImpl();
    const auto it = unit_of.find(impl);
    if (!seen.insert(impl).second || it == unit_of.end()) continue;
    ++count.at(it->second);
    numel.at(it->second) += item.value().numel();
  }
  // The marked units in order, then the root: a mark that one rank lacks shows as the unit it
  // names, not as the root that took its parameters.
  std::string text;
  for (size_t i = 1; i <= n; ++i) {
    const size_t u = i % n;
    text += "'" + names[u] + "' (" + std::to_string(count[u]) + " parameters, " +
            std::to_string(numel[u]) + " elements)\n";
  }
  text += "reduce_bucket_size " + std::to_string(bucket_numel) + "\n";
  const auto lines = static_cast<int64_t>(n + 1);
  const auto hash = static_cast<int64_t>(fnv1a(text, 1469598103934665603ull));
  const at::Tensor status =
      at::tensor(std::vector<int64_t>{lines, hash}, at::TensorOptions().dtype(at::kLong))
          .to(device);
  const at::Tensor all =
      comm::gather_status(group, status, "all_gather of the check that ranks built the same units");
  if (all.eq(all[0]).all().item<bool>()) return;
  // They differ: each rank compares its list with rank 0's, and every rank reports every
  // difference. broadcast_text, not comm::Agreement, is safe here: every rank gets here together
  // (the verdict is read from the same gathered rows), nothing zero allocates on the device
  // precedes it in initialize, and each rank allocates the same bytes (rank 0's text, its length
  // broadcast first), so no rank can fail alone between the two broadcasts as a rank's own
  // out-of-memory text could (review 2026-12-07a L7). Agreement::errors would also cut rank 0's
  // list at 4 KiB, about 80 units.
  const std::vector<std::string> mine = lines_of(text);
  const std::vector<std::string> theirs =
      lines_of(comm::broadcast_text(group, text, 0, device, "broadcast of rank 0's stage-3 units"));
  std::string error;
  for (size_t i = 0; i < std::max(mine.size(), theirs.size()); ++i) {
    const std::string a = i < mine.size() ? mine[i] : "no unit";
    const std::string b = i < theirs.size() ? theirs[i] : "no unit";
    if (a == b) continue;
    error = "entry " + std::to_string(i + 1) + " of its units is " + a + ", rank 0's is " + b;
    break;
  }
  const std::string all_errors =
      comm::agree_errors(group, error, device, "all_gather of the stage-3 unit differences");
  TORCH_CHECK(false, "zero: ZeRO stage 3: the ranks built different units (", all_errors,
              "). Every rank must mark the same modules with zero::shard before "
              "zero::initialize, with the same stage3_param_persistence_threshold and "
              "reduce_bucket_size: a mark made under a rank-dependent condition gives each rank "
              "another layout, and the collectives would pair different sizes.");
}

void Engine::Impl::make_stage3_units() {
  const auto& slots = fp.layout.units();
  // The gathers' own communicator (as the pipeline's groups are made: c10d, split from dp, every
  // rank in the same order). On dp alone a bucket that one rank's loss leaves unused is
  // reduce-scattered at once there and only after the unit's gather on a rank that uses it.
  unit_group = group->split(0, group->rank(), group->name() + "/unit-gathers");
  std::vector<ShardedUnit*> raw;
  for (const UnitSlot& s : slots) {
    const bool root = s.unit == units::UnitPlan::kRoot;
    units.push_back(std::make_unique<ShardedUnit>(
        store, *group, s, unit_names.at(s.unit), root ? Residency::kResident : Residency::kOnUse,
        root ? Publish::kAllGather : Publish::kCastShard, param_dtype, sharding.owner,
        unit_group.get()));
    raw.push_back(units.back().get());
    for (int b = s.first_bucket; b < s.end_bucket; ++b)
      unit_index_of_bucket.push_back(static_cast<int>(units.size()) - 1);
  }
  for (const ParamSlot& p : fp.layout.params()) {
    unit_index_of_param.push_back(unit_index_of_bucket.at(p.bucket));
  }
  unit_awaiting.assign(units.size(), -1);
  entered_in_pass.assign(units.size(), 0);
  const auto& z3 = cfg.zero_optimization.stage3;
  TORCH_CHECK(!z3.prefetch_bucket_size_auto,
              "zero: zero_optimization.stage3_prefetch_bucket_size is \"auto\", which needs the "
              "model's hidden size: call cfg.zero_optimization.stage3.resolve_auto(hidden) "
              "before zero::initialize, or give a number (DeepSpeed's default: 50000000; 0 turns "
              "prefetch off)");
  const units::PrefetchLimits limits{.prefetch_bucket_size = z3.prefetch_bucket_size,
                                     .max_live_parameters = z3.max_live_parameters,
                                     .max_reuse_distance = z3.max_reuse_distance};
  unit_runtime = std::make_shared<EngineUnits>(
      std::move(raw), in_backward, limits, [this](int) { on_unit_entered_forward(); },
      [this](int k) { on_unit_entered_backward(k); });
  std::unordered_map<std::string, const torch::nn::Module*> by_name{{"", module.get()}};
  for (const auto& item : module->named_modules(/*name_prefix=*/"", /*include_self=*/false)) {
    by_name.emplace(item.key(), item.value().get());
  }
  for (size_t k = 0; k < slots.size(); ++k) {
    if (slots[k].unit == units::UnitPlan::kRoot) continue;
    units::bind(*by_name.at(unit_names.at(slots[k].unit)), unit_runtime, static_cast<int>(k));
  }
  sync->set_launch_gate([this](int b) { return may_launch(b); });
  // Between steps a unit gathered on use holds only its shard.
  for (auto& u : units) {
    if (u->residency() == Residency::kOnUse) u->release();
  }
}

void Engine::Impl::begin_unit_pass(const std::vector<int>& expected) {
  // A node that reads a weight is an ancestor of that weight's AccumulateGrad, so once every
  // gradient expected of a unit's parameters is in, nothing left in this pass reads them: the
  // unit goes then, on every pass, the first included (review 06e M1: the first pass used to
  // keep every unit to its end, the whole model). Not where some count is a guess (a
  // checkpointed block before the first pass counted): a parameter used there may deliver more,
  // and its unit is released when backward ends. A unit whose recomputation (checkpoint) runs
  // later gathers again.
  const bool guessing =
      std::find(expected.begin(), expected.end(), kUnknownArrivals) != expected.end();
  std::fill(unit_awaiting.begin(), unit_awaiting.end(), guessing ? -1 : 0);
  if (guessing) return;
  for (size_t p = 0; p < unit_index_of_param.size(); ++p) {
    unit_awaiting[unit_index_of_param[p]] += expected.empty() ? 1 : expected[p];
  }
}

void Engine::Impl::on_unit_grad(int p) {
  const int k = unit_index_of_param.at(p);
  int& left = unit_awaiting[k];
  if (left <= 0) return;  // released when backward ends
  ShardedUnit& u = *units[k];
  if (--left == 0 && u.residency() == Residency::kOnUse && u.gathered()) u.release();
}

void Engine::Impl::on_unit_entered_forward() {
  // At stage 3 a rank's next accumulation window starts with a unit's gather in forward, which
  // waits for every peer: announce the window there (run_backward announces it too, once per
  // window), so that a peer waiting in a call this rank skipped (state_dict on rank 0 only)
  // hears within seconds that it went on, instead of waiting out comm_timeout_s.
  if (entries && !in_backward && stats.micro_steps % accumulation == 0) {
    entries->progress(stats.micro_steps / accumulation + 1);
  }
}

bool Engine::Impl::may_launch(int b) const {
  const int k = unit_index_of_bucket.at(b);
  return units[k]->residency() != Residency::kOnUse || entered_in_pass[k] != 0;
}

void Engine::Impl::on_unit_entered_backward(int k) {
  // A bucket of this unit that the loss left unused (complete since backward began) waited for
  // the gather just issued; it and what queues behind it go now.
  if (entered_in_pass.at(k)) return;
  entered_in_pass[k] = 1;
  sync->launch_ready();
}

void Engine::Impl::release_gathered_units() {
  for (auto& u : units) {
    if (u->residency() == Residency::kOnUse && u->gathered()) u->release();
  }
}

std::vector<at::Tensor> Engine::Impl::gathered_params(at::ScalarType dtype) const {
  std::vector<at::Tensor> full(fp.layout.params().size());
  for (const auto& u : units) {
    u->for_each_gathered_master([&](const BucketSlot& bucket, const at::Tensor& values) {
      for (int pi : bucket.params) {
        const ParamSlot& s = fp.layout.params()[pi];
        full[pi] = values.narrow(0, s.flat_offset - bucket.flat_offset, s.numel).to(dtype);
      }
    });
  }
  return full;
}

}  // namespace zero
