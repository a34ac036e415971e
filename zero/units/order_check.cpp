#include "zero/units/order_check.hpp"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <sstream>

#include "comm/agree.hpp"
#include "comm/group.hpp"

namespace zero::units {
namespace {

std::string ids_text(const std::vector<int>& ids) {
  std::string out;
  for (const int u : ids) out += std::to_string(u) + " ";
  return out;
}

std::vector<int> ids_of(const std::string& text) {
  std::vector<int> out;
  std::istringstream in(text);
  for (int u = 0; in >> u;) out.push_back(u);
  return out;
}

}  // namespace

void OrderCheck::check(comm::Group& g, const c10::Device& device, GatherOrder& order) {
  settle(g, device);
  if (g.size() == 1) {
    order.clear();
    return;
  }
  const at::Tensor host =
      at::tensor(std::vector<int64_t>{static_cast<int64_t>(order.units().size()),
                                      static_cast<int64_t>(order.hash())},
                 at::TensorOptions().dtype(at::kLong));
  // Into the stream from page-locked memory on CUDA: a pageable upload would wait for it.
  at::Tensor mine =
      device.is_cuda() ? host.pin_memory().to(device, /*non_blocking=*/true) : host.to(device);
  at::Tensor all = at::empty({2 * g.size()}, mine.options());
  g.all_gather(all, mine, "all_gather of the units' gather order").wait();
  const at::Tensor rows = all.view({g.size(), 2});
  const at::Tensor differ = rows.ne(rows[0]).any().to(at::kLong).reshape({1});
  std::vector<int> units = order.units();
  order.clear();
  if (device.is_cpu()) {
    if (differ.item<int64_t>() != 0) fail(g, device, units, /*late=*/false);
    return;
  }
  readback_.start(differ);
  differ_ = differ;
  pending_ = std::move(units);
}

void OrderCheck::settle(comm::Group& g, const c10::Device& device) {
  if (!readback_.pending()) return;
  const bool differ = readback_.get().item<int64_t>() != 0;
  const std::vector<int> units = std::move(pending_);
  pending_.clear();
  differ_ = at::Tensor();
  if (differ) fail(g, device, units, /*late=*/true);
}

void OrderCheck::forget(GatherOrder& order) {
  if (readback_.pending()) readback_.get();
  pending_.clear();
  differ_ = at::Tensor();
  order.clear();
}

void OrderCheck::fail(comm::Group& g, const c10::Device& device, const std::vector<int>& mine,
                      bool late) {
  // Each rank against rank 0's list; every rank reports every difference. broadcast_text, not
  // comm::Agreement, is safe here: every rank calls fail() together (`differ` comes from the
  // same gathered rows), only after a backward that succeeded and released its units (a rank
  // whose backward failed drops the comparison in forget() and never gets here), and each rank
  // allocates the same bytes (rank 0's text, its length broadcast first): no rank can fail
  // alone between the two broadcasts as a rank's own out-of-memory text could (review
  // 2026-12-07a L7).
  const std::vector<int> theirs = ids_of(comm::broadcast_text(
      g, ids_text(mine), 0, device, "broadcast of rank 0's unit gather order"));
  const int64_t d = first_difference(mine, theirs);
  std::string error;
  if (d >= 0) {
    const auto n = static_cast<int64_t>(mine.size());
    const auto m = static_cast<int64_t>(theirs.size());
    const std::string at = "gather " + std::to_string(d + 1);
    if (d < n && d < m) {
      error = "its " + at + " was of unit '" + name_(mine[d]) + "' where rank 0's was of '" +
              name_(theirs[d]) + "'";
    } else if (d < n) {
      error = "it issued " + std::to_string(n) + " gathers where rank 0 issued " +
              std::to_string(m) + " (its " + at + " was of unit '" + name_(mine[d]) + "')";
    } else {
      error = "it issued " + std::to_string(n) + " gathers where rank 0 issued " +
              std::to_string(m) + " (rank 0's " + at + " was of unit '" + name_(theirs[d]) + "')";
    }
  }
  const std::string all =
      comm::agree_errors(g, error, device, "all_gather of the unit gather order differences");
  TORCH_CHECK(false, "zero: ZeRO stage 3: the ranks all-gathered their units in different orders (",
              all,
              "). A unit's all-gather is a collective, so gathers of different units paired up "
              "across ranks and mixed their shards; ",
              late ? "on a device the comparison is read one backward later (or by "
                     "save_checkpoint / state_dict): that pass's gradients were never applied "
                     "(an optimizer step taken since was skipped on every rank, as for an "
                     "overflow) and the micro-step that read it was discarded. "
                   : "the micro-step that found it was discarded. ",
              "Every rank must run the same zero::shard-marked modules through zero::run_unit "
              "in the same order in every pass: run every unit on every rank (multiply a branch "
              "that some ranks do not need by zero instead of skipping it), or leave a module "
              "whose use depends on the rank or the data unmarked (its parameters then stay "
              "whole, in the root unit).");
}

}  // namespace zero::units
