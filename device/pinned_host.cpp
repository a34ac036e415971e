#include "device/pinned_host.hpp"

#include <ATen/ATen.h>
#include <ATen/Context.h>
#include <ATen/DeviceAccelerator.h>
#include <c10/core/AllocatorConfig.h>
#include <c10/util/llvmMathExtras.h>
#include <torch/version.h>

#include <memory>
#include <mutex>
#include <optional>
#include <unordered_map>

#include "device/page_lock.hpp"

namespace zero::device {
namespace {

struct ExactBlock {
  size_t bytes;
  void (*release)(void*);
};

// Every exact block alive, by address: its size for host_bytes() and its release for the
// deleter (DataPtr deleters get the pointer only).
struct Registry {
  std::mutex mu;
  std::unordered_map<c10::DeviceType, PageLocker> lockers;
  std::unordered_map<const void*, ExactBlock> blocks;
  int64_t live_bytes = 0;
};

Registry& registry() {
  static Registry r;
  return r;
}

std::optional<PageLocker> locker_for(c10::DeviceType type) {
  if (auto builtin = detail::builtin_page_locker(type)) return builtin;
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  const auto it = r.lockers.find(type);
  if (it == r.lockers.end()) return std::nullopt;
  return it->second;
}

void release_exact(void* p) {
  Registry& r = registry();
  void (*release)(void*) = nullptr;
  {
    std::lock_guard<std::mutex> lock(r.mu);
    const auto it = r.blocks.find(p);
    TORCH_INTERNAL_ASSERT(it != r.blocks.end(), "pinned_host: freeing a block it did not make");
    release = it->second.release;
    r.live_bytes -= static_cast<int64_t>(it->second.bytes);
    r.blocks.erase(it);
  }
  release(p);
}

size_t page_round(size_t n) {
  const auto page = static_cast<size_t>(kHostPageBytes);
  return (n + page - 1) / page * page;
}

at::Tensor exact_block(int64_t numel, at::ScalarType dtype, const PageLocker& locker) {
  const size_t bytes = page_round(static_cast<size_t>(numel) * c10::elementSize(dtype));
  void* p = locker.allocate(bytes);
  TORCH_CHECK(p != nullptr, "pinned_host: the page locker returned no memory for ", bytes,
              " bytes");
  // Owned here until the registry knows it (the insert may throw bad_alloc): page-locked memory
  // that leaks stays locked for the life of the process.
  std::unique_ptr<void, void (*)(void*)> owned(p, locker.release);
  Registry& r = registry();
  {
    std::lock_guard<std::mutex> lock(r.mu);
    r.blocks.emplace(p, ExactBlock{bytes, locker.release});
    r.live_bytes += static_cast<int64_t>(bytes);
  }
  // From here release_exact unregisters and frees it, and the DataPtr owns it before anything
  // else can throw (from_blob may throw before it wraps the pointer, which would leave the
  // registered block without an owner).
  c10::DataPtr data(owned.release(), p, &release_exact, c10::Device(c10::kCPU));
  const auto nbytes = static_cast<size_t>(numel) * c10::elementSize(dtype);
  c10::Storage storage(c10::Storage::use_byte_size_t(), nbytes, std::move(data),
                       /*allocator=*/nullptr, /*resizable=*/false);
  return at::empty({0}, at::TensorOptions().dtype(dtype)).set_(std::move(storage), 0, {numel}, {1});
}

}  // namespace

void register_page_locker(c10::DeviceType type, PageLocker locker) {
  TORCH_CHECK(locker.allocate && locker.release, "register_page_locker: both functions needed");
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  r.lockers[type] = locker;
}

at::Tensor host_zeros(int64_t numel, bool pin, at::ScalarType dtype) {
  // Page-locked memory comes from the accelerator (CUDA, or a registered backend); without a
  // usable accelerator there is nothing to pin for.
  const auto accelerator = at::getAccelerator(/*checked=*/false);
  const bool can_pin = pin && accelerator &&
                       at::globalContext().getAcceleratorHooksInterface(accelerator).isAvailable();
  at::Tensor t;
  if (can_pin && numel * static_cast<int64_t>(c10::elementSize(dtype)) >= kExactPinnedMinBytes) {
    if (const auto locker = locker_for(*accelerator)) t = exact_block(numel, dtype, *locker);
  }
  if (!t.defined()) {
    t = at::empty({numel}, at::TensorOptions().dtype(dtype).pinned_memory(can_pin));
  }
  t.zero_();
  return t;
}

int64_t host_bytes(const at::Tensor& t) {
  if (!t.defined()) return 0;
  const auto n = static_cast<size_t>(t.storage().nbytes());
  {
    Registry& r = registry();
    std::lock_guard<std::mutex> lock(r.mu);
    const auto it = r.blocks.find(t.storage().data());
    if (it != r.blocks.end()) return static_cast<int64_t>(it->second.bytes);
  }
  if (!t.is_pinned()) return static_cast<int64_t>(n);
    // CachingHostAllocator::allocate's rounding rule (ATen/core/CachingHostAllocator.h). Before
    // torch 2.13 it has no thresholds: every pinned block is rounded up to a power of two.
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 13)
  using Config = c10::CachingAllocator::AcceleratorAllocatorConfig;
  const bool rounded =
      n <= Config::pinned_max_round_threshold() && n <= Config::pinned_max_cached_size();
#else
  const bool rounded = true;
#endif
  return static_cast<int64_t>(rounded ? c10::llvm::PowerOf2Ceil(n) : n);
}

int64_t exact_pinned_bytes() {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  return r.live_bytes;
}

}  // namespace zero::device
