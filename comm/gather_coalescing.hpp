// Fewer, larger all-gathers: a comm::Group decorator that, inside a window its owner opens,
// sends consecutive all_gather calls as one coalesced collective (what c10d's coalescing
// manager does for NCCL), and the coalesced collective itself.
//
// Why: stages 1 and 2 publish the updated parameters bucket by bucket, one all-gather per
// gradient bucket (61 for a 24 M-parameter model at reduce_bucket_size 5e5). Each collective is
// a rendezvous of every rank and, on gloo, a hand-off to its worker thread and back; with more
// ranks than cores every rendezvous waits for the scheduler. DeepSpeed gathers its whole
// partition in one all_gather_into_tensor, its flat buffer being rank-major; zero's is
// bucket-major (each bucket holds every rank's shard of it, so that a bucket's reduce-scatter
// needs no copy), so the buckets' gathers go out together through c10d's
// allgather_into_tensor_coalesced, which writes each rank's chunk of each output where it
// belongs: gloo through one flat buffer of the outputs' total size (its single all_gather
// stages its output the same way), NCCL as one group of launches with no staging. The values
// are those of the separate gathers, bit for bit: nothing is computed, only moved.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "comm/group.hpp"

namespace zero::comm {

// outs[i].numel() == ins[i].numel() * g.size(), one dtype; chunk r of outs[i] becomes rank r's
// ins[i]. One collective on a C10dGroup (and through a CountingGroup, counted once); any other
// group gets one all_gather per pair.
Work all_gather_coalesced(Group& g, std::vector<at::Tensor>& outs, std::vector<at::Tensor>& ins,
                          const std::string& what);
// One all_gather per pair on `g`, and a Work that waits for them all.
Work all_gather_pairs(Group& g, std::vector<at::Tensor>& outs, std::vector<at::Tensor>& ins,
                      const std::string& what);

// The decorator. `bound`: the most output elements one coalesced gather carries (the engine
// passes allgather_bucket_size, DeepSpeed's "elements all-gathered at a time", capped so that
// gloo's flat buffers never exceed what the per-bucket gathers held; zero/engine/engine.cpp). A
// call that would take the queued ones past it sends them first, after waiting for the gather
// sent before (one in flight: the updates of the next ones still overlap it); a call larger
// than the bound goes alone, as it came. Outside a window every call goes straight to the
// wrapped group.
class GatherCoalescingGroup final : public Group {
 public:
  GatherCoalescingGroup(std::shared_ptr<Group> inner, int64_t bound);
  ~GatherCoalescingGroup() override;

  // While open, all_gather calls of contiguous tensors of one dtype and device are queued; the
  // Work each returns sends the queue if it has not gone yet and waits for it. Any other
  // collective sends the queue first, so the group's collectives keep the order they were
  // called in (the same on every rank).
  void open();
  // Sends what is queued (its Works still wait for it) and ends the window.
  void close();
  int64_t bound() const { return bound_; }

  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  std::string name() const override { return inner_->name(); }
  int global_rank(int r) const override { return inner_->global_rank(r); }
  const GroupOptions& options() const override { return inner_->options(); }
  Timeouts timeouts() const override { return inner_->timeouts(); }
  std::optional<c10::Device> bound_device() const override { return inner_->bound_device(); }

  Work all_gather(at::Tensor& out, at::Tensor& in, const std::string& what) override;
  Work all_reduce_sum(at::Tensor& t, const std::string& what) override;
  Work reduce_scatter_sum(at::Tensor& out, at::Tensor& in, const std::string& what) override;
  Work all_to_all(at::Tensor& out, at::Tensor& in, const std::string& what) override;
  Work broadcast(at::Tensor& t, int root, const std::string& what) override;
  void barrier(const std::string& what) override;
  void connect(const std::string& what) override { inner_->connect(what); }
  bool connected() const override { return inner_->connected(); }
  void connect_peer(int peer, bool sender, const std::string& what) override {
    inner_->connect_peer(peer, sender, what);
  }
  Work send(at::Tensor& t, int dst, const std::string& what, int tag) override;
  Work recv(at::Tensor& t, int src, const std::string& what, int tag) override;
  std::shared_ptr<Group> split(int color, int key, const std::string& name) override {
    return inner_->split(color, key, name);
  }

  struct Batch;

 private:
  void send_queued();

  std::shared_ptr<Group> inner_;
  int64_t bound_;
  bool open_ = false;
  std::shared_ptr<Batch> queued_;     // calls not sent yet; null when none
  std::shared_ptr<Batch> in_flight_;  // the last batch sent
};

// Opens `g`'s window for a scope (null: nothing); closing sends what is still queued.
class CoalescingWindow {
 public:
  explicit CoalescingWindow(GatherCoalescingGroup* g) : g_(g) {
    if (g_) g_->open();
  }
  ~CoalescingWindow();
  CoalescingWindow(const CoalescingWindow&) = delete;
  CoalescingWindow& operator=(const CoalescingWindow&) = delete;

 private:
  GatherCoalescingGroup* g_;
};

}  // namespace zero::comm
