#include "support/fake_device.hpp"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/EmptyTensor.h>
#include <ATen/detail/PrivateUse1HooksInterface.h>
#include <ATen/native/CPUFallback.h>
#include <ATen/native/Resize.h>
#include <ATen/ops/_reshape_alias_native.h>
#include <ATen/ops/as_strided_native.h>
#include <ATen/ops/view_native.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/CachingDeviceAllocator.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/core/impl/alloc_cpu.h>
#include <c10/util/Backtrace.h>
#include <c10/util/llvmMathExtras.h>
#include <torch/library.h>

#include <array>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "comm/staging.hpp"
#include "device/pinned_host.hpp"

namespace zero::testing::fake {
namespace {

using c10::DeviceIndex;
using c10::DeviceType;
using Clock = std::chrono::steady_clock;
constexpr DeviceType kType = DeviceType::PrivateUse1;

// The current device and each device's current stream, per thread, as CUDA keeps them.
thread_local DeviceIndex t_device = 0;
thread_local std::array<c10::StreamId, kDevices> t_stream{};

DeviceIndex index_of(c10::Device d) { return d.has_index() ? d.index() : t_device; }

// ---- host reads ------------------------------------------------------------------------------

// What a GPU would make the host wait for, per device (host_reads in fake_device.hpp).
std::array<std::atomic<int64_t>, kDevices> g_host_reads{}, g_async_copies{};
// > 0 while the CPU fallback runs a kernel: its copies to and from the host are how the fake
// computes, not reads a program asked for.
thread_local int t_in_fallback = 0;

// ZERO_FAKE_TRACE_READS=1 prints where each counted read came from (finding a read in a test).
void count_read(DeviceIndex d) {
  g_host_reads[d].fetch_add(1);
  static const bool trace = std::getenv("ZERO_FAKE_TRACE_READS") != nullptr;
  if (trace)
    std::fprintf(stderr, "fake:%d host read at\n%s\n", d, c10::get_backtrace(2, 40).c_str());
}

// ---- memory ----------------------------------------------------------------------------------

// Device memory: host memory, every byte counted per device index. A DeviceAllocator, so that
// generic code reads it as it reads CUDA's (c10::getDeviceAllocator(type)->getDeviceStats).
std::array<std::atomic<int64_t>, kDevices> g_fail_from{};  // see fail_allocations_from
// Allocations still allowed + 1 (0: no limit); see fail_allocations_after.
std::array<std::atomic<int64_t>, kDevices> g_fail_after{};

class CountingAllocator final : public c10::DeviceAllocator {
 public:
  c10::DataPtr allocate(size_t n) override {
    const DeviceIndex d = t_device;
    const int64_t limit = g_fail_from.at(static_cast<size_t>(d)).load();
    TORCH_CHECK_WITH(OutOfMemoryError, limit == 0 || static_cast<int64_t>(n) < limit,
                     "fake device: fake:", static_cast<int>(d), " is out of memory (", n,
                     " bytes asked; the test fails allocations from ", limit, ")");
    std::atomic<int64_t>& after = g_fail_after.at(static_cast<size_t>(d));
    TORCH_CHECK_WITH(OutOfMemoryError, after.load() != 1, "fake device: fake:", static_cast<int>(d),
                     " is out of memory (", n,
                     " bytes asked; the test fails its allocations from now on)");
    if (after.load() > 1) after.fetch_sub(1);
    void* p = n == 0 ? nullptr : c10::alloc_cpu(n);
    if (p) {
      std::lock_guard<std::mutex> lock(mu_);
      live_[p] = {n, d};
      auto& s = stats_[d];
      s.current += static_cast<int64_t>(n);
      s.peak = std::max(s.peak, s.current);
      ++s.allocations;
      ++s.by_size[static_cast<int64_t>(n)];
    }
    return {p, p, &release, c10::Device(kType, d)};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &release; }
  void copy_data(void* dst, const void* src, size_t n) const override {
    default_copy_data(dst, src, n);
  }

