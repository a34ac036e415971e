#include "comm/c10d_group.hpp"

#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <algorithm>
#include <exception>
#include <map>
#include <numeric>
#include <stdexcept>
#include <string>

#include "comm/backend.hpp"
#include "comm/gather_coalescing.hpp"
#include "comm/liveness.hpp"
#include "comm/staging.hpp"
#include "comm/startup.hpp"
#include "zero/errors.hpp"

namespace zero::comm {
namespace {

std::vector<uint8_t> bytes(const std::string& s) { return {s.begin(), s.end()}; }

thread_local bool t_staging = false;

// The host copy a staged operation runs on; `t` itself when it is on the host already.
at::Tensor on_host(const at::Tensor& t) {
  if (t.is_cpu()) return t;
  t_staging = true;
  at::Tensor host;
  try {
    host = t.cpu();
  } catch (...) {
    t_staging = false;
    throw;
  }
  t_staging = false;
  return host;
}

std::string join(const std::vector<int>& v) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s;
}

}  // namespace

bool staging_copy() { return t_staging; }

C10dGroup::C10dGroup(Parts parts) : p_(std::move(parts)) {
  TORCH_CHECK(p_.size >= 1 && p_.rank >= 0 && p_.rank < p_.size, "zero: rank ", p_.rank,
              " is not in a group of size ", p_.size);
  TORCH_CHECK(p_.global_ranks.empty() || static_cast<int>(p_.global_ranks.size()) == p_.size,
              "zero: a group of size ", p_.size, " got ", p_.global_ranks.size(), " world ranks");
  TORCH_CHECK(p_.size == 1 || p_.backend, "zero: a group of ", p_.size, " ranks needs a backend");
}

C10dGroup::~C10dGroup() {
  // An NCCL group is shut down (or, after a failure or while an exception unwinds, aborted)
  // here, not left to c10d's destructor. Gloo needs nothing: dropping it closes its sockets,
  // which is how its peers learn at once that this rank is gone.
  if (p_.backend && p_.opts.device == c10::DeviceType::CUDA) {
    nccl_close(*p_.backend, *failed_ || std::uncaught_exceptions() > 0);
  }
}

Group::Timeouts C10dGroup::timeouts() const {
  if (!p_.backend) return {};
  return {p_.backend->getBackendOptions()->timeout, gloo_store_timeout(*p_.backend)};
}

std::optional<c10::Device> C10dGroup::bound_device() const {
  if (!p_.backend) return std::nullopt;
  return p_.backend->getBoundDeviceId();
}

int C10dGroup::global_rank(int group_rank) const {
  TORCH_CHECK(group_rank >= 0 && group_rank < p_.size, "zero: rank ", group_rank,
              " is not in group ", p_.name, " of size ", p_.size);
  return p_.global_ranks.empty() ? group_rank : p_.global_ranks[group_rank];
}

std::string C10dGroup::who() const {
  std::string s = "rank " + std::to_string(p_.rank) + " of " + std::to_string(p_.size);
  if (!p_.global_ranks.empty()) {
    s += " in group " + p_.name + " (global rank " + std::to_string(global_rank(p_.rank)) + ")";
  }
  return s;
}

std::string C10dGroup::peer(int r) const {
  std::string s = "rank " + std::to_string(r);
  if (!p_.global_ranks.empty()) s += " (global rank " + std::to_string(global_rank(r)) + ")";
  return s;
}

void C10dGroup::check_device(const at::Tensor& t, const std::string& what) const {
  TORCH_CHECK(t.device().type() == p_.opts.device, "zero: ", what, " got a tensor on ", t.device(),
              " but this process group moves ", c10::DeviceTypeName(p_.opts.device), " tensors");
  TORCH_CHECK(t.is_contiguous(), "zero: ", what, " needs contiguous tensors");
}

void C10dGroup::check_peer(int r, const char* role, const std::string& what) const {
  TORCH_CHECK(r >= 0 && r < p_.size && r != p_.rank, "zero: ", who(), ": ", what, ": ", role,
              " rank ", r, " must be another rank of this group, in [0, ", p_.size, ")");
}

bool C10dGroup::staged() const {
  return p_.opts.device != c10::DeviceType::CPU && p_.opts.device != c10::DeviceType::CUDA;
}

Work C10dGroup::wrap(c10::intrusive_ptr<c10d::Work> w, const std::string& what) const {
  return Work(std::move(w), what, who(), p_.opts.timeout, p_.opts.device, p_.liveness, failed_);
}

