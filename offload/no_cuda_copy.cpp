// Built when LibTorch has no CUDA: only host tensors can be offloaded.
#include <c10/util/Exception.h>

#include "offload/copy_engine.hpp"

namespace zero::offload_detail {

std::unique_ptr<CopyEngine> make_copy_engine(c10::Device device) {
  TORCH_CHECK(device.is_cpu(), "ActivationOffloader: cannot offload tensors on ", device,
              ": zero was built against a LibTorch without CUDA. Rebuild against a CUDA wheel, "
              "or checkpoint without CheckpointOptions::offload.");
  return make_host_copy_engine();
}

}  // namespace zero::offload_detail
