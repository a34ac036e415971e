#include "zero/host_counting.hpp"

#include <c10/core/CPUAllocator.h>

#include <atomic>
#include <memory>
#include <mutex>
#include <unordered_map>

namespace zero {
namespace {

std::atomic<int64_t> g_in_use{0};
std::atomic<int64_t> g_peak{0};
std::atomic<bool> g_installed{false};
std::mutex g_mu;
// Bytes of each live storage, by address. ATen's raw_allocate wants the context to be the data
// pointer, so the size cannot ride in the context.
std::unordered_map<void*, int64_t>& sizes() {
  static auto* m = std::make_unique<std::unordered_map<void*, int64_t>>().release();
  return *m;
}
c10::DeleterFnPtr g_base_delete = nullptr;

void add(int64_t n) {
  const int64_t now = g_in_use.fetch_add(n) + n;
  int64_t p = g_peak.load();
  while (now > p && !g_peak.compare_exchange_weak(p, now)) {
  }
}

void release(void* data) {
  {
    std::lock_guard<std::mutex> lock(g_mu);
    auto it = sizes().find(data);
    if (it != sizes().end()) {
      g_in_use.fetch_sub(it->second);
      sizes().erase(it);
    }
  }
  g_base_delete(data);
}

class CountingAllocator final : public c10::Allocator {
 public:
  explicit CountingAllocator(c10::Allocator* base) : base_(base) {
    g_base_delete = base->raw_deleter();
    TORCH_CHECK(g_base_delete != nullptr, "the CPU allocator has no raw deleter to wrap");
  }

  c10::DataPtr allocate(size_t n) override {
    c10::DataPtr inner = base_->allocate(n);
    void* data = inner.get();
    const c10::Device device = inner.device();
    // The default CPU allocator's context is its data pointer, freed by its raw deleter.
    TORCH_CHECK(inner.get_context() == data && inner.get_deleter() == g_base_delete,
                "the CPU allocator's storages are not plain pointers");
    inner.release_context();
    {
      std::lock_guard<std::mutex> lock(g_mu);
      sizes()[data] = static_cast<int64_t>(n);
    }
    add(static_cast<int64_t>(n));
    return {data, data, &release, device};
  }

  c10::DeleterFnPtr raw_deleter() const override { return &release; }

  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }

 private:
  c10::Allocator* base_;
};

}  // namespace

HostCountingAllocator::HostCountingAllocator() {
  // Never destroyed: storages it counted may be freed at any time until the process ends.
  static auto* counting = std::make_unique<CountingAllocator>(c10::GetCPUAllocator()).release();
  // Above the default allocator's priority (0), so it replaces it.
  c10::SetCPUAllocator(counting, /*priority=*/1);
  g_installed.store(true);
}

HostCountingAllocator& HostCountingAllocator::get() {
  static HostCountingAllocator instance;
  return instance;
}

bool HostCountingAllocator::installed() { return g_installed.load(); }
int64_t HostCountingAllocator::in_use() const { return g_in_use.load(); }
int64_t HostCountingAllocator::peak() const { return g_peak.load(); }
void HostCountingAllocator::reset_peak() { g_peak.store(g_in_use.load()); }

}  // namespace zero