  bool initialized() override { return true; }
  void emptyCache(c10::MempoolId_t) override {}  // nothing is cached: freed is gone
  void recordStream(const c10::DataPtr&, c10::Stream) override {}
  c10::CachingDeviceAllocator::DeviceStats getDeviceStats(DeviceIndex d) override {
    c10::CachingDeviceAllocator::DeviceStats out;
    std::lock_guard<std::mutex> lock(mu_);
    const Counter& s = stats_.at(d);
    for (auto* a : {&out.allocated_bytes, &out.reserved_bytes, &out.active_bytes}) {
      auto& agg = (*a)[static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE)];
      agg.current = s.current;
      agg.peak = s.peak;
    }
    out.num_alloc_retries = s.alloc_retries;
    return out;
  }
  void resetAccumulatedStats(DeviceIndex) override {}
  void resetPeakStats(DeviceIndex d) override {
    std::lock_guard<std::mutex> lock(mu_);
    stats_.at(d).peak = stats_.at(d).current;
  }

  static CountingAllocator& get() {
    static CountingAllocator a;
    return a;
  }
  int64_t allocations(DeviceIndex d, int64_t bytes) {
    std::lock_guard<std::mutex> lock(mu_);
    const Counter& s = stats_.at(d);
    if (bytes < 0) return s.allocations;
    const auto it = s.by_size.find(bytes);
    return it == s.by_size.end() ? 0 : it->second;
  }
  void add_alloc_retries(DeviceIndex d, int64_t n) {
    std::lock_guard<std::mutex> lock(mu_);
    stats_.at(d).alloc_retries += n;
  }

 private:
  static void release(void* p) {
    if (!p) return;
    get().forget(p);
    c10::free_cpu(p);
  }
  void forget(void* p) {
    std::lock_guard<std::mutex> lock(mu_);
    const auto it = live_.find(p);
    TORCH_INTERNAL_ASSERT(it != live_.end(), "fake device: freeing memory it did not allocate");
    stats_[it->second.device].current -= static_cast<int64_t>(it->second.bytes);
    live_.erase(it);
  }

  struct Block {
    size_t bytes;
    DeviceIndex device;
  };
  struct Counter {
    int64_t current = 0;
    int64_t peak = 0;
    int64_t allocations = 0;
    std::unordered_map<int64_t, int64_t> by_size;  // allocations per size in bytes
    int64_t alloc_retries = 0;                     // see add_alloc_retries
  };
  std::mutex mu_;
  std::unordered_map<void*, Block> live_;
  std::array<Counter, kDevices> stats_{};
};

// Page-locked host memory, modelled on CUDA's: at::empty(..., pinned_memory(true)) reaches a
// caching allocator that rounds each request up to a power of two and keeps freed blocks for
// reuse (CachingHostAllocator's rule), and exact-size blocks are made on request, as
// cudaHostAlloc makes them (the engine's page locker, device/pinned_host.hpp). Both are ordinary
// host memory, counted, and known by address for is_pinned().
thread_local int64_t t_pinned_fail_from = 0;  // see fail_pinned_from

void check_pinned(size_t n) {
  TORCH_CHECK(t_pinned_fail_from == 0 || static_cast<int64_t>(n) < t_pinned_fail_from,
              "fake device: cannot page-lock ", n,
              " bytes of host memory (the test fails page-locked allocations from ",
              t_pinned_fail_from, ")");
}

class PinnedAllocator final : public c10::Allocator {
 public:
  c10::DataPtr allocate(size_t n) override {
    if (n == 0) return {nullptr, nullptr, &release, c10::Device(DeviceType::CPU)};
    check_pinned(n);
    const size_t size = c10::llvm::PowerOf2Ceil(n);
    void* p = nullptr;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto& cached = free_[size];
      if (!cached.empty()) {
        p = cached.back();
        cached.pop_back();
      }
    }
    if (!p) p = c10::alloc_cpu(size);
    std::lock_guard<std::mutex> lock(mu_);
    ++allocations_;
    auto& b = held_[p];
    if (b.bytes == 0) reserved_ += static_cast<int64_t>(size);
    b = {size, true, false};
    in_use_ += static_cast<int64_t>(size);
    return {p, p, &release, c10::Device(DeviceType::CPU)};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &release; }
  void copy_data(void* dst, const void* src, size_t n) const override {
    default_copy_data(dst, src, n);
  }
  bool pinned(const void* p) {
    std::lock_guard<std::mutex> lock(mu_);
    const auto it = held_.find(const_cast<void*>(p));
    return it != held_.end() && it->second.live;
  }
  int64_t reserved() {
    std::lock_guard<std::mutex> lock(mu_);
    return reserved_;
  }
  int64_t in_use() {
    std::lock_guard<std::mutex> lock(mu_);
    return in_use_;
  }
  int64_t allocations() {
    std::lock_guard<std::mutex> lock(mu_);
    return allocations_;
  }
  // An exact-size block (the page locker's): not cached, given back at release.
  static void* allocate_exact(size_t n) {
    check_pinned(n);
    void* p = c10::alloc_cpu(n);
    auto& a = get();
    std::lock_guard<std::mutex> lock(a.mu_);
    ++a.allocations_;
    a.held_[p] = {n, true, true};
    a.reserved_ += static_cast<int64_t>(n);
    a.in_use_ += static_cast<int64_t>(n);
    return p;
  }
  static void release_exact(void* p) { release(p); }
  static PinnedAllocator& get() {
    static PinnedAllocator a;
    return a;
  }