Work C10dGroup::all_reduce_sum(at::Tensor& t, const std::string& what) {
  if (p_.size == 1) return {};
  check_device(t, what);
  std::vector<at::Tensor> ts{t};
  c10d::AllreduceOptions o;
  o.reduceOp = c10d::ReduceOp::SUM;
  o.timeout = p_.opts.timeout;
  if (staged()) {
    std::vector<at::Tensor> host{on_host(t)};
    return wrap(p_.backend->allreduce(host, o), what).then([t, h = host[0]]() mutable {
      t.copy_(h);
    });
  }
  return wrap(p_.backend->allreduce(ts, o), what);
}

Work C10dGroup::reduce_scatter_sum(at::Tensor& out, at::Tensor& in, const std::string& what) {
  TORCH_CHECK(in.numel() == out.numel() * p_.size, "zero: ", what, ": input has ", in.numel(),
              " elements, expected ", out.numel(), " x ", p_.size);
  if (p_.size == 1) {
    out.copy_(in);
    return {};
  }
  check_device(in, what);
  check_device(out, what);
  if (p_.opts.device != c10::DeviceType::CUDA) return reduce_scatter_by_all_to_all(out, in, what);
  c10d::ReduceScatterOptions o;
  o.reduceOp = c10d::ReduceOp::SUM;
  o.timeout = p_.opts.timeout;
  return wrap(p_.backend->_reduce_scatter_base(out, in, o), what);
}

// gloo: each rank receives its chunk from every rank (one all-to-all) and adds them itself, in
// rank order. gloo's own reduce-scatter moves and adds more: 6 M fp32 elements on 4 ranks took
// 0.12 s and 0.042 CPU-s per rank against 0.068 s and 0.024 CPU-s this way
// (bench/results/gloo_reduce_scatter_cpu.md). Two ranks get the same bits as before (x0 + x1
// either way); more ranks add in rank order, deterministic on every run.
Work C10dGroup::reduce_scatter_by_all_to_all(at::Tensor& out, at::Tensor& in,
                                             const std::string& what) {
  c10d::AllToAllOptions o;
  o.timeout = p_.opts.timeout;
  std::vector<int64_t> none;
  const bool staged_group = staged();
  at::Tensor host_in = staged_group ? on_host(in).reshape({-1}) : in.view({-1});
  at::Tensor received = at::empty_like(host_in);
  // Into `out` itself; a staged group's result lands on the host first.
  at::Tensor dst = staged_group ? at::empty({out.numel()}, received.options()) : out.view({-1});
  const int n = p_.size;
  return wrap(p_.backend->alltoall_base(received, host_in, none, none, o), what)
      .then([out, received, dst, host_in, n, staged_group]() mutable {
        const at::Tensor parts = received.view({n, -1});
        at::add_out(dst, parts[0], parts[1]);
        for (int r = 2; r < n; ++r) dst.add_(parts[r]);
        if (staged_group) out.view({-1}).copy_(dst);
      });
}

Work C10dGroup::all_gather(at::Tensor& out, at::Tensor& in, const std::string& what) {
  TORCH_CHECK(out.numel() == in.numel() * p_.size, "zero: ", what, ": output has ", out.numel(),
              " elements, expected ", in.numel(), " x ", p_.size);
  if (p_.size == 1) {
    out.copy_(in);
    return {};
  }
  check_device(in, what);
  check_device(out, what);
  c10d::AllgatherOptions o;
  o.timeout = p_.opts.timeout;
  if (staged()) {
    at::Tensor host_in = on_host(in),
               host_out = at::empty_like(out, out.options().device(at::kCPU));
    return wrap(p_.backend->_allgather_base(host_out, host_in, o), what)
        .then([out, host_out, host_in]() mutable { out.copy_(host_out); });
  }
  return wrap(p_.backend->_allgather_base(out, in, o), what);
}

