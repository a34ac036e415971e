#include <ATen/ATen.h>

#include "device/copy_engine.hpp"

namespace zero::device {
namespace {

class HostCopyEngine final : public CopyEngine {
 public:
  // Clones rather than aliasing, so that on CPU the "host copy" and the "device copy" are
  // distinct buffers, as they are on a GPU: tests then catch code that writes into one and
  // expects to see it in the other.
  Copy to_host_async(const at::Tensor& src) override {
    return {src.clone(at::MemoryFormat::Contiguous), nullptr};
  }
  Copy to_device_async(const at::Tensor& host) override {
    return {host.clone(at::MemoryFormat::Contiguous), nullptr};
  }
  // The plain copy: the host is the device, and the copy is done when this returns.
  Ticket copy_into_host(const at::Tensor& dst, const at::Tensor& src) override {
    dst.copy_(src);
    return nullptr;
  }
  Ticket copy_to_device(const at::Tensor& dst, const at::Tensor& src) override {
    dst.copy_(src);
    return nullptr;
  }
  void wait(const Ticket&) override {}
  bool ready(const Ticket&) override { return true; }
  void synchronize(const Ticket&) override {}
};

}  // namespace

std::unique_ptr<CopyEngine> make_host_copy_engine() { return std::make_unique<HostCopyEngine>(); }

}  // namespace zero::device
