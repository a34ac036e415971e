#include "zero/compress/host_room.hpp"

#include <unistd.h>

#include <fstream>
#include <sstream>

namespace zero::compress {
namespace {

thread_local int64_t t_test_available = 0;

std::string gib(int64_t bytes) {
  constexpr double kMiB = 1024.0 * 1024.0, kGiB = 1024.0 * kMiB;
  std::ostringstream os;
  os.precision(3);
  if (bytes >= kGiB) {
    os << static_cast<double>(bytes) / kGiB << " GiB";
  } else if (bytes >= kMiB) {
    os << static_cast<double>(bytes) / kMiB << " MiB";
  } else {
    os << bytes << " bytes";
  }
  return os.str();
}

}  // namespace

void set_host_available_for_testing(int64_t bytes) { t_test_available = bytes; }

int64_t host_available_bytes() {
  if (t_test_available > 0) return t_test_available;
  std::ifstream meminfo("/proc/meminfo");
  std::string key;
  int64_t kib = 0;
  std::string unit;
  while (meminfo >> key >> kib) {
    std::getline(meminfo, unit);
    if (key == "MemAvailable:") return kib * 1024;
  }
  const long pages = sysconf(_SC_AVPHYS_PAGES), page = sysconf(_SC_PAGESIZE);
  return pages > 0 && page > 0 ? static_cast<int64_t>(pages) * page : 0;
}

std::string host_room_error(const HostRoom& room, const std::string& store, int64_t int8_bytes) {
  if (room.fits()) return "";
  std::string s =
      "zero: zero_optimization.zero_quantized_gradients_error_feedback at ZeRO stage 3 "
      "keeps each rank's residual of the whole gradient in page-locked host memory: " +
      gib(room.per_rank) + " per rank as " + store + " (zero_quantized_gradients_" +
      "error_feedback_dtype), x " + std::to_string(room.local_ranks) +
      " ranks on this node = " + gib(room.per_rank * room.local_ranks) + ", but the host has " +
      gib(room.available) +
      " available (MemAvailable). Fix: set zero_optimization."
      "zero_quantized_gradients_error_feedback_dtype: int8";
  if (store != "int8") s += " (" + gib(int8_bytes * room.local_ranks) + " on this node)";
  s += ", or zero_quantized_gradients_error_feedback: false (no residual; the quantization error "
       "is then not fed back), or zero_optimization.stage: 2 (the residual on the device "
       "instead), or fewer ranks per node";
  return s;
}

}  // namespace zero::compress
