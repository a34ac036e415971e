#include "support/fake_group.hpp"

#include <ATen/ATen.h>

namespace zero::testing {

FakeGroup::FakeGroup(int rank, int size, std::string name)
    : rank_(rank), size_(size), name_(std::move(name)) {
  TORCH_CHECK(size >= 1 && rank >= 0 && rank < size, "FakeGroup: rank ", rank, " of ", size);
}

std::vector<std::string> FakeGroup::launched(const std::string& op) const {
  std::vector<std::string> out;
  for (const Call& c : *calls_) {
    if (c.op == op) out.push_back(c.what);
  }
  return out;
}

comm::Work FakeGroup::record(const std::string& op, const std::string& what, int64_t numel,
                             std::function<void()> compute) {
  calls_->push_back({op, what, numel, false});
  const size_t index = calls_->size() - 1;
  auto calls = calls_;
  return comm::Work([calls, index, compute = std::move(compute)] {
    compute();
    if (index < calls->size()) (*calls)[index].waited = true;
  });
}

comm::Work FakeGroup::all_reduce_sum(at::Tensor& t, const std::string& what) {
  at::Tensor target = t;
  const int n = size_;
  return record("all_reduce", what, t.numel(), [target, n]() mutable { target.mul_(n); });
}

comm::Work FakeGroup::reduce_scatter_sum(at::Tensor& out, at::Tensor& in, const std::string& what) {
  TORCH_CHECK(in.numel() == out.numel() * size_, "FakeGroup: reduce_scatter of ", in.numel(),
              " into ", out.numel(), " x ", size_);
  at::Tensor o = out, i = in;
  const int r = rank_, n = size_;
  return record("reduce_scatter", what, in.numel(),
                [o, i, r, n]() mutable { o.copy_(i.narrow(0, r * o.numel(), o.numel()) * n); });
}

comm::Work FakeGroup::all_gather(at::Tensor& out, at::Tensor& in, const std::string& what) {
  TORCH_CHECK(out.numel() == in.numel() * size_, "FakeGroup: all_gather of ", in.numel(), " into ",
              out.numel(), " x ", size_);
  at::Tensor o = out, i = in;
  const int n = size_;
  return record("all_gather", what, out.numel(), [o, i, n]() mutable {
    const at::Tensor src = i.clone();  // the input may sit inside the output
    for (int r = 0; r < n; ++r) o.narrow(0, r * src.numel(), src.numel()).copy_(src);
  });
}

// Every peer holds what this rank holds (as in all_gather): chunk `rank` of each peer's input
// is this rank's own chunk `rank`.
comm::Work FakeGroup::all_to_all(at::Tensor& out, at::Tensor& in, const std::string& what) {
  TORCH_CHECK(out.numel() == in.numel() && in.numel() % size_ == 0, "FakeGroup: all_to_all of ",
              in.numel(), " into ", out.numel(), " over ", size_);
  at::Tensor o = out, i = in;
  const int n = size_, r = rank_;
  return record("all_to_all", what, in.numel(), [o, i, n, r]() mutable {
    const int64_t chunk = i.numel() / n;
    const at::Tensor mine = i.narrow(0, r * chunk, chunk).clone();
    for (int s = 0; s < n; ++s) o.narrow(0, s * chunk, chunk).copy_(mine);
  });
}

comm::Work FakeGroup::broadcast(at::Tensor& t, int /*root*/, const std::string& what) {
  return record("broadcast", what, t.numel(), [] {});
}

void FakeGroup::barrier(const std::string& what) {
  record("barrier", what, 0, [] {}).wait();
}

comm::Work FakeGroup::send(at::Tensor& t, int /*dst*/, const std::string& what, int /*tag*/) {
  return record("send", what, t.numel(), [] {});
}

comm::Work FakeGroup::recv(at::Tensor& t, int /*src*/, const std::string& what, int /*tag*/) {
  at::Tensor target = t;
  return record("recv", what, t.numel(), [target]() mutable { target.zero_(); });
}

std::shared_ptr<comm::Group> FakeGroup::split(int /*color*/, int /*key*/, const std::string& name) {
  return std::make_shared<FakeGroup>(0, 1, name.empty() ? name_ + "/split" : name);
}

}  // namespace zero::testing
