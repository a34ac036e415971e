// N ranks as N threads, each with its own gloo process group over one shared HashStore: the
// way c10d tests itself. Real collectives over loopback, no processes to start.
#pragma once

#include <c10/util/intrusive_ptr.h>

#include <chrono>
#include <functional>
#include <memory>

#include "comm/group.hpp"

namespace c10d {
class Store;
}  // namespace c10d

namespace zero::testing {

// Runs fn(group) on `world` threads and rethrows the first failure (after all threads ended).
// `device`: the device type of the tensors the groups move (another than CPU: gloo through host
// copies, comm/group.hpp).
void run_ranks(int world, const std::function<void(std::shared_ptr<comm::Group>)>& fn,
               std::chrono::milliseconds timeout = std::chrono::seconds(60),
               c10::DeviceType device = c10::DeviceType::CPU);
// The same over the test's own `store` (to watch what the groups ask of it).
void run_ranks(int world, const c10::intrusive_ptr<c10d::Store>& store,
               const std::function<void(std::shared_ptr<comm::Group>)>& fn,
               std::chrono::milliseconds timeout, c10::DeviceType device = c10::DeviceType::CPU);
}  // namespace zero::testing
