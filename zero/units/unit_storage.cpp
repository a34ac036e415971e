#include "zero/units/unit_storage.hpp"

#include <ATen/ATen.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/StorageImpl.h>
#include <c10/util/Exception.h>

#include <utility>

#include "zero/host_counting.hpp"

namespace zero::units {

UnitStorage::UnitStorage(at::Tensor buffer, std::vector<Param> params)
    : buffer_(std::move(buffer)), params_(std::move(params)) {
  TORCH_CHECK(buffer_.defined() && buffer_.dim() == 1 && buffer_.is_contiguous() &&
                  buffer_.storage_offset() == 0,
              "zero: a unit's buffer must be a contiguous 1-D tensor that owns its storage");
  nbytes_ = buffer_.numel() * static_cast<int64_t>(buffer_.element_size());
  const auto held = static_cast<int64_t>(buffer_.storage().nbytes());
  // A buffer whose bytes were given back before the unit was made (a deferred start-up fills
  // only the shard) starts released.
  const bool released = held == 0 && nbytes_ > 0;
  TORCH_CHECK(released || held == nbytes_, "zero: a unit's buffer must span its whole storage (",
              held, " bytes for ", buffer_.numel(), " elements)");
  shapes_.reserve(params_.size());
  for (const Param& p : params_) {
    TORCH_CHECK(p.tensor.defined() && p.tensor.scalar_type() == buffer_.scalar_type() &&
                    p.tensor.device() == buffer_.device(),
                "zero: a unit's parameter must have its buffer's dtype and device");
    TORCH_CHECK(p.offset >= 0 && p.offset + p.tensor.numel() <= buffer_.numel(),
                "zero: a unit's parameter [", p.offset, ", ", p.offset + p.tensor.numel(),
                ") lies outside its buffer of ", buffer_.numel(), " elements");
    shapes_.emplace_back(p.tensor.sizes().vec());
  }
  if (!released) {
    view_params();
    return;
  }
  const at::Tensor empty = at::empty({0}, buffer_.options());
  for (Param& p : params_) p.tensor.set_data(empty);
  allocated_ = false;
}

void UnitStorage::release() {
  if (!allocated_) return;
  const at::Tensor empty = at::empty({0}, buffer_.options());
  // Parameters first: none of them may be left a view of bytes about to go.
  for (Param& p : params_) p.tensor.set_data(empty);
  c10::StorageImpl* storage = buffer_.storage().unsafeGetStorageImpl();
  // The old DataPtr's deleter hands the bytes back to their allocator (the CUDA caching
  // allocator: to its pool, on the stream they were allocated on). The empty DataPtr keeps the
  // device, which the StorageImpl reports as its own.
  storage->set_data_ptr_noswap(at::DataPtr(nullptr, buffer_.device()));
  storage->set_nbytes(0);
  allocated_ = false;
}

void UnitStorage::allocate() {
  if (allocated_) return;
  c10::StorageImpl* storage = buffer_.storage().unsafeGetStorageImpl();
  at::Allocator* allocator = storage->allocator();
  TORCH_CHECK(allocator != nullptr, "zero: a unit's buffer has no allocator to refill it from");
  // Device allocators (CUDA's caching allocator, the fake device's) allocate on the current
  // device, which need not be the buffer's (rank threads, a model on device 1).
  c10::OptionalDeviceGuard guard;
  if (!buffer_.is_cpu()) guard.reset_device(buffer_.device());
  const HostCountingAllocator::Tag tag(HostTag::kGathered);  // what a CPU peak is made of
  at::DataPtr bytes = allocator->allocate(static_cast<size_t>(nbytes_));
  TORCH_CHECK(bytes.device() == buffer_.device(), "zero: a unit's buffer on ", buffer_.device(),
              " was refilled on ", bytes.device());
  storage->set_data_ptr_noswap(std::move(bytes));
  storage->set_nbytes(static_cast<size_t>(nbytes_));
  allocated_ = true;
}

void UnitStorage::view_params() {
  TORCH_CHECK(allocated_, "zero: a unit's parameters were viewed while its buffer is released");
  for (size_t i = 0; i < params_.size(); ++i) {
    const auto& shape = shapes_[i];
    int64_t numel = 1;
    for (int64_t d : shape) numel *= d;
    params_[i].tensor.set_data(buffer_.narrow(0, params_[i].offset, numel).view(shape));
  }
}

}  // namespace zero::units
