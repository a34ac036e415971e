#include "support/thread_group.hpp"

#include <ATen/Parallel.h>
#include <torch/csrc/distributed/c10d/HashStore.hpp>

#include <cstdlib>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

namespace zero::testing {

void run_ranks(int world, const std::function<void(std::shared_ptr<comm::Group>)>& fn,
               std::chrono::milliseconds timeout, c10::DeviceType device) {
  run_ranks(world, c10::make_intrusive<c10d::HashStore>(), fn, timeout, device);
}

void run_ranks(int world, const c10::intrusive_ptr<c10d::Store>& store,
               const std::function<void(std::shared_ptr<comm::Group>)>& fn,
               std::chrono::milliseconds timeout, c10::DeviceType device) {
  // Ranks share two cores: intra-op threads would only oversubscribe them.
  at::set_num_threads(1);
  // torch 2.11's c10d flight recorder inserts into its process-group map before taking its
  // lock (fixed by 2.13): groups created from several threads at once crash in it. One process,
  // one group (every real run) never races; threads as ranks do, so tests turn it off.
  setenv("TORCH_FR_BUFFER_SIZE", "0", /*overwrite=*/0);
  std::vector<std::exception_ptr> errors(world);
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      try {
        comm::GroupOptions opts;
        opts.timeout = timeout;
        opts.device = device;
        fn(comm::Group::over_store(store, r, world, opts));
      } catch (...) {
        errors[r] = std::current_exception();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (auto& e : errors) {
    if (e) std::rethrow_exception(e);
  }
}

}  // namespace zero::testing
