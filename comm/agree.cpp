#include "comm/agree.hpp"

#include <ATen/ATen.h>

#include <cstring>

#include "comm/group.hpp"

namespace zero::comm {

at::Tensor gather_status(Group& g, const at::Tensor& status, const std::string& what) {
  TORCH_CHECK(status.dim() == 1 && status.scalar_type() == at::kLong, "zero: ", what,
              ": a status is a 1-D int64 tensor, got ", status.sizes(), " ", status.scalar_type());
  at::Tensor mine = status.contiguous();
  at::Tensor all = at::empty({g.size() * mine.numel()}, mine.options());
  g.all_gather(all, mine, "all_gather of " + what).wait();
  // The host read orders after the gather on a device (NCCL's wait() only orders the stream).
  return all.cpu().view({g.size(), mine.numel()});
}

std::string broadcast_text(Group& g, const std::string& text, int root, const c10::Device& device,
                           const std::string& what) {
  if (g.size() == 1) return text;
  at::Tensor len = at::full({1}, static_cast<int64_t>(text.size()),
                            at::TensorOptions().dtype(at::kLong).device(device));
  g.broadcast(len, root, "broadcast of the length of " + what).wait();
  const int64_t n = len.cpu().item<int64_t>();
  if (n == 0) return "";
  at::Tensor bytes = at::zeros({n}, at::kByte);
  if (g.rank() == root) std::memcpy(bytes.data_ptr(), text.data(), static_cast<size_t>(n));
  at::Tensor dev = bytes.to(device);
  g.broadcast(dev, root, "broadcast of " + what).wait();
  dev = dev.cpu();
  return std::string(static_cast<const char*>(dev.data_ptr()), static_cast<size_t>(n));
}

std::string agree_errors(Group& g, const std::string& error, const c10::Device& device,
                         const std::string& what) {
  if (g.size() == 1) return error.empty() ? "" : "rank 0: " + error;
  const at::Tensor mine = at::full({1}, static_cast<int64_t>(error.size()),
                                   at::TensorOptions().dtype(at::kLong).device(device));
  const at::Tensor all = gather_status(g, mine, what + " status");
  std::string out;
  for (int r = 0; r < g.size(); ++r) {
    if (all[r][0].item<int64_t>() == 0) continue;
    const std::string text = broadcast_text(g, g.rank() == r ? error : "", r, device, what);
    out += (out.empty() ? "" : "; ") + ("rank " + std::to_string(r) + ": ") + text;
  }
  return out;
}

}  // namespace zero::comm
