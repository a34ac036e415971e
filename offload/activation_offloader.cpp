#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <map>
#include <mutex>
#include <unordered_map>

#include "device/copy_engine.hpp"
#include "zero/activation_checkpointing.hpp"

namespace zero {

using device::CopyEngine;
using device::Ticket;

struct ActivationOffloader::Impl {
  struct Slot {
    at::Tensor host;  // undefined where the block's input was undefined
    CopyEngine* engine = nullptr;
    at::Tensor fetched;  // the copy back, once started
    Ticket fetch_ticket;
  };
  struct Entry {
    std::vector<Slot> slots;
    int64_t bytes = 0;
    bool fetch_started = false;
  };
  // A device tensor whose copy to host has not been seen to finish: it must stay allocated.
  struct InFlight {
    at::Tensor src;
    CopyEngine* engine;
    Ticket ticket;
    int64_t bytes;
  };

  std::mutex mu;
  std::unordered_map<c10::Device, std::unique_ptr<CopyEngine>> engines;
  // Ordered by id, which is forward order: the block before id i is the one backward needs next.
  std::map<int64_t, Entry> blocks;
  std::vector<InFlight> in_flight;
  int64_t next_id = 0;
  int64_t first_id_since_reset = 0;
  OffloadStats stats;

  CopyEngine* engine_for(c10::Device device) {
    auto it = engines.find(device);
    if (it == engines.end()) {
      it = engines.emplace(device, device::make_copy_engine(device)).first;
    }
    return it->second.get();
  }

  // Releases the sources of finished copies. Polled on every call instead of blocking, so the
  // device memory goes away at the first opportunity without ever stalling the host.
  void reap() {
    std::erase_if(in_flight, [&](const InFlight& f) {
      if (!f.engine->ready(f.ticket)) return false;
      stats.device_bytes_kept -= f.bytes;
      return true;
    });
  }

  void start_fetch(Entry& e) {
    for (Slot& s : e.slots) {
      if (!s.host.defined()) continue;
      device::Copy c = s.engine->to_device_async(s.host);
      s.fetched = std::move(c.dst);
      s.fetch_ticket = std::move(c.ticket);
    }
    e.fetch_started = true;
  }

  [[noreturn]] void fail_missing(int64_t id) const {
    TORCH_CHECK(id >= 0 && id < next_id, "ActivationOffloader: block ", id,
                " was never offloaded by this offloader; the checkpoint was made with another "
                "ActivationOffloader than the one being asked for it.");
    TORCH_CHECK(id >= first_id_since_reset, "ActivationOffloader: block ", id,
                " was dropped by reset() before its backward ran. Call reset() only after every "
                "backward of the step has finished.");
    TORCH_CHECK(false, "ActivationOffloader: block ", id,
                "'s saved input was already fetched and freed, so backward already ran through "
                "this checkpoint. Offloaded inputs are used once: to backpropagate through the "
                "same graph again (retain_graph), checkpoint without CheckpointOptions::offload.");
  }

  void forget(Entry& e) {
    stats.host_bytes -= e.bytes;
    if (e.fetch_started) stats.device_bytes_kept -= e.bytes;
    ++stats.freed;
  }
};

ActivationOffloader::ActivationOffloader() : impl_(std::make_shared<Impl>()) {}

int64_t ActivationOffloader::offload(const std::vector<at::Tensor>& inputs) {
  Impl& m = *impl_;
  std::lock_guard<std::mutex> lock(m.mu);
  m.reap();
  Impl::Entry e;
  e.slots.resize(inputs.size());
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (!inputs[i].defined()) continue;
    const at::Tensor src = inputs[i].detach();
    Impl::Slot& s = e.slots[i];
    s.engine = m.engine_for(src.device());
    device::Copy c = s.engine->to_host_async(src);
    s.host = std::move(c.dst);
    const int64_t bytes = static_cast<int64_t>(s.host.nbytes());
    e.bytes += bytes;
    if (c.ticket) {
      m.in_flight.push_back({src, s.engine, std::move(c.ticket), bytes});
      m.stats.device_bytes_kept += bytes;
    }
  }
  m.stats.host_bytes += e.bytes;
  m.stats.peak_host_bytes = std::max(m.stats.peak_host_bytes, m.stats.host_bytes);
  ++m.stats.offloaded;
  const int64_t id = m.next_id++;
  m.blocks.emplace(id, std::move(e));
  return id;
}

std::vector<at::Tensor> ActivationOffloader::fetch(int64_t id) {
  Impl& m = *impl_;
  std::lock_guard<std::mutex> lock(m.mu);
  m.reap();
  auto it = m.blocks.find(id);
  if (it == m.blocks.end()) m.fail_missing(id);
  Impl::Entry e = std::move(it->second);
  m.blocks.erase(it);

  ++m.stats.fetched;
  m.forget(e);  // before start_fetch: only a prefetch was counted in device_bytes_kept
  if (!e.fetch_started) m.start_fetch(e);  // not prefetched: the wait below makes it synchronous
  std::vector<at::Tensor> out;
  out.reserve(e.slots.size());
  for (Impl::Slot& s : e.slots) {
    if (s.host.defined()) s.engine->wait(s.fetch_ticket);
    out.push_back(std::move(s.fetched));
  }

  // Backward runs blocks in reverse forward order, so the block before this one is next: start
  // its copy now and it overlaps this block's recomputation.
  auto prev = m.blocks.lower_bound(id);
  if (prev != m.blocks.begin()) {
    --prev;
    if (!prev->second.fetch_started) {
      m.start_fetch(prev->second);
      m.stats.device_bytes_kept += prev->second.bytes;
      ++m.stats.prefetched;
    }
  }
  return out;
}

void ActivationOffloader::release(int64_t id) {
  Impl& m = *impl_;
  std::lock_guard<std::mutex> lock(m.mu);
  auto it = m.blocks.find(id);
  if (it == m.blocks.end()) return;
  m.forget(it->second);
  m.blocks.erase(it);
}

void ActivationOffloader::synchronize() {
  Impl& m = *impl_;
  std::lock_guard<std::mutex> lock(m.mu);
  for (const Impl::InFlight& f : m.in_flight) f.engine->synchronize(f.ticket);
  m.reap();
}

OffloadStats ActivationOffloader::stats() const {
  Impl& m = *impl_;
  std::lock_guard<std::mutex> lock(m.mu);
  m.reap();
  return m.stats;
}

void ActivationOffloader::reset() {
  Impl& m = *impl_;
  std::lock_guard<std::mutex> lock(m.mu);
  // Sources of copies still in flight are being read: wait rather than free them under the copy.
  for (const Impl::InFlight& f : m.in_flight) f.engine->synchronize(f.ticket);
  m.in_flight.clear();
  m.blocks.clear();
  m.stats = {};
  m.first_id_since_reset = m.next_id;
}

}  // namespace zero
