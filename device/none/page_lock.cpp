#include "device/page_lock.hpp"

namespace zero::device::detail {

// No accelerator of this build's own: only registered backends page-lock exactly.
std::optional<PageLocker> builtin_page_locker(c10::DeviceType) { return std::nullopt; }

}  // namespace zero::device::detail