Work C10dGroup::all_gather_coalesced(std::vector<at::Tensor>& outs, std::vector<at::Tensor>& ins,
                                     const std::string& what) {
  TORCH_CHECK(outs.size() == ins.size() && !outs.empty(), "zero: ", what, ": ", outs.size(),
              " outputs for ", ins.size(), " inputs");
  for (size_t i = 0; i < outs.size(); ++i) {
    TORCH_CHECK(outs[i].numel() == ins[i].numel() * p_.size, "zero: ", what, ": output ", i,
                " has ", outs[i].numel(), " elements, expected ", ins[i].numel(), " x ", p_.size);
    TORCH_CHECK(outs[i].scalar_type() == outs[0].scalar_type() &&
                    ins[i].scalar_type() == outs[0].scalar_type(),
                "zero: ", what, ": the coalesced tensors differ in dtype");
  }
  // One rank, or a device gloo cannot read (each pair staged through the host): pair by pair.
  if (p_.size == 1 || staged() || outs.size() == 1) {
    return all_gather_pairs(*this, outs, ins, what);
  }
  for (size_t i = 0; i < outs.size(); ++i) {
    check_device(ins[i], what);
    check_device(outs[i], what);
  }
  c10d::AllgatherOptions o;
  o.timeout = p_.opts.timeout;
  return wrap(p_.backend->allgather_into_tensor_coalesced(outs, ins, o), what);
}

Work C10dGroup::all_to_all(at::Tensor& out, at::Tensor& in, const std::string& what) {
  TORCH_CHECK(out.numel() == in.numel() && in.numel() % p_.size == 0, "zero: ", what,
              ": all_to_all needs input and output of one size, a multiple of ", p_.size,
              " ranks; got ", in.numel(), " and ", out.numel(), " elements");
  if (p_.size == 1) {
    out.copy_(in);
    return {};
  }
  check_device(in, what);
  check_device(out, what);
  c10d::AllToAllOptions o;
  o.timeout = p_.opts.timeout;
  // Empty split sizes: equal chunks along the first dimension, so both go flat.
  if (staged()) {
    at::Tensor host_in = on_host(in).reshape({-1}),
               host_out = at::empty({out.numel()}, out.options().device(at::kCPU));
    std::vector<int64_t> none;
    return wrap(p_.backend->alltoall_base(host_out, host_in, none, none, o), what)
        .then([out, host_out, host_in]() mutable { out.view({-1}).copy_(host_out); });
  }
  TORCH_CHECK(in.is_contiguous() && out.is_contiguous(), "zero: ", what,
              ": all_to_all needs contiguous tensors");
  at::Tensor flat_in = in.view({-1}), flat_out = out.view({-1});
  std::vector<int64_t> none;
  return wrap(p_.backend->alltoall_base(flat_out, flat_in, none, none, o), what);
}

Work C10dGroup::broadcast(at::Tensor& t, int root, const std::string& what) {
  if (p_.size == 1) return {};
  check_device(t, what);
  std::vector<at::Tensor> ts{t};
  c10d::BroadcastOptions o;
  o.rootRank = root;
  o.timeout = p_.opts.timeout;
  if (staged()) {
    std::vector<at::Tensor> host{on_host(t)};
    return wrap(p_.backend->broadcast(host, o), what).then([t, h = host[0]]() mutable {
      t.copy_(h);
    });
  }
  return wrap(p_.backend->broadcast(ts, o), what);
}

void C10dGroup::barrier(const std::string& what) {
  if (p_.size == 1) return;
  c10d::BarrierOptions o;
  o.timeout = p_.opts.timeout;
  wrap(p_.backend->barrier(o), what).wait();
}

// c10d's send/recv take no timeout: the bound is the wait (gloo: comm_timeout_s on the host;
// NCCL: the watchdog), as for the collectives.
Work C10dGroup::send(at::Tensor& t, int dst, const std::string& what, int tag) {
  check_peer(dst, "destination", what);
  check_device(t, what);
  // Staged: the host copy stays alive in the Work until the send finished.
  std::vector<at::Tensor> ts{staged() ? on_host(t) : t};
  Work w = wrap(p_.backend->send(ts, dst, tag), what + " (send to " + peer(dst) + ")");
  if (staged()) w.then([h = ts[0]] {});
  return w;
}

Work C10dGroup::recv(at::Tensor& t, int src, const std::string& what, int tag) {
  check_peer(src, "source", what);
  check_device(t, what);
  std::vector<at::Tensor> ts{staged() ? at::empty_like(t, t.options().device(at::kCPU)) : t};
  Work w = wrap(p_.backend->recv(ts, src, tag), what + " (recv from " + peer(src) + ")");
  if (staged()) w.then([t, h = ts[0]]() mutable { t.copy_(h); });
  return w;
}

bool C10dGroup::coalesces_p2p() const {
  return p_.backend && p_.opts.device == c10::DeviceType::CUDA && p_.backend->supportsCoalescing();
}

