// Gloo: the CPU backend. Ranks on one machine talk over loopback; otherwise GLOO_SOCKET_IFNAME
// picks the interface, as it does for PyTorch.
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>

#include <cstdlib>

#include "comm/backend.hpp"

namespace zero::comm {

c10::intrusive_ptr<c10d::Backend> make_gloo(const c10::intrusive_ptr<c10d::Store>& store, int rank,
                                            int size, const GroupOptions& opts,
                                            const std::string& interface_hint) {
  auto o = c10d::ProcessGroupGloo::Options::create();
  o->timeout = opts.timeout;
  if (const char* ifname = std::getenv("GLOO_SOCKET_IFNAME"); ifname && *ifname) {
    o->devices.push_back(c10d::ProcessGroupGloo::createDeviceForInterface(ifname));
  } else if (!interface_hint.empty()) {
    o->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname(interface_hint));
  } else {
    o->devices.push_back(c10d::ProcessGroupGloo::createDefaultDevice());
  }
  // Two gloo threads: one collective can run while the next is being queued (bucket overlap).
  o->threads = 2;
  return c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank, size, o);
}

// Gloo completes collectives on its own threads: the result is usable only once this thread
// has seen it finish, so the wait blocks, bounded by comm_timeout_s.
void gloo_wait(c10d::Work& work, std::chrono::milliseconds timeout) { work.wait(timeout); }

std::chrono::milliseconds gloo_store_timeout(const c10d::Backend& backend) {
  const auto* pg = dynamic_cast<const c10d::ProcessGroupGloo*>(&backend);
  if (pg == nullptr) return std::chrono::milliseconds(0);
  // ProcessGroupGloo wraps the store it was given in a GlooStore, always (and gloo's base
  // class exports no type information for a dynamic_cast).
  const auto* store = static_cast<const c10d::ProcessGroupGloo::GlooStore*>(pg->_getStore().get());
  return store->_getStore()->getTimeout();
}

}  // namespace zero::comm
