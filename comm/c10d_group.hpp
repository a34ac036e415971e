// The real comm::Group: a c10d backend (gloo or NCCL) over a rendezvous store.
//
// The group keeps its store so split() can build subgroups the way c10d's new_group does: the
// ranks exchange (color, key) through the store, and each new group gets a PrefixStore of its
// own (so its backend's rendezvous keys never meet another group's) and a new backend with its
// rank and size in it. Subgroups share the world's liveness heartbeat, which names ranks by
// their world rank; errors in a subgroup name both ranks ("rank 1 of 2 in group dp (global rank
// 3)").
#pragma once

#include <c10/util/intrusive_ptr.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "comm/group.hpp"
#include "comm/p2p_batch.hpp"

namespace zero::comm {

class C10dGroup final : public Group, public P2PBatching {
 public:
  struct Parts {
    c10::intrusive_ptr<c10d::Backend> backend;  // null when size == 1
    c10::intrusive_ptr<c10d::Store> store;      // null for a single-rank group of its own
    int rank = 0;
    int size = 1;
    GroupOptions opts;
    // Gloo: the address peers reach this rank on ("127.0.0.1" when every rank is local; empty:
    // the default device), reused for the backends of subgroups.
    std::string interface_hint;
    std::shared_ptr<Liveness> liveness;  // the world's heartbeat; null in tests over a HashStore
    std::string name = "world";
    std::vector<int> global_ranks;  // the world rank of each rank here; empty: the same
  };
  explicit C10dGroup(Parts parts);
  ~C10dGroup() override;

  int rank() const override { return p_.rank; }
  int size() const override { return p_.size; }
  std::string name() const override { return p_.name; }
  int global_rank(int group_rank) const override;
  const GroupOptions& options() const override { return p_.opts; }
  Timeouts timeouts() const override;
  std::optional<c10::Device> bound_device() const override;

  Work all_reduce_sum(at::Tensor& t, const std::string& what) override;
  Work reduce_scatter_sum(at::Tensor& out, at::Tensor& in, const std::string& what) override;
  Work all_gather(at::Tensor& out, at::Tensor& in, const std::string& what) override;
  // Several all-gathers as one collective (comm/gather_coalescing.hpp): c10d's
  // allgather_into_tensor_coalesced. Gloo: one gather through one flat buffer of the outputs'
  // total size, copied into the outputs on its worker thread (what its all_gather does for a
  // single output too); NCCL: one group of launches into the outputs, no staging.
  Work all_gather_coalesced(std::vector<at::Tensor>& outs, std::vector<at::Tensor>& ins,
                            const std::string& what);
  Work all_to_all(at::Tensor& out, at::Tensor& in, const std::string& what) override;
  Work broadcast(at::Tensor& t, int root, const std::string& what) override;
  void barrier(const std::string& what) override;
  Work send(at::Tensor& t, int dst, const std::string& what, int tag) override;
  Work recv(at::Tensor& t, int src, const std::string& what, int tag) override;
  // P2PBatching. NCCL: c10d's startCoalescing / endCoalescing; gloo (and a staged group): one
  // by one.
  bool coalesces_p2p() const override;
  std::vector<Work> batch_p2p(std::vector<P2POp>& ops) override;
  std::shared_ptr<Group> split(int color, int key, const std::string& name) override;
  // The store this group's ranks share, in a namespace of the group's own: checks that need no
  // backend (comm/entries.hpp).
  const c10::intrusive_ptr<c10d::Store>& store() const { return p_.store; }
  // 0, 1, 2, ... per call on this rank: the same on every rank when each makes the same objects
  // over the group in the same order (a store key namespace for each).
  int next_instance() { return instances_++; }
  // The world heartbeat's word on the peers gone now ("rank 2 is gone (...)"; world ranks), for
  // a wait outside the backend; "" when none is known gone or there is no heartbeat (tests).
  std::string gone_peers() const;
  void connect(const std::string& what) override;
  bool connected() const override { return p_.size == 1 || connected_; }
  void connect_peer(int peer, bool sender, const std::string& what) override;
  void connect_peer_batched(int peer, bool sender, const std::string& what) override;

 private:
  Work wrap(c10::intrusive_ptr<c10d::Work> w, const std::string& what) const;
  void check_device(const at::Tensor& t, const std::string& what) const;
  // Gloo on tensors of a device it cannot read: the operation runs on host copies.
  bool staged() const;
  // reduce_scatter_sum on gloo (comm/c10d_group.cpp says why).
  Work reduce_scatter_by_all_to_all(at::Tensor& out, at::Tensor& in, const std::string& what);
  // "rank 0 of 2", or in a subgroup "rank 1 of 2 in group dp (global rank 3)".
  std::string who() const;
  // "rank 1", or in a subgroup "rank 1 (global rank 5)".
  std::string peer(int r) const;
  void check_peer(int r, const char* role, const std::string& what) const;
  // Every rank's (color, key) for split number `n`, in rank order.
  std::vector<std::pair<int, int>> exchange(int n, int color, int key);
  // The one-element tensor connect() and connect_peer() move: on the bound GPU under NCCL, on
  // the host otherwise (a staged group's backend is gloo).
  at::Tensor probe() const;

  Parts p_;
  // A collective of this group failed: closing it then aborts instead of flushing.
  std::shared_ptr<std::atomic<bool>> failed_ = std::make_shared<std::atomic<bool>>(false);
  int splits_ = 0;  // split() calls so far: each gets store keys of its own
  int instances_ = 0;
  bool connected_ = false;
};

// Before a split that enters ncclCommSplit (blocking, with no timeout of its own: review
// 2026-12-07a L3), every rank of the parent says whether it can take part. Each posts `problem`
// ("" = ready) under key + its rank in `store` and waits for every rank's, at most `timeout`.
// Returns "" when every rank is ready; else, the same on every rank that saw every post, each
// problem as "rank r: <problem>" joined by "; ", and the ranks that posted nothing within the
// timeout as "ranks a, b did not reach it".
std::string agree_through_store(c10d::Store& store, const std::string& key, int rank, int size,
                                const std::string& problem, std::chrono::milliseconds timeout);

}  // namespace zero::comm