std::vector<Work> C10dGroup::batch_p2p(std::vector<P2POp>& ops) {
  if (!coalesces_p2p() || ops.empty()) {
    std::vector<Work> works;
    for (auto& op : ops)
      works.push_back(op.send ? send(op.tensor, op.peer, op.what, op.tag)
                              : recv(op.tensor, op.peer, op.what, op.tag));
    return works;
  }
  for (const auto& op : ops) {
    check_peer(op.peer, op.send ? "destination" : "source", op.what);
    check_device(op.tensor, op.what);
  }
  // One ncclGroupStart ... ncclGroupEnd, as batch_isend_irecv: NCCL progresses the batch's
  // sends and receives together, so none waits for another's peer. Inside the group c10d's
  // per-op Works are placeholders; the batch's one Work comes from endCoalescing.
  auto close_open_group = [this] {
    try {
      p_.backend->endCoalescing();
    } catch (...) {
    }
  };
  p_.backend->startCoalescing();
  size_t posted = 0;
  try {
    for (auto& op : ops) {
      std::vector<at::Tensor> ts{op.tensor};
      if (op.send) {
        p_.backend->send(ts, op.peer, op.tag);
      } else {
        p_.backend->recv(ts, op.peer, op.tag);
      }
      ++posted;
    }
  } catch (const std::exception& e) {
    // NCCL's group state is per thread: close it whatever failed, so this thread's next
    // operation is not swallowed by a group left open. Closing it launches the operations
    // posted so far: the peers get part of the batch (review 2026-12-07b L1). Said here, so
    // the caller knows the group's point-to-point traffic no longer pairs up between ranks.
    close_open_group();
    throw std::runtime_error("zero: " + who() + ": " + ops[posted].what + ": posting it in a " +
                             "coalesced batch of " + std::to_string(ops.size()) + " failed after " +
                             std::to_string(posted) + " of the batch's operations went out: " +
                             e.what() + "; the peers' operations no longer pair with this rank's");
  } catch (...) {
    close_open_group();
    throw;
  }
  const c10::intrusive_ptr<c10d::Work> batch = p_.backend->endCoalescing();
  const std::string of = " (in a coalesced batch of " + std::to_string(ops.size()) + ")";
  std::vector<Work> works;
  works.reserve(ops.size());
  for (const auto& op : ops)
    works.push_back(wrap(
        batch, op.what + (op.send ? " (send to " : " (recv from ") + peer(op.peer) + ")" + of));
  return works;
}

at::Tensor C10dGroup::probe() const {
  if (p_.opts.device != c10::DeviceType::CUDA) return at::ones({1});
  const auto device = p_.backend->getBoundDeviceId();
  TORCH_CHECK(device, "zero: ", who(), ": an NCCL group without a bound device");
  return at::ones({1}, at::TensorOptions().device(*device));
}

void C10dGroup::connect(const std::string& what) {
  if (p_.size == 1) return;
  if (p_.opts.device == c10::DeviceType::CUDA) {
    // This thread's current GPU must be the group's (from_env builds on a helper thread).
    nccl_use_bound_device(*p_.backend);
    // Not eagerConnectSingleDevice: it puts the group in torch's eager-init mode, where every
    // send/recv runs on the group's one communicator and stream, so a middle pipeline stage's
    // receive from the stage before and send to the stage after would serialise. The all-reduce
    // below creates the group's communicator now, on the bound GPU; connect_peer creates each
    // pair's (review cuda_review_2026-12-06b, M1).
  }
  at::Tensor t = probe();
  std::vector<at::Tensor> ts{t};
  c10d::AllreduceOptions o;
  o.reduceOp = c10d::ReduceOp::SUM;
  o.timeout = p_.opts.timeout;
  wrap(p_.backend->allreduce(ts, o), "connecting group " + p_.name + " (" + what + ")").wait();
  // On the host the sum is there to check; on a GPU reading it would sync the host for nothing.
  if (p_.opts.device != c10::DeviceType::CUDA) {
    TORCH_CHECK(t.item<float>() == static_cast<float>(p_.size), "zero: ", who(),
                ": connecting group ", p_.name, " summed ", t.item<float>(), " over ", p_.size,
                " ranks");
  }
  connected_ = true;
}

