#include "zero/host_counting.hpp"

#include <c10/core/CPUAllocator.h>

#include <atomic>
#include <memory>
#include <mutex>
#include <unordered_map>

namespace zero {
namespace {

// Read without the lock; written under g_mu with the per-tag figures, so that the split kept
// at the peak adds up to it.
std::atomic<int64_t> g_in_use{0};
std::atomic<int64_t> g_peak{0};
std::atomic<bool> g_installed{false};
std::mutex g_mu;
HostTagBytes g_by_tag{};    // guarded by g_mu
HostTagBytes g_peak_tag{};  // guarded by g_mu: g_by_tag when g_peak was reached
thread_local HostTag t_tag = HostTag::kOther;

struct Live {
  int64_t bytes;
  HostTag tag;
};
// Each live storage, by address. ATen's raw_allocate wants the context to be the data pointer,
// so the size cannot ride in the context.
std::unordered_map<const void*, Live>& live() {
  static auto* m = std::make_unique<std::unordered_map<const void*, Live>>().release();
  return *m;
}
c10::DeleterFnPtr g_base_delete = nullptr;

int idx(HostTag t) { return static_cast<int>(t); }

void add(const void* data, int64_t n, HostTag tag) {
  std::lock_guard<std::mutex> lock(g_mu);
  live()[data] = {n, tag};
  g_by_tag[idx(tag)] += n;
  const int64_t now = g_in_use.fetch_add(n) + n;
  if (now > g_peak.load()) {
    g_peak.store(now);
    g_peak_tag = g_by_tag;
  }
}

void release(void* data) {
  {
    std::lock_guard<std::mutex> lock(g_mu);
    auto it = live().find(data);
    if (it != live().end()) {
      g_in_use.fetch_sub(it->second.bytes);
      g_by_tag[idx(it->second.tag)] -= it->second.bytes;
      live().erase(it);
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
    add(data, static_cast<int64_t>(n), t_tag);
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
void HostCountingAllocator::reset_peak() {
  std::lock_guard<std::mutex> lock(g_mu);
  g_peak.store(g_in_use.load());
  g_peak_tag = g_by_tag;
}

HostCountingAllocator::Tag::Tag(HostTag t) : prev_(t_tag) { t_tag = t; }
HostCountingAllocator::Tag::~Tag() { t_tag = prev_; }

void HostCountingAllocator::retag(const void* data, HostTag t) {
  if (!installed() || data == nullptr) return;
  std::lock_guard<std::mutex> lock(g_mu);
  auto it = live().find(data);
  if (it == live().end() || it->second.tag == t) return;
  g_by_tag[idx(it->second.tag)] -= it->second.bytes;
  g_by_tag[idx(t)] += it->second.bytes;
  it->second.tag = t;
}

HostTagBytes HostCountingAllocator::in_use_by_tag() const {
  std::lock_guard<std::mutex> lock(g_mu);
  return g_by_tag;
}

HostTagBytes HostCountingAllocator::peak_by_tag() const {
  std::lock_guard<std::mutex> lock(g_mu);
  return g_peak_tag;
}

const char* host_tag_name(HostTag t) {
  switch (t) {
    case HostTag::kOther:
      return "other";
    case HostTag::kGathered:
      return "gathered units";
    case HostTag::kUnitGrads:
      return "unit gradients held";
    case HostTag::kGradShard:
      return "gradient shard";
    case HostTag::kBuckets:
      return "bucket buffers";
    case HostTag::kActivations:
      return "forward (activations)";
    case HostTag::kLogits:
      return "logits and loss";
    case HostTag::kBackward:
      return "backward (autograd)";
    case HostTag::kStep:
      return "step";
    case HostTag::kCount:
      break;
  }
  return "?";
}

}  // namespace zero
