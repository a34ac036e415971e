// Waiting on the host for a device event without burning a core.
//
// c10::Event::synchronize is cudaEventSynchronize, which under CUDA's default scheduling
// (cudaDeviceScheduleAuto: spin while there are more cores than GPUs) spins the calling thread
// for the whole wait, and c10's event flags cannot ask for cudaEventBlockingSync. The waits here
// (a gradient slot landing during backward, a device-to-host copy of a checkpoint piece, the
// step's read-back) can be milliseconds long while the CPU AdamW or the autograd thread needs
// the core. So the event is polled: a few spins for short waits, then yields, then sleeps that
// grow to kMaxSleep, which bounds the latency a long wait adds.
#pragma once

#include <c10/core/Event.h>

#include <algorithm>
#include <chrono>
#include <thread>

namespace zero::device {

inline void wait_for_event(const c10::Event& event) {
  constexpr int kSpins = 16;
  constexpr int kYields = 64;
  constexpr std::chrono::microseconds kMaxSleep{200};
  std::chrono::microseconds sleep{10};
  for (int i = 0; !event.query(); ++i) {
    if (i < kSpins) continue;
    if (i < kSpins + kYields) {
      std::this_thread::yield();
      continue;
    }
    std::this_thread::sleep_for(sleep);
    sleep = std::min(2 * sleep, kMaxSleep);
  }
}

}  // namespace zero::device
