#include "zero/pipeline/runtime/p2p_queue.hpp"

#include <algorithm>
#include <exception>
#include <stdexcept>
#include <utility>

namespace zero::pipeline {

void P2PQueue::issue(comm::Group& g, bool send, const at::Tensor& t, int peer,
                     const std::string& what, comm::Work* out) {
  if (!failure_.empty())
    throw std::runtime_error(what + ": not posted, an earlier batch failed: " + failure_);
  if (!batched_) {
    at::Tensor handle = t;
    *out = send ? g.send(handle, peer, what) : g.recv(handle, peer, what);
    return;
  }
  queued_.push_back({&g, comm::P2POp{send, t, peer, what, 0}, out});
}

size_t P2PQueue::queued_receives() const {
  return static_cast<size_t>(
      std::count_if(queued_.begin(), queued_.end(), [](const Queued& e) { return !e.op.send; }));
}

void P2PQueue::flush() {
  if (!failure_.empty()) throw std::runtime_error("an earlier batch failed: " + failure_);
  if (queued_.empty()) return;
  std::vector<Queued> q = std::move(queued_);
  queued_.clear();
  std::vector<comm::Group*> groups;  // in the order of their first operation
  for (const auto& e : q)
    if (std::find(groups.begin(), groups.end(), e.group) == groups.end()) groups.push_back(e.group);
  for (size_t k = 0; k < groups.size(); ++k) {
    comm::Group* g = groups[k];
    std::vector<comm::P2POp> ops;
    std::vector<comm::Work*> outs;
    for (auto& e : q) {
      if (e.group != g) continue;
      ops.push_back(e.op);  // a copy: the failure below names what was lost
      outs.push_back(e.out);
    }
    std::vector<comm::Work> works;
    try {
      works = comm::batch_p2p(*g, ops);
    } catch (const std::exception& e) {
      // This batch may have gone out in part, and the later groups' batches are not posted:
      // nothing of them may read as done (a default Work does), and no later operation may
      // pair with what the peers posted for these.
      size_t lost = 0;
      for (size_t j = k; j < groups.size(); ++j)
        for (auto& f : q) {
          if (f.group != groups[j]) continue;
          ++lost;
          const std::string why = f.op.what + ": its batch failed or was not posted";
          *f.out = comm::Work([why] { throw std::runtime_error(why); });
        }
      failure_ =
          "a batch of " + std::to_string(ops.size()) + " point-to-point operation(s) on group " +
          g->name() + " (the first: " + ops.front().what + ") threw: " + e.what() + "; " +
          std::to_string(lost) + " queued operation(s) on " + std::to_string(groups.size() - k) +
          " group(s) were not posted or not all (this batch's and the later groups')";
      throw std::runtime_error(failure_);
    }
    for (size_t i = 0; i < outs.size(); ++i) *outs[i] = std::move(works[i]);
  }
}

}  // namespace zero::pipeline
