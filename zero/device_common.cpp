#include <malloc.h>

#include <string>

#include "zero/device.hpp"

namespace zero {

int64_t host_allocated_bytes() {
  const struct mallinfo2 mi = mallinfo2();
  return static_cast<int64_t>(mi.uordblks + mi.hblkhd);
}

double known_peak_flops(const std::string& name) {
  // Dense (not sparse) bf16 tensor-core peaks from the vendors' data sheets.
  struct Entry {
    const char* tag;
    double flops;
  };
  static const Entry table[] = {{"H200", 989e12}, {"H100", 989e12}, {"A100", 312e12},
                                {"L40S", 362e12}, {"A10", 125e12},  {"V100", 125e12}};
  for (const Entry& e : table) {
    if (name.find(e.tag) != std::string::npos) return e.flops;
  }
  return 0;
}

}  // namespace zero
