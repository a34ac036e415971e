// A comm::Group that hands every call to another group: tests derive from it and override the
// calls they watch or change (a bound device, a record of point-to-point operations).
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "comm/group.hpp"

namespace zero::testing {

class ForwardingGroup : public comm::Group {
 public:
  explicit ForwardingGroup(std::shared_ptr<comm::Group> g) : g_(std::move(g)) {}
  int rank() const override { return g_->rank(); }
  int size() const override { return g_->size(); }
  std::string name() const override { return g_->name(); }
  int global_rank(int r) const override { return g_->global_rank(r); }
  const comm::GroupOptions& options() const override { return g_->options(); }
  Timeouts timeouts() const override { return g_->timeouts(); }
  std::optional<c10::Device> bound_device() const override { return g_->bound_device(); }
  comm::Work all_reduce_sum(at::Tensor& t, const std::string& w) override {
    return g_->all_reduce_sum(t, w);
  }
  comm::Work reduce_scatter_sum(at::Tensor& o, at::Tensor& i, const std::string& w) override {
    return g_->reduce_scatter_sum(o, i, w);
  }
  comm::Work all_gather(at::Tensor& o, at::Tensor& i, const std::string& w) override {
    return g_->all_gather(o, i, w);
  }
  comm::Work all_to_all(at::Tensor& o, at::Tensor& i, const std::string& w) override {
    return g_->all_to_all(o, i, w);
  }
  comm::Work broadcast(at::Tensor& t, int root, const std::string& w) override {
    return g_->broadcast(t, root, w);
  }
  void barrier(const std::string& w) override { g_->barrier(w); }
  void connect(const std::string& w) override { g_->connect(w); }
  bool connected() const override { return g_->connected(); }
  void connect_peer(int peer, bool sender, const std::string& w) override {
    g_->connect_peer(peer, sender, w);
  }
  comm::Work send(at::Tensor& t, int dst, const std::string& w, int tag) override {
    return g_->send(t, dst, w, tag);
  }
  comm::Work recv(at::Tensor& t, int src, const std::string& w, int tag) override {
    return g_->recv(t, src, w, tag);
  }
  std::shared_ptr<comm::Group> split(int color, int key, const std::string& n) override {
    return g_->split(color, key, n);
  }

 protected:
  comm::Group& inner() const { return *g_; }

 private:
  std::shared_ptr<comm::Group> g_;
};

}  // namespace zero::testing