 private:
  static void release(void* p) {
    if (!p) return;
    bool give_back = false;
    {
      auto& a = get();
      std::lock_guard<std::mutex> lock(a.mu_);
      const auto it = a.held_.find(p);
      TORCH_INTERNAL_ASSERT(it != a.held_.end() && it->second.live,
                            "fake device: unknown pinned block");
      a.in_use_ -= static_cast<int64_t>(it->second.bytes);
      if (it->second.exact) {
        a.reserved_ -= static_cast<int64_t>(it->second.bytes);
        a.held_.erase(it);
        give_back = true;
      } else {
        it->second.live = false;
        a.free_[it->second.bytes].push_back(p);
      }
    }
    if (give_back) c10::free_cpu(p);
  }
  struct Block {
    size_t bytes = 0;
    bool live = false;
    bool exact = false;
  };
  std::mutex mu_;
  std::unordered_map<void*, Block> held_;
  std::unordered_map<size_t, std::vector<void*>> free_;
  int64_t reserved_ = 0;
  int64_t in_use_ = 0;
  int64_t allocations_ = 0;
};

// ---- streams and events ----------------------------------------------------------------------

std::atomic<int64_t> g_event_delay_us{0};

// The work is done by the time a kernel returns (the fallback runs it on the host), so an event
// is complete once recorded, or `delay` later when a delay is set.
struct FakeEvent {
  Clock::time_point ready_at;
};

