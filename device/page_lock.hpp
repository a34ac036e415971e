// The page locker a device family brings with it: exactly one of page_lock_cuda.cpp (CUDA builds)
// and page_lock_none.cpp (the others) is compiled, so pinned_host.cpp needs no #ifdef.
#pragma once

#include <c10/core/DeviceType.h>

#include <optional>

#include "device/pinned_host.hpp"

namespace zero::device::detail {

std::optional<PageLocker> builtin_page_locker(c10::DeviceType type);

}  // namespace zero::device::detail
