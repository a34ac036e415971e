// A group that claims to coalesce point-to-point operations (comm::P2PBatching, as an NCCL group
// does) over a group that cannot (gloo, a fake): each batch is recorded and its operations posted
// one by one on the wrapped group. Its split claims the same, with the next id. A test can make a
// batch throw after posting part of it, as NCCL's can (review 2026-12-07b L1).
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "comm/p2p_batch.hpp"
#include "support/forwarding_group.hpp"

namespace zero::testing {

struct BatchLog {
  std::mutex mu;
  // Per rank, each batch: the id of its group and its (send?, peer) operations.
  std::map<int, std::vector<std::pair<int, std::vector<std::pair<bool, int>>>>> batches;
};

class CoalescingGroup final : public ForwardingGroup, public comm::P2PBatching {
 public:
  // Before each batch (this group's id, its rank, the batch's index on this group object, its
  // size): how many of its operations to post before throwing, or -1 to post them all.
  using Fault = std::function<int(int id, int rank, int index, size_t ops)>;

  CoalescingGroup(std::shared_ptr<comm::Group> g, int id, std::shared_ptr<BatchLog> log,
                  Fault fault = nullptr)
      : ForwardingGroup(std::move(g)), id_(id), log_(std::move(log)), fault_(std::move(fault)) {}
  bool coalesces_p2p() const override { return true; }
  void connect_peer_batched(int peer, bool sender, const std::string& w) override {
    inner().connect_peer(peer, sender, w);
  }
  std::vector<comm::Work> batch_p2p(std::vector<comm::P2POp>& ops) override {
    const int fail_after = fault_ ? fault_(id_, rank(), index_++, ops.size()) : -1;
    std::vector<std::pair<bool, int>> shown;
    std::vector<comm::Work> works;
    for (auto& op : ops) {
      if (static_cast<int>(works.size()) == fail_after)
        throw std::runtime_error("injected: the batch failed after " + std::to_string(fail_after) +
                                 " of its " + std::to_string(ops.size()) + " operations");
      shown.emplace_back(op.send, op.peer);
      works.push_back(op.send ? inner().send(op.tensor, op.peer, op.what, op.tag)
                              : inner().recv(op.tensor, op.peer, op.what, op.tag));
    }
    if (log_) {
      std::lock_guard<std::mutex> lock(log_->mu);
      log_->batches[rank()].emplace_back(id_, std::move(shown));
    }
    return works;
  }
  std::shared_ptr<comm::Group> split(int color, int key, const std::string& n) override {
    auto sub = ForwardingGroup::split(color, key, n);
    return sub ? std::make_shared<CoalescingGroup>(sub, id_ + 1, log_, fault_) : nullptr;
  }

 private:
  int id_;
  std::shared_ptr<BatchLog> log_;
  Fault fault_;
  int index_ = 0;
};

}  // namespace zero::testing