struct FakeGuard final : public c10::impl::DeviceGuardImplInterface {
  static constexpr DeviceType static_type = kType;
  DeviceType type() const override { return kType; }
  c10::Device exchangeDevice(c10::Device d) const override {
    const c10::Device old = getDevice();
    setDevice(d);
    return old;
  }
  c10::Device getDevice() const override { return {kType, t_device}; }
  void setDevice(c10::Device d) const override {
    TORCH_CHECK(d.type() == kType, "fake device guard given ", d);
    TORCH_CHECK(!d.has_index() || d.index() < kDevices, "fake device: no device ", d);
    if (d.has_index()) t_device = d.index();
  }
  void uncheckedSetDevice(c10::Device d) const noexcept override {
    if (d.has_index() && d.index() < kDevices) t_device = d.index();
  }
  c10::Stream getStream(c10::Device d) const override {
    const DeviceIndex i = index_of(d);
    return c10::Stream(c10::Stream::UNSAFE, c10::Device(kType, i), t_stream[i]);
  }
  c10::Stream getDefaultStream(c10::Device d) const override {
    return c10::Stream(c10::Stream::DEFAULT, c10::Device(kType, index_of(d)));
  }
  c10::Stream getStreamFromGlobalPool(c10::Device d, bool) const override {
    return getNewStream(d, 0);
  }
  c10::Stream getNewStream(c10::Device d, int) const override {
    static std::atomic<c10::StreamId> next{1};
    return c10::Stream(c10::Stream::UNSAFE, c10::Device(kType, index_of(d)), next++);
  }
  c10::Stream exchangeStream(c10::Stream s) const override {
    const c10::Stream old = getStream(s.device());
    t_stream[index_of(s.device())] = s.id();
    return old;
  }
  void record(void** event, const c10::Stream&, DeviceIndex, c10::EventFlag) const override {
    // c10's interface owns events as void* (destroyEvent frees them): no smart pointer fits.
    if (*event == nullptr) *event = new FakeEvent{};
    static_cast<FakeEvent*>(*event)->ready_at =
        Clock::now() + std::chrono::microseconds(g_event_delay_us.load());
  }
  void destroyEvent(void* event, DeviceIndex) const noexcept override {
    delete static_cast<FakeEvent*>(event);
  }
  // The device waits: the work it waits for is done (copies are synchronous).
  void block(void*, const c10::Stream&) const override {}
  bool queryEvent(void* event) const override {
    return event == nullptr || Clock::now() >= static_cast<FakeEvent*>(event)->ready_at;
  }
  void synchronizeEvent(void* event) const override {
    if (event) std::this_thread::sleep_until(static_cast<FakeEvent*>(event)->ready_at);
  }
  DeviceIndex deviceCount() const noexcept override { return kDevices; }
  bool queryStream(const c10::Stream&) const override { return true; }
  void synchronizeStream(const c10::Stream&) const override {}
  void synchronizeDevice(DeviceIndex) const override {}
  void recordDataPtrOnStream(const c10::DataPtr&, const c10::Stream&) const override {}
  double elapsedTime(void*, void*, DeviceIndex) const override { return 0; }
};

// ---- the backend's hooks (generator, pinned memory) ------------------------------------------

struct FakeGenerator : public at::CPUGeneratorImpl {
  explicit FakeGenerator(DeviceIndex i) {
    device_ = c10::Device(kType, i);
    key_set_ = c10::DispatchKeySet(c10::DispatchKey::PrivateUse1);
  }
};

struct FakeHooks final : public at::PrivateUse1HooksInterface {
  bool isBuilt() const override { return true; }
  bool isAvailable() const override { return true; }
  bool hasPrimaryContext(DeviceIndex) const override { return true; }
  void init() const override {}
  DeviceIndex deviceCount() const override { return kDevices; }
  void setCurrentDevice(DeviceIndex d) const override { t_device = d; }
  DeviceIndex getCurrentDevice() const override { return t_device; }
  DeviceIndex exchangeDevice(DeviceIndex d) const override { return std::exchange(t_device, d); }
  DeviceIndex maybeExchangeDevice(DeviceIndex d) const override { return exchangeDevice(d); }
  const at::Generator& getDefaultGenerator(DeviceIndex i) const override {
    static std::array<at::Generator, kDevices> gens = [] {
      std::array<at::Generator, kDevices> g;
      for (int k = 0; k < kDevices; ++k) g[k] = at::make_generator<FakeGenerator>(k);
      return g;
    }();
    return gens.at(i < 0 ? t_device : i);
  }
  at::Generator getNewGenerator(DeviceIndex i) const override {
    return at::make_generator<FakeGenerator>(i < 0 ? t_device : i);
  }
  bool isPinnedPtr(const void* p) const override { return PinnedAllocator::get().pinned(p); }
  c10::Allocator* getPinnedMemoryAllocator() const override { return &PinnedAllocator::get(); }
  c10::Device getDeviceFromPtr(void*) const override { return {kType, t_device}; }
};

// ---- kernels: allocation, copies and views are the fake's own; everything else is the CPU's ----

constexpr c10::DispatchKeySet kKeys(c10::DispatchKey::PrivateUse1);

at::Tensor empty_memory_format(at::IntArrayRef size, std::optional<at::ScalarType> dtype,
                               std::optional<at::Layout>, std::optional<at::Device> device,
                               std::optional<bool>, std::optional<at::MemoryFormat> format) {
  // The allocator allocates on the current device: make it the requested one.
  const c10::OptionalDeviceGuard guard(device);
  return at::detail::empty_generic(size, &CountingAllocator::get(), kKeys,
                                   c10::dtype_or_default(dtype), format);
}

