#include "comm/counting_group.hpp"

#include <ATen/ATen.h>

#include <utility>

#include "comm/gather_coalescing.hpp"

namespace zero::comm {

CountingGroup::CountingGroup(std::shared_ptr<Group> inner) : inner_(std::move(inner)) {
  TORCH_CHECK(inner_, "zero: CountingGroup needs a group to wrap");
}

void CountingGroup::add(const std::string& op, const std::string& what, int64_t payload,
                        int64_t sent) {
  std::lock_guard<std::mutex> lock(mu_);
  Count& c = counts_[op];
  ++c.calls;
  c.payload += payload;
  c.sent += sent;
  sent_by_what_[what] += sent;
}

Work CountingGroup::all_reduce_sum(at::Tensor& t, const std::string& what) {
  const int64_t n = size(), b = t.nbytes();
  add("all_reduce", what, b, 2 * b * (n - 1) / n);
  return inner_->all_reduce_sum(t, what);
}

Work CountingGroup::reduce_scatter_sum(at::Tensor& out, at::Tensor& in, const std::string& what) {
  const int64_t n = size(), b = in.nbytes();
  add("reduce_scatter", what, b, b * (n - 1) / n);
  return inner_->reduce_scatter_sum(out, in, what);
}

Work CountingGroup::all_gather(at::Tensor& out, at::Tensor& in, const std::string& what) {
  const int64_t n = size(), b = in.nbytes();
  add("all_gather", what, b, b * (n - 1));
  return inner_->all_gather(out, in, what);
}

Work CountingGroup::all_gather_coalesced(std::vector<at::Tensor>& outs,
                                         std::vector<at::Tensor>& ins, const std::string& what) {
  const int64_t n = size();
  int64_t b = 0;
  for (const at::Tensor& t : ins) b += static_cast<int64_t>(t.nbytes());
  add("all_gather", what, b, b * (n - 1));
  return comm::all_gather_coalesced(*inner_, outs, ins, what);
}

Work CountingGroup::all_to_all(at::Tensor& out, at::Tensor& in, const std::string& what) {
  const int64_t n = size(), b = in.nbytes();
  add("all_to_all", what, b, b * (n - 1) / n);
  return inner_->all_to_all(out, in, what);
}

Work CountingGroup::broadcast(at::Tensor& t, int root, const std::string& what) {
  add("broadcast", what, t.nbytes(), rank() == root ? static_cast<int64_t>(t.nbytes()) : 0);
  return inner_->broadcast(t, root, what);
}

Work CountingGroup::send(at::Tensor& t, int dst, const std::string& what, int tag) {
  add("send", what, t.nbytes(), t.nbytes());
  return inner_->send(t, dst, what, tag);
}

Work CountingGroup::recv(at::Tensor& t, int src, const std::string& what, int tag) {
  add("recv", what, 0, 0);
  return inner_->recv(t, src, what, tag);
}

std::map<std::string, CountingGroup::Count> CountingGroup::counts() const {
  std::lock_guard<std::mutex> lock(mu_);
  return counts_;
}

int64_t CountingGroup::sent_bytes(const std::string& filter) const {
  std::lock_guard<std::mutex> lock(mu_);
  int64_t total = 0;
  for (const auto& [what, sent] : sent_by_what_) {
    if (filter.empty() || what.find(filter) != std::string::npos) total += sent;
  }
  return total;
}

void CountingGroup::reset() {
  std::lock_guard<std::mutex> lock(mu_);
  counts_.clear();
  sent_by_what_.clear();
}

std::shared_ptr<Group> CountingGroup::split(int color, int key, const std::string& name) {
  std::shared_ptr<Group> inner = inner_->split(color, key, name);
  if (!inner) return nullptr;
  auto counted = std::make_shared<CountingGroup>(std::move(inner));
  std::lock_guard<std::mutex> lock(mu_);
  subgroups_.push_back(counted);
  return counted;
}

std::vector<std::shared_ptr<CountingGroup>> CountingGroup::subgroups() const {
  std::lock_guard<std::mutex> lock(mu_);
  return subgroups_;
}

}  // namespace zero::comm
