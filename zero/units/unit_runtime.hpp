// What `zero::run_unit` and its autograd Function ask of the engine at stage 3 (design
// sharded-units.md §3.2-3.5). The engine implements it; tests implement it with a mock. Units
// are numbered by the runtime; the registry (unit_registry.hpp) maps a module to its unit.
//
// Calls come from the thread running forward and from autograd's backward threads (one per
// device), never two at once for one rank's model: a rank's passes are sequential.
#pragma once

#include <string>

namespace zero::units {

class UnitRuntime {
 public:
  virtual ~UnitRuntime() = default;

  // Issues the unit's all-gathers into a freshly allocated buffer (asynchronous: on a GPU, on
  // the communication stream). Only called when !gathered(unit).
  virtual void gather(int unit) = 0;
  // After gather: the parameters are views of the gathered buffer, usable by what the current
  // stream runs next. Idempotent.
  virtual void wait(int unit) = 0;
  // Frees the buffer (parameters become 0-element tensors). Only called when gathered(unit);
  // a gather still in flight is waited for first (on a GPU, freeing bytes a collective still
  // writes hands them to the next allocation: UnitStorage::release has the stream rules).
  virtual void release(int unit) = 0;
  // Gathered or gathering: a gather was issued and no release followed.
  virtual bool gathered(int unit) const = 0;

  // The trace (§3.5): the unit's forward began (run_unit) / its backward is next (UnitBoundary).
  virtual void entered_forward(int unit) = 0;
  virtual void entered_backward(int unit) = 0;
  // Issues the gathers the trace says come next, within the prefetch limits. Called right after
  // each entered_*; issues nothing when there is no trace to follow.
  virtual void prefetch() = 0;

  // Inside the engine's backward: a unit run now (a checkpoint's recomputation) stays gathered
  // until its gradients are launched, rather than being released when its run ends.
  virtual bool in_backward() const = 0;
  // The unit recurs soon in the trace (stage3_max_reuse_distance): not released after forward.
  virtual bool keep_after_forward(int unit) const = 0;

  // For messages: "blocks.3".
  virtual std::string unit_name(int unit) const = 0;
};

// Gathers `unit` unless it is gathered or gathering already, then waits for it.
inline void ensure_gathered(UnitRuntime& rt, int unit) {
  if (!rt.gathered(unit)) rt.gather(unit);
  rt.wait(unit);
}

}  // namespace zero::units