at::Tensor empty_strided(at::IntArrayRef size, at::IntArrayRef stride,
                         std::optional<at::ScalarType> dtype, std::optional<at::Layout>,
                         std::optional<at::Device> device, std::optional<bool>) {
  const c10::OptionalDeviceGuard guard(device);
  return at::detail::empty_strided_generic(size, stride, &CountingAllocator::get(), kKeys,
                                           c10::dtype_or_default(dtype));
}

// A CPU tensor over a fake tensor's memory (same sizes, strides, offset): what the copy kernel
// reads and writes. CPU tensors pass through.
at::Tensor host_alias(const at::Tensor& t) {
  if (t.device().type() != kType) return t;
  c10::Storage storage(c10::Storage::use_byte_size_t(), t.storage().nbytes(),
                       at::DataPtr(t.storage().mutable_data(), c10::Device(DeviceType::CPU)),
                       /*allocator=*/nullptr, /*resizable=*/false);
  return at::empty({0}, t.options().device(at::kCPU))
      .set_(storage, t.storage_offset(), t.sizes(), t.strides());
}

at::Tensor copy_from(const at::Tensor& self, const at::Tensor& dst, bool non_blocking) {
  TORCH_CHECK(self.device().type() == kType || self.is_cpu(), "fake device: cannot copy from ",
              self.device());
  TORCH_CHECK(dst.device().type() == kType || dst.is_cpu(), "fake device: cannot copy to ",
              dst.device());
  if (self.device().type() == kType && dst.is_cpu() && t_in_fallback == 0 &&
      !comm::staging_copy()) {
    // A non_blocking copy into page-locked memory is queued on a GPU (the host waits only if it
    // reads the result before an event says so); any other copy to the host waits for the device.
    const bool queued = non_blocking && PinnedAllocator::get().pinned(dst.storage().data());
    if (queued) {
      g_async_copies[index_of(self.device())].fetch_add(1);
    } else {
      count_read(index_of(self.device()));
    }
  }
  host_alias(dst).copy_(host_alias(self));
  return dst;
}

const at::Tensor& resize_kernel(const at::Tensor& self, at::IntArrayRef size,
                                std::optional<at::MemoryFormat> format) {
  at::TensorImpl* impl = self.unsafeGetTensorImpl();
  impl->set_sizes_contiguous(size);
  const auto bytes = at::detail::computeStorageNbytesContiguous(size, impl->dtype().itemsize(),
                                                                impl->storage_offset());
  // Grows through the storage's own allocator (the counting one), with the device current.
  const c10::DeviceGuard guard(self.device());
  at::native::maybe_resize_storage_cpu(impl, bytes);
  if (format) {
    TORCH_CHECK(*format != at::MemoryFormat::Preserve, "fake device: resize_ with Preserve");
    impl->empty_tensor_restride(*format);
  }
  return self;
}

at::Tensor copy_from_and_resize(const at::Tensor& self, const at::Tensor& dst) {
  resize_kernel(dst, self.sizes(), std::nullopt);
  return copy_from(self, dst, false);
}

// Module::to(fake) moves parameters with set_data, which asks whether the new tensor's impl may
// be shallow-copied into the old one; TensorImpl's answer lists the in-tree dense backends only
// (CPU, CUDA, ...), so the backend answers for itself (out-of-tree backends such as Ascend's do
// the same): a dense CPU or fake tensor may take a dense CPU or fake tensor's place.
bool compatible_shallow_copy(const at::Tensor& self, const at::Tensor& from) {
  const auto dense = [](const at::Tensor& t) {
    return t.layout() == at::kStrided && (t.is_cpu() || t.device().type() == kType);
  };
  return self.unsafeGetTensorImpl()->has_compatible_shallow_copy_type(from.key_set()) ||
         (dense(self) && dense(from));
}

// Operators whose result the host needs before it can go on (a value, or an output size that
// depends on the data): on a GPU each waits for the device.
bool reads_host(const c10::OperatorHandle& op) {
  static const std::unordered_set<std::string> names{
      "aten::_local_scalar_dense", "aten::equal",    "aten::nonzero",
      "aten::masked_select",       "aten::_unique2", "aten::unique_dim",
      "aten::unique_consecutive"};
  return names.count(op.schema().name()) > 0;
}