void C10dGroup::connect_peer(int r, bool sender, const std::string& what) {
  check_peer(r, sender ? "destination" : "source", what);
  std::vector<at::Tensor> ts{probe()};
  if (sender) {
    wrap(p_.backend->send(ts, r, 0), what + " (connecting, send to " + peer(r) + ")").wait();
  } else {
    wrap(p_.backend->recv(ts, r, 0), what + " (connecting, recv from " + peer(r) + ")").wait();
  }
}

void C10dGroup::connect_peer_batched(int r, bool sender, const std::string& what) {
  if (!coalesces_p2p()) return connect_peer(r, sender, what);
  std::vector<P2POp> ops{{sender, probe(), r, what + " (connecting, batched)", 0}};
  batch_p2p(ops).front().wait();
}

std::vector<std::pair<int, int>> C10dGroup::exchange(int n, int color, int key) {
  const std::string base = "split/" + std::to_string(n) + "/";
  std::vector<std::string> keys;
  for (int r = 0; r < p_.size; ++r) keys.push_back(base + std::to_string(r));
  std::vector<std::vector<uint8_t>> values;
  try {
    p_.store->set(keys[p_.rank], bytes(std::to_string(color) + " " + std::to_string(key)));
    p_.store->wait(keys, p_.opts.timeout);
    values = p_.store->multiGet(keys);
  } catch (const std::exception& e) {
    std::vector<int> missing;
    try {
      for (int r = 0; r < p_.size; ++r) {
        if (!p_.store->check({keys[r]})) missing.push_back(r);
      }
    } catch (const std::exception&) {
      // The store itself is gone: the first message says so.
    }
    throw CommError(
        who() + ": split " + std::to_string(n) + " of group " + p_.name + " failed (" +
        c10d_message(e) + ")" +
        (missing.empty() ? std::string() : ": ranks " + join(missing) + " never called it") +
        "; every rank of the group must call split, in the same order, within "
        "comm_timeout_s = " +
        format_seconds(p_.opts.timeout));
  }
  std::vector<std::pair<int, int>> out;
  for (const auto& v : values) {
    const std::string s(v.begin(), v.end());
    const auto space = s.find(' ');
    out.emplace_back(std::stoi(s.substr(0, space)), std::stoi(s.substr(space + 1)));
  }
  return out;
}

std::string agree_through_store(c10d::Store& store, const std::string& key, int rank, int size,
                                const std::string& problem, std::chrono::milliseconds timeout) {
  std::vector<std::string> keys;
  for (int r = 0; r < size; ++r) keys.push_back(key + std::to_string(r));
  // A leading byte: "ready" is an empty problem, and a store value is never empty.
  store.set(keys[rank], bytes("=" + problem));
  std::vector<int> missing;
  try {
    store.wait(keys, timeout);
  } catch (const std::exception&) {
    for (int r = 0; r < size; ++r) {
      if (!store.check({keys[r]})) missing.push_back(r);
    }
    if (missing.empty()) throw;  // the store itself failed: its message says so
  }
  std::string out;
  const auto add = [&](const std::string& part) { out += (out.empty() ? "" : "; ") + part; };
  for (int r = 0; r < size; ++r) {
    if (std::find(missing.begin(), missing.end(), r) != missing.end()) continue;
    const std::vector<uint8_t> v = store.get(keys[r]);
    const std::string text(v.begin() + 1, v.end());
    if (!text.empty()) add("rank " + std::to_string(r) + ": " + text);
  }
  if (!missing.empty()) {
    add((missing.size() == 1 ? "rank " : "ranks ") + join(missing) + " did not reach it within " +
        format_seconds(timeout));
  }
  return out;
}

