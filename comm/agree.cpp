#include "comm/agree.hpp"

#include <ATen/ATen.h>

#include <algorithm>
#include <cstring>
#include <vector>

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

Agreement::Agreement(Group& g, const c10::Device& device) : g_(g) {
  if (g.size() == 1) return;
  const at::TensorOptions longs = at::TensorOptions().dtype(at::kLong).device(device);
  mine_ = at::empty({1}, longs);
  all_ = at::empty({g.size()}, longs);
  chunk_ = at::empty({kChunkBytes}, longs.dtype(at::kByte));
}

std::vector<int64_t> Agreement::gather(int64_t value, const std::string& what) {
  if (g_.size() == 1) return {value};
  mine_.copy_(at::full({1}, value, at::kLong));
  g_.all_gather(all_, mine_, "all_gather of " + what).wait();
  // The host read orders after the gather on a device (NCCL's wait() only orders the stream).
  const at::Tensor all = all_.cpu().contiguous();
  const int64_t* v = all.data_ptr<int64_t>();
  return {v, v + g_.size()};
}

std::string Agreement::errors(const std::string& error, const std::string& what) {
  if (g_.size() == 1) return error.empty() ? "" : "rank 0: " + error;
  std::string text = error;
  if (static_cast<int64_t>(text.size()) > kMaxTextBytes) {
    const std::string cut = " [...]";
    text.resize(static_cast<size_t>(kMaxTextBytes) - cut.size());
    text += cut;
  }
  // Copies into the buffers (no allocation on the device) from host tensors.
  mine_.copy_(at::full({1}, static_cast<int64_t>(text.size()), at::kLong));
  g_.all_gather(all_, mine_, "all_gather of " + what + " status").wait();
  // The host read orders after the gather on a device (NCCL's wait() only orders the stream).
  const at::Tensor lengths = all_.cpu().contiguous();
  const int64_t* length = lengths.data_ptr<int64_t>();
  std::string out;
  int sent = 0;
  std::vector<int> more;  // failing ranks past kMaxTexts: named, their texts not sent
  for (int r = 0; r < g_.size(); ++r) {
    const int64_t n = length[r];
    if (n == 0) continue;
    // Every rank has the same lengths, so every rank stops sending at the same rank.
    if (sent == kMaxTexts) {
      more.push_back(r);
      continue;
    }
    ++sent;
    std::string got;
    for (int64_t off = 0; off < n; off += kChunkBytes) {
      const int64_t len = std::min(kChunkBytes, n - off);
      at::Tensor piece = chunk_.narrow(0, 0, len);
      if (g_.rank() == r) {
        piece.copy_(at::from_blob(const_cast<char*>(text.data()) + off, {len}, at::kByte));
      }
      g_.broadcast(piece, r, "broadcast of " + what).wait();
      const at::Tensor host = piece.cpu();
      got.append(static_cast<const char*>(host.data_ptr()), static_cast<size_t>(len));
    }
    out += (out.empty() ? "" : "; ") + ("rank " + std::to_string(r) + ": ") + got;
  }
  if (!more.empty()) {
    out += "; and " + std::to_string(more.size()) + " more rank" + (more.size() > 1 ? "s" : "") +
           " failed (";
    for (size_t i = 0; i < more.size() && i < kMaxNamedRanks; ++i) {
      out += (i > 0 ? ", " : "") + std::to_string(more[i]);
    }
    if (more.size() > kMaxNamedRanks) out += ", ...";
    out += ")";
  }
  return out;
}

std::string agree_errors(Group& g, const std::string& error, const c10::Device& device,
                         const std::string& what) {
  return Agreement(g, device).errors(error, what);
}

}  // namespace zero::comm
