// A comm::Group decorator that counts the bytes this rank sends, per kind of collective, and
// forwards every call to the group it wraps. It measures what a reduction path puts on the
// network (bench/compress.sh, tests/test_compressed_reduce.cpp): the uncompressed path
// reduce-scatters fp32 or 16-bit buckets, the compressed one all-to-alls int8/int4 codes and
// their scales.
//
// "Sent" is what leaves this rank under the bandwidth-optimal algorithm of each collective, the
// volume the ZeRO papers and the time model count, for N ranks and an input of B bytes:
//   all_to_all      B (N-1)/N   exact: every chunk but the one a rank keeps for itself
//   reduce_scatter  B (N-1)/N   ring: N-1 steps of one chunk
//   all_reduce      2B (N-1)/N  ring reduce-scatter + all-gather
//   all_gather      B (N-1)     this rank's chunk to each of the others
//   broadcast       B at the root, 0 elsewhere; send: B; recv: 0
// The input bytes handed to each collective (`payload`) are counted too.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "comm/group.hpp"

namespace zero::comm {

class CountingGroup final : public Group {
 public:
  struct Count {
    int64_t calls = 0;
    int64_t payload = 0;  // input bytes handed to the collective
    int64_t sent = 0;     // bytes this rank puts on the network (see the file comment)
  };

  explicit CountingGroup(std::shared_ptr<Group> inner);

  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  std::string name() const override { return inner_->name(); }
  int global_rank(int r) const override { return inner_->global_rank(r); }
  const GroupOptions& options() const override { return inner_->options(); }
  Timeouts timeouts() const override { return inner_->timeouts(); }

  Work all_reduce_sum(at::Tensor& t, const std::string& what) override;
  Work reduce_scatter_sum(at::Tensor& out, at::Tensor& in, const std::string& what) override;
  Work all_gather(at::Tensor& out, at::Tensor& in, const std::string& what) override;
  // comm::all_gather_coalesced on the wrapped group, counted as one "all_gather" call of the
  // pairs' bytes together.
  Work all_gather_coalesced(std::vector<at::Tensor>& outs, std::vector<at::Tensor>& ins,
                            const std::string& what);
  Work all_to_all(at::Tensor& out, at::Tensor& in, const std::string& what) override;
  Work broadcast(at::Tensor& t, int root, const std::string& what) override;
  void barrier(const std::string& what) override { inner_->barrier(what); }
  void connect(const std::string& what) override { inner_->connect(what); }
  bool connected() const override { return inner_->connected(); }
  void connect_peer(int peer, bool sender, const std::string& what) override {
    inner_->connect_peer(peer, sender, what);
  }
  Work send(at::Tensor& t, int dst, const std::string& what, int tag) override;
  Work recv(at::Tensor& t, int src, const std::string& what, int tag) override;
  // A subgroup is counted on its own: split() returns a CountingGroup around the inner group's
  // split, kept in subgroups() (what this group counts stays this group's traffic only).
  std::shared_ptr<Group> split(int color, int key, const std::string& name) override;
  std::vector<std::shared_ptr<CountingGroup>> subgroups() const;

  // Per collective ("all_to_all", "reduce_scatter", ...), since construction or reset().
  std::map<std::string, Count> counts() const;
  // Sum of `sent` over every collective whose `what` contains `filter` (empty: all).
  int64_t sent_bytes(const std::string& filter = "") const;
  void reset();

 private:
  void add(const std::string& op, const std::string& what, int64_t payload, int64_t sent);

  std::shared_ptr<Group> inner_;
  mutable std::mutex mu_;
  std::map<std::string, Count> counts_;
  std::map<std::string, int64_t> sent_by_what_;
  std::vector<std::shared_ptr<CountingGroup>> subgroups_;
};

}  // namespace zero::comm