std::shared_ptr<Group> C10dGroup::split(int color, int key, const std::string& name) {
  const int n = splits_++;
  std::vector<std::pair<int, int>> all;
  if (p_.size == 1) {
    all = {{color, key}};
  } else {
    all = exchange(n, color, key);
  }
  // NCCL subgroups are split from this group's communicator (make_nccl): ncclCommSplit is a
  // collective of all of this group's ranks, so a rank that gets no communicator here joins it
  // without a color whenever some group of this split gets one.
  const bool nccl = p_.opts.device == c10::DeviceType::CUDA && p_.backend;
  std::map<int, int> sizes;  // color -> members
  for (const auto& [c, k] : all) {
    if (c >= 0) ++sizes[c];
  }
  bool any_comm = false;
  for (const auto& [c, n] : sizes) any_comm = any_comm || n > 1;
  // ncclCommSplit blocks without a timeout, and a rank that fails before it while staying alive
  // would leave the others in it for good (review 2026-12-07a L3). So under NCCL every rank
  // first says through the store, with a timeout, that it can take part (its backend is made
  // and the parent has a communicator to split), and afterwards checks that c10d did split the
  // parent's communicator rather than bootstrap a fresh one.
  const bool nccl_split = nccl && any_comm;
  const uint64_t splits_before = nccl_split ? nccl_split_counter(*p_.backend) : 0;
  std::string problem;
  if (nccl_split && !nccl_has_communicator(*p_.backend)) {
    problem = "group " + p_.name + " has no NCCL communicator on this rank's GPU to split";
  }
  const auto agree = [&] {
    if (!nccl_split) return;
    const std::string all_problems =
        agree_through_store(*p_.store, "split/" + std::to_string(n) + "/ready/", p_.rank, p_.size,
                            problem, p_.opts.timeout);
    if (all_problems.empty()) return;
    throw CommError(who() + ": split " + std::to_string(n) + " of group " + p_.name +
                    " cannot start (" + all_problems +
                    "); no rank entered ncclCommSplit, which would wait for the others without "
                    "a timeout");
  };
  const auto check_split = [&](const std::string& as) {
    if (!nccl_split) return;
    const uint64_t after = nccl_split_counter(*p_.backend);
    if (after == splits_before + 1) return;
    throw CommError(who() + ": split " + std::to_string(n) + " of group " + p_.name + " (" + as +
                    "): c10d did not split the parent's NCCL communicator (its split count went " +
                    std::to_string(splits_before) + " -> " + std::to_string(after) +
                    ", expected +1); this torch's ProcessGroupNCCL split_from did not take "
                    "effect, and ranks still inside ncclCommSplit wait for this one");
  };
  if (color < 0 || sizes[color] <= 1) {
    if (nccl_split) {
      agree();
      nccl_split_without_color(*p_.backend);
      check_split("without a color");
    }
    if (color < 0) return nullptr;
  }

  std::vector<int> members;  // ranks of this group, in the new group's order
  for (int r = 0; r < p_.size; ++r) {
    if (all[r].first == color) members.push_back(r);
  }
  std::stable_sort(members.begin(), members.end(),
                   [&](int a, int b) { return all[a].second < all[b].second; });

  Parts c;
  c.rank = static_cast<int>(std::find(members.begin(), members.end(), p_.rank) - members.begin());
  c.size = static_cast<int>(members.size());
  c.opts = p_.opts;
  c.interface_hint = p_.interface_hint;
  c.liveness = p_.liveness;
  c.name = name.empty()
               ? p_.name + "/split " + std::to_string(n) + " color " + std::to_string(color)
               : name;
  for (int r : members) c.global_ranks.push_back(global_rank(r));
  if (c.size > 1) {
    // Like c10d's new_group: a store namespace and a backend of the group's own.
    c.store = c10::make_intrusive<c10d::PrefixStore>(
        "split/" + std::to_string(n) + "/color" + std::to_string(color), p_.store);
    try {
      c.backend = c.opts.device == c10::DeviceType::CUDA
                      // The subgroup's GPU is this rank's (the parent's bound device), not the
                      // one its rank within the subgroup would pick.
                      ? make_nccl(c.store, c.rank, c.size, c.opts, nccl_bound_device(*p_.backend),
                                  p_.backend, color)
                      : make_gloo(c.store, c.rank, c.size, c.opts, c.interface_hint);
    } catch (const std::exception& e) {
      if (nccl_split) {
        // Said to every rank before any enters the split (agree() throws on all of them).
        if (problem.empty()) problem = "making its NCCL group failed (" + c10d_message(e) + ")";
      } else {
        const std::string gone =
            p_.liveness ? p_.liveness->diagnose(std::chrono::milliseconds(4000))
                        : "a peer rank most likely exited or stalled (check its log above)";
        throw CommError(who() + ": setting up group " + c.name + " (world ranks " +
                        join(c.global_ranks) + ") failed (" + c10d_message(e) + "): " + gone);
      }
    }
    agree();
  }
  auto child = std::make_shared<C10dGroup>(std::move(c));
  // The split's groups are disjoint: each connects among its own ranks, none waits on another.
  child->connect("made by split " + std::to_string(n) + " of group " + p_.name);
  if (child->size() > 1) check_split("color " + std::to_string(color));
  return child;
}

std::string C10dGroup::gone_peers() const { return p_.liveness ? p_.liveness->gone_now() : ""; }

}  // namespace zero::comm