// The fake device an operator's arguments are on (the current one when none is).
DeviceIndex device_of(const c10::OperatorHandle& op, const torch::jit::Stack& stack) {
  const size_t n = op.schema().arguments().size();
  for (size_t i = stack.size() - std::min(n, stack.size()); i < stack.size(); ++i) {
    if (!stack[i].isTensor()) continue;
    const at::Tensor& t = stack[i].toTensor();
    if (t.defined() && t.device().type() == kType) return index_of(t.device());
  }
  return t_device;
}

void cpu_fallback(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  if (reads_host(op)) count_read(device_of(op, *stack));
  ++t_in_fallback;
  try {
    at::native::cpu_fallback(op, stack);
  } catch (...) {
    --t_in_fallback;
    throw;
  }
  --t_in_fallback;
}

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("empty.memory_format", &empty_memory_format);
  m.impl("empty_strided", &empty_strided);
  m.impl("_copy_from", &copy_from);
  m.impl("_copy_from_and_resize", &copy_from_and_resize);
  m.impl("resize_", &resize_kernel);
  // Views must alias the fake tensor's memory; the fallback would hand back a copy.
  m.impl("view", &at::native::view);
  m.impl("as_strided", &at::native::as_strided_tensorimpl);
  m.impl("_reshape_alias", &at::native::_reshape_alias);
  m.impl("_has_compatible_shallow_copy_type", &compatible_shallow_copy);
}

TORCH_LIBRARY_IMPL(_, PrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&cpu_fallback>());
}

C10_REGISTER_GUARD_IMPL(PrivateUse1, FakeGuard);

bool register_backend() {
  c10::register_privateuse1_backend("fake");
  c10::SetAllocator(kType, &CountingAllocator::get());
  device::register_page_locker(kType,
                               {&PinnedAllocator::allocate_exact, &PinnedAllocator::release_exact});
  static FakeHooks hooks;
  at::RegisterPrivateUse1HooksInterface(&hooks);
  return true;
}
const bool g_registered = register_backend();

}  // namespace

c10::Device device(int index) {
  TORCH_CHECK(g_registered && index >= 0 && index < kDevices, "fake device: no device ", index);
  return {kType, static_cast<DeviceIndex>(index)};
}

int64_t allocated_bytes(int index) {
  return CountingAllocator::get()
      .getDeviceStats(static_cast<DeviceIndex>(index))
      .allocated_bytes[static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE)]
      .current;
}

int64_t peak_bytes(int index) {
  return CountingAllocator::get()
      .getDeviceStats(static_cast<DeviceIndex>(index))
      .allocated_bytes[static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE)]
      .peak;
}

void reset_peak(int index) {
  CountingAllocator::get().resetPeakStats(static_cast<DeviceIndex>(index));
}

int64_t allocations(int index, int64_t bytes) {
  return CountingAllocator::get().allocations(static_cast<DeviceIndex>(index), bytes);
}

void add_alloc_retries(int index, int64_t n) {
  CountingAllocator::get().add_alloc_retries(static_cast<DeviceIndex>(index), n);
}

int64_t pinned_bytes() { return PinnedAllocator::get().reserved(); }
int64_t pinned_in_use_bytes() { return PinnedAllocator::get().in_use(); }
int64_t pinned_allocations() { return PinnedAllocator::get().allocations(); }

void fail_allocations_from(int index, int64_t bytes) {
  g_fail_from.at(static_cast<size_t>(index)).store(bytes);
}

void fail_allocations_after(int index, int64_t count) {
  g_fail_after.at(static_cast<size_t>(index)).store(count < 0 ? 0 : count + 1);
}

void fail_pinned_from(int64_t bytes) { t_pinned_fail_from = bytes; }

void set_event_delay(std::chrono::microseconds delay) { g_event_delay_us = delay.count(); }

int64_t host_reads(int index) { return g_host_reads.at(static_cast<size_t>(index)).load(); }
int64_t async_host_copies(int index) {
  return g_async_copies.at(static_cast<size_t>(index)).load();
}

}  // namespace zero::testing::fake
