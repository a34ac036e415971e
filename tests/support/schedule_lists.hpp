// What the schedule tests read from a stage's instruction list (zero/pipeline/schedule.hpp):
// a case's name, the micro-batches an op runs in order, and where an instruction stands.
#pragma once

#include <algorithm>
#include <string>
#include <vector>

#include "zero/pipeline/schedule.hpp"

namespace zero::testing {

inline std::string label(pipeline::ScheduleKind kind, int p, int m, int v = 1) {
  return std::string(pipeline::schedule_name(kind)) + " P=" + std::to_string(p) +
         " m=" + std::to_string(m) + " v=" + std::to_string(v);
}

// The micro-batches of `op` on `chunk`, in list order.
inline std::vector<int> micro_batches_of(const std::vector<pipeline::Instruction>& list,
                                         pipeline::Op op, int chunk = 0) {
  std::vector<int> out;
  for (const auto& ins : list)
    if (ins.op == op && ins.chunk == chunk) out.push_back(ins.micro_batch);
  return out;
}

// The index of `ins` in `list`, -1 if absent.
inline int position(const std::vector<pipeline::Instruction>& list, pipeline::Instruction ins) {
  auto it = std::find(list.begin(), list.end(), ins);
  return it == list.end() ? -1 : static_cast<int>(it - list.begin());
}

}  // namespace zero::testing
