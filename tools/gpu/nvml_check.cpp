// A GPU-machine check of the NVML utilisation zero-train reports (examples/nvml.cpp), against
// nvidia-smi's own reading: samples both every 0.5 s while the caller loads and unloads the GPU.
//   g++ -std=c++20 -O2 -Iexamples tools/gpu/nvml_check.cpp examples/nvml.cpp -ldl -o nvml_check
//   ./nvml_check 16    # 16 samples; run a GPU load beside it for part of that time
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "nvml.hpp"

int main(int argc, char** argv) {
  const int n = argc > 1 ? std::atoi(argv[1]) : 10;
  zero::examples::NvmlUtilisation nvml(0);
  if (!nvml.available()) {
    std::printf("NVML unavailable: %s\n", nvml.error().c_str());
    return 1;
  }
  for (int i = 0; i < n; ++i) {
    const double ours = nvml.sample();
    std::string smi = "?";
    if (FILE* p = ::popen(
            "nvidia-smi --query-gpu=utilization.gpu --format=csv,noheader,nounits -i 0", "r")) {
      char buf[64] = {};
      if (std::fgets(buf, sizeof buf, p)) smi = buf;
      ::pclose(p);
      while (!smi.empty() && (smi.back() == '\n' || smi.back() == ' ')) smi.pop_back();
    }
    std::printf("sample %2d: zero %5.1f%%  nvidia-smi %s%%\n", i, 100 * ours, smi.c_str());
    std::fflush(stdout);
    ::usleep(500000);
  }
  return 0;
}
