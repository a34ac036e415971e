// Which modules are units and which engine runs them (design sharded-units.md §3.1): a
// process-wide map keyed by module address, because LibTorch modules have no slot for it and
// ranks that run as threads each build their own model (so their entries never collide).
// Mutex-guarded. Entries die with their owner: a mark with its module (entries of destroyed
// modules are dropped when next met), a binding when the engine unbinds or is destroyed.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace torch::nn {
class Module;
}

namespace zero::units {

class UnitRuntime;

// zero::shard's mark.
void mark(const torch::nn::Module& module);
bool marked(const torch::nn::Module& module);
// The marked modules under `root` (root included), by their names in root.named_modules() (the
// root's own name is ""), in that order.
std::vector<std::string> marked_names(const torch::nn::Module& root);

// The live engine's unit for a module (set at initialize, stage 3 only).
struct Binding {
  std::shared_ptr<UnitRuntime> runtime;
  int unit = -1;
};
// Binds `module` to `unit` of `runtime`, replacing an older binding (a new engine over the same
// model). The registry holds the runtime weakly: an engine destroyed without unbind() leaves
// entries that lookups treat as absent.
void bind(const torch::nn::Module& module, const std::shared_ptr<UnitRuntime>& runtime, int unit);
// Removes every binding to `runtime`.
void unbind(const UnitRuntime& runtime);
// The module's binding whose runtime is still alive; nullopt otherwise.
std::optional<Binding> find(const torch::nn::Module& module);

}  // namespace zero::units
