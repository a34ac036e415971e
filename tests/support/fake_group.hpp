// A comm::Group with no network: one pretend rank of a pretend group, for unit tests of the
// machinery above the collectives. Every operation is recorded when it is launched and computed
// only when its Work is waited on (so a test sees whether the caller waits before it reads), as
// if every other rank held the same tensor: all_reduce_sum multiplies by size(), a reduce-scatter
// keeps size() x this rank's chunk, an all-gather repeats the input, broadcast keeps it.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "comm/group.hpp"

namespace zero::testing {

class FakeGroup final : public comm::Group {
 public:
  struct Call {
    std::string op;    // "all_reduce", "reduce_scatter", "all_gather", "broadcast", "send", ...
    std::string what;  // as the caller named it
    int64_t numel = 0;
    bool waited = false;  // its Work was waited on (the result is in place)
  };

  FakeGroup(int rank, int size, std::string name = "fake");
  static std::shared_ptr<FakeGroup> make(int rank, int size) {
    return std::make_shared<FakeGroup>(rank, size);
  }

  const std::vector<Call>& calls() const { return *calls_; }
  // The `what` of every call of operation `op`, in launch order.
  std::vector<std::string> launched(const std::string& op) const;
  void clear() { calls_->clear(); }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string name() const override { return name_; }
  int global_rank(int group_rank) const override { return group_rank; }
  const comm::GroupOptions& options() const override { return opts_; }

  comm::Work all_reduce_sum(at::Tensor& t, const std::string& what) override;
  comm::Work reduce_scatter_sum(at::Tensor& out, at::Tensor& in, const std::string& what) override;
  comm::Work all_gather(at::Tensor& out, at::Tensor& in, const std::string& what) override;
  comm::Work all_to_all(at::Tensor& out, at::Tensor& in, const std::string& what) override;
  comm::Work broadcast(at::Tensor& t, int root, const std::string& what) override;
  void barrier(const std::string& what) override;
  comm::Work send(at::Tensor& t, int dst, const std::string& what, int tag) override;
  // Receives zeros.
  comm::Work recv(at::Tensor& t, int src, const std::string& what, int tag) override;
  // A fake of size 1 (this rank alone), whatever the color.
  std::shared_ptr<comm::Group> split(int color, int key, const std::string& name) override;

 private:
  comm::Work record(const std::string& op, const std::string& what, int64_t numel,
                    std::function<void()> compute);

  int rank_, size_;
  std::string name_;
  comm::GroupOptions opts_;
  // Shared with the Works' completion functions, which may outlive a moved-from vector.
  std::shared_ptr<std::vector<Call>> calls_ = std::make_shared<std::vector<Call>>();
};

}  // namespace zero::testing
