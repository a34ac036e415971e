// The interleaved 1F1B schedule of P = 2 stages and v = 2 chunks, written out by hand, and its
// makespan found from the operations' dependencies alone: a reference for the chunk-timed
// simulation (zero/pipeline/simulate.hpp) and the planner that uses neither
// zero/pipeline/schedule.cpp nor simulate.cpp.
//
// The order is Megatron-LM's (forward_backward_pipelining_with_interleaving): stage s first runs
// (P - s - 1)·2 + (v - 1)·P warm-up forwards (4 on stage 0, 2 on stage 1), then one forward and
// one backward at a time, then the rest of the backwards. Forwards take micro-batches in groups
// of P through chunk 0, then the same group through chunk 1; backwards the same groups through
// chunk 1, then chunk 0. Chunk c of stage s is virtual stage vs = c·P + s: stage 0 holds vs 0
// and 2, stage 1 vs 1 and 3.
#pragma once

#include <algorithm>
#include <map>
#include <stdexcept>
#include <tuple>
#include <vector>

namespace zero::testing {

struct HandOp {
  bool forward;
  int mb;
  int vs;  // virtual stage
};

// Each stage's compute order for m = 2 or 4 micro-batches (F(mb, vs), B(mb, vs)).
inline std::vector<std::vector<HandOp>> interleaved_p2v2_by_hand(int m) {
  auto F = [](int mb, int vs) { return HandOp{true, mb, vs}; };
  auto B = [](int mb, int vs) { return HandOp{false, mb, vs}; };
  if (m == 2) {
    // 4 chunk forwards each way: stage 0's warm-up is all of them; stage 1 warms up with 2.
    return {{F(0, 0), F(1, 0), F(0, 2), F(1, 2), B(0, 2), B(1, 2), B(0, 0), B(1, 0)},
            {F(0, 1), F(1, 1), F(0, 3), B(0, 3), F(1, 3), B(1, 3), B(0, 1), B(1, 1)}};
  }
  if (m == 4) {
    return {{F(0, 0), F(1, 0), F(0, 2), F(1, 2),                                      // warm-up
             F(2, 0), B(0, 2), F(3, 0), B(1, 2), F(2, 2), B(0, 0), F(3, 2), B(1, 0),  // 1F1B
             B(2, 2), B(3, 2), B(2, 0), B(3, 0)},                                     // cool-down
            {F(0, 1), F(1, 1),                                                        // warm-up
             F(0, 3), B(0, 3), F(1, 3), B(1, 3), F(2, 1), B(0, 1), F(3, 1), B(1, 1), F(2, 3),
             B(2, 3), F(3, 3), B(3, 3),  // 1F1B
             B(2, 1), B(3, 1)}};         // cool-down
  }
  throw std::invalid_argument("interleaved_p2v2_by_hand: m is 2 or 4");
}

struct HandTiming {
  double makespan = 0;
  std::vector<double> busy;  // per stage
};

// Each stage runs its list in order; an operation starts when the stage is free and its input
// is there: a forward after the previous virtual stage's forward of its micro-batch, a backward
// after the next virtual stage's backward (the last virtual stage's after its own forward).
// Transfers are free. f[vs], b[vs]: the chunk's times.
inline HandTiming hand_timing(const std::vector<std::vector<HandOp>>& order,
                              const std::vector<double>& f, const std::vector<double>& b) {
  const int last = static_cast<int>(f.size()) - 1;
  std::map<std::tuple<bool, int, int>, double> done;  // (forward, mb, vs) -> its end
  std::vector<size_t> next(order.size(), 0);
  HandTiming out;
  std::vector<double> clock(order.size(), 0);
  out.busy.assign(order.size(), 0);
  for (bool moved = true; moved;) {
    moved = false;
    for (size_t s = 0; s < order.size(); ++s) {
      for (; next[s] < order[s].size(); ++next[s], moved = true) {
        const HandOp& op = order[s][next[s]];
        double ready = 0;
        if (!op.forward || op.vs > 0) {
          const auto need = op.forward      ? std::tuple{true, op.mb, op.vs - 1}
                            : op.vs == last ? std::tuple{true, op.mb, op.vs}
                                            : std::tuple{false, op.mb, op.vs + 1};
          const auto it = done.find(need);
          if (it == done.end()) break;
          ready = it->second;
        }
        const double t = op.forward ? f[op.vs] : b[op.vs];
        clock[s] = std::max(clock[s], ready) + t;
        out.busy[s] += t;
        done[{op.forward, op.mb, op.vs}] = clock[s];
      }
    }
  }
  for (size_t s = 0; s < order.size(); ++s) {
    if (next[s] != order[s].size()) throw std::logic_error("hand_timing: the order deadlocks");
    out.makespan = std::max(out.makespan, clock[s]);
  }
  return out;
}

}  // namespace zero::testing
