// N ranks as N threads, each with its own gloo process group over one shared HashStore: the
// way c10d tests itself. Real collectives over loopback, no processes to start.
#pragma once

#include <chrono>
#include <functional>
#include <memory>

#include "comm/group.hpp"

namespace zero::testing {

// Runs fn(group) on `world` threads and rethrows the first failure (after all threads ended).
void run_ranks(int world, const std::function<void(std::shared_ptr<comm::Group>)>& fn,
               std::chrono::milliseconds timeout = std::chrono::seconds(60));

}  // namespace zero::testing
