#include "zero/pipeline/tied_grads.hpp"

#include <algorithm>
#include <stdexcept>
#include <string>
#include <vector>

namespace zero::pipeline {

int peer_of(const Instruction& ins, int stage, int stages) {
  switch (ins.op) {
    case Op::SendActivation:
    case Op::RecvGrad:
      return (stage + 1) % stages;
    case Op::SendGrad:
    case Op::RecvActivation:
      return (stage + stages - 1) % stages;
    default:
      return -1;
  }
}

namespace {

bool is_send(Op op) { return op == Op::SendActivation || op == Op::SendGrad; }
bool is_recv(Op op) { return op == Op::RecvActivation || op == Op::RecvGrad; }

int last_backward(const std::vector<Instruction>& list) {
  int at = -1;
  for (size_t i = 0; i < list.size(); ++i)
    if (list[i].op == Op::Backward) at = static_cast<int>(i);
  return at;
}

}  // namespace

int tied_grad_send_after(const Schedule& schedule, int sender, int owner) {
  const int P = schedule.stages;
  if (sender < 0 || sender >= P || owner < 0 || owner >= P || sender == owner)
    throw std::invalid_argument("tied gradient from stage " + std::to_string(sender) +
                                " to stage " + std::to_string(owner) + " of " +
                                std::to_string(P) + ": two different stages of the schedule");
  const auto& mine = schedule.per_stage[sender];
  const auto& theirs = schedule.per_stage[owner];
  const bool chunks = schedule.virtual_stages > 1;
  auto where = [&](int s, const std::vector<Instruction>& list, int i) {
    return "stage " + std::to_string(s) + "'s " + to_string(list[i], chunks) + " (instruction " +
           std::to_string(i) + ")";
  };
  const std::string tie = "the tied weight's gradient from stage " + std::to_string(sender) +
                          " to its owner, stage " + std::to_string(owner);
  const int mine_last = last_backward(mine), theirs_last = last_backward(theirs);
  if (mine_last < 0 || theirs_last < 0)
    throw std::logic_error(tie + ": a stage without a Backward in the schedule");
  // What the owner takes from the sender's link before the gradient.
  int before = 0;
  for (int i = 0; i < theirs_last; ++i)
    if (is_recv(theirs[i].op) && peer_of(theirs[i], owner, P) == sender) ++before;
  // The sender's send that is the owner's last one before, and the one after it.
  int at = mine_last, sent = 0;
  for (int i = 0; i < static_cast<int>(mine.size()); ++i) {
    if (!is_send(mine[i].op) || peer_of(mine[i], sender, P) != owner) continue;
    if (sent++ < before) {
      at = std::max(at, i);
      continue;
    }
    if (i < mine_last)
      throw std::logic_error(
          tie + ": the owner receives it in " + where(owner, theirs, theirs_last) +
          ", after " + std::to_string(before) + " messages from stage " + std::to_string(sender) +
          ", but " + where(sender, mine, i) + " is message " + std::to_string(sent) +
          " and comes before the sender's last Backward, " + where(sender, mine, mine_last) +
          ", after which alone the gradient is complete: the link delivers in order");
    break;
  }
  if (sent < before)
    throw std::logic_error(tie + ": the owner takes " + std::to_string(before) +
                           " messages from stage " + std::to_string(sender) + " before " +
                           where(owner, theirs, theirs_last) + ", but stage " +
                           std::to_string(sender) + " sends it only " + std::to_string(sent));
  for (int i = mine_last + 1; i <= at; ++i)
    if (is_recv(mine[i].op))
      throw std::logic_error(tie + " waits behind " + where(sender, mine, i) +
                             ", a receive after the sender's last Backward: the owner, waiting "
                             "for the gradient, may be what it waits for");
  return at;
}

}  // namespace zero::pipeline
