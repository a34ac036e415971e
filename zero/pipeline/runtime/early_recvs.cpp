#include "zero/pipeline/runtime/early_recvs.hpp"

namespace zero::pipeline {
namespace {

bool is_comm(Op op) {
  return op == Op::SendActivation || op == Op::RecvActivation || op == Op::SendGrad ||
         op == Op::RecvGrad;
}
bool is_recv(Op op) { return op == Op::RecvActivation || op == Op::RecvGrad; }
bool is_compute(Op op) { return op == Op::Forward || op == Op::Backward; }

}  // namespace

std::vector<std::vector<int>> early_receives(const std::vector<Instruction>& list,
                                             const std::function<int(const Instruction&)>& channel,
                                             const std::vector<bool>& fenced) {
  const int n = static_cast<int>(list.size());
  std::vector<std::vector<int>> at(n);
  for (int r = 0; r < n; ++r) {
    if (!is_recv(list[r].op)) continue;
    const int mine = channel(list[r]);
    int e = r, computes = 0;
    for (int k = r - 1; k >= 0; --k) {
      const Op op = list[k].op;
      if (!fenced.empty() && fenced[k]) break;
      if (is_comm(op)) {
        if (channel(list[k]) == mine) break;
      } else if (!is_compute(op) || ++computes > 1) {
        break;
      }
      e = k;
    }
    at[e].push_back(r);
  }
  return at;
}

}  // namespace zero::pipeline
