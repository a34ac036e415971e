// The check that every rank all-gathered its units in one order (design sharded-units.md §3.5).
// A unit's gathers are collectives on the units' own communicator: two ranks gathering
// different units of equal size exchange each other's shards without any error, so at the end
// of each backward every rank's GatherOrder hash (and count) is all-gathered over that
// communicator, 16 bytes a rank. When they differ every rank throws the same text, naming for
// each differing rank the first position where its order leaves rank 0's and the units there.
//
// On the CPU the comparison is read at once. On a device it is computed there and read one
// backward later through a HostReadback (the step's verdict is read the same way), so the check
// never makes the host wait for the stream; a mismatch then throws at the end of the next
// backward, on every rank alike. Meanwhile the comparison's device flag (pending_flag) joins the
// step's found_inf, so the optimizer step of the pass that mixed its gathers is skipped on the
// device as an overflow is (review 2026-12-07a L1), and save_checkpoint / state_dict settle a
// pending comparison before they read any state. (If the mixed orders also hold up that next pass,
// a rank waiting for a reduction its peer launches only after a gather in another order, the pass
// ends at comm_timeout_s naming the collective instead, as it did before this check.)
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <functional>
#include <string>
#include <vector>

#include "device/host_readback.hpp"
#include "zero/units/unit_trace.hpp"

namespace zero::comm {
class Group;
}

namespace zero::units {

class OrderCheck {
 public:
  // `name(u)`: unit u's name for messages ("body.block2").
  explicit OrderCheck(std::function<std::string(int)> name) : name_(std::move(name)) {}

  // A collective over `g`: the gathers recorded in `order` since the last check compared across
  // ranks (after the previous device comparison is settled); `order` is cleared either way.
  // Throws on every rank when they differ.
  void check(comm::Group& g, const c10::Device& device, GatherOrder& order);
  // Forgets a device comparison on its way (after a failed backward, whose collectives are
  // out of step anyway) and the recorded order.
  void forget(GatherOrder& order);
  // The device comparison on its way: a one-element long tensor, nonzero where the orders
  // differed; undefined when none is pending (always on the CPU).
  at::Tensor pending_flag() const { return readback_.pending() ? differ_ : at::Tensor(); }
  // Reads a pending device comparison (a collective over `g` when it failed: every rank holds
  // the same pending flag); throws on every rank when the orders differed.
  void settle(comm::Group& g, const c10::Device& device);

 private:
  // `late`: found by a device comparison one backward after the pass it describes.
  [[noreturn]] void fail(comm::Group& g, const c10::Device& device, const std::vector<int>& mine,
                         bool late);

  std::function<std::string(int)> name_;
  HostReadback readback_;
  std::vector<int> pending_;  // the units of the pass whose device comparison is on its way
  at::Tensor differ_;         // that comparison on the device
};

}  // namespace zero::units
