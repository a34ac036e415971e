#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <cstring>
#include <map>
#include <mutex>
#include <sstream>

#include "device/pinned_host.hpp"
#include "zero/engine/engine_checkpoint.hpp"

namespace zero::ckpt {
namespace {

at::TensorOptions on_device(const Engine::Impl& m, at::ScalarType t) {
  return at::TensorOptions().dtype(t).device(m.fp.device());
}

std::string to_text(double v) {
  std::ostringstream os;
  os.precision(17);
  os << v;
  return os.str();
}

}  // namespace

void agree(Engine::Impl& m, const std::string& error, const std::string& what) {
  comm::Group& g = *m.group;
  const int n = g.size();
  if (n == 1) {
    if (!error.empty()) throw CheckpointError("zero: " + what + " failed: " + error);
    return;
  }
  at::Tensor mine = at::full({1}, static_cast<int64_t>(error.size()), on_device(m, at::kLong));
  at::Tensor all = at::empty({n}, mine.options());
  g.all_gather(all, mine, "all_gather of the " + what + " status").wait();
  all = all.cpu();
  const int64_t* len = all.data_ptr<int64_t>();
  int root = -1;
  for (int r = 0; r < n && root < 0; ++r) {
    if (len[r] > 0) root = r;
  }
  if (root < 0) return;
  const std::string text = broadcast_string(m, error, root);
  throw CheckpointError("zero: " + what + " failed on rank " + std::to_string(root) + " of " +
                        std::to_string(n) + " (every rank stops): " + text);
}

at::Tensor checkpoint_staging(Engine::Impl& m, int64_t numel) {
  at::Tensor& s = m.checkpoint_staging;
  if (!s.defined() || s.numel() < numel) s = device::host_zeros(numel, /*pin=*/true);
  return s;
}

std::string broadcast_string(Engine::Impl& m, const std::string& text, int root) {
  comm::Group& g = *m.group;
  if (g.size() == 1) return text;
  at::Tensor len = at::full({1}, static_cast<int64_t>(text.size()), on_device(m, at::kLong));
  g.broadcast(len, root, "broadcast of a checkpoint string's length").wait();
  const int64_t n = len.cpu().item<int64_t>();
  if (n == 0) return "";
  at::Tensor bytes = at::empty({n}, at::kByte);
  if (g.rank() == root) std::memcpy(bytes.data_ptr(), text.data(), text.size());
  at::Tensor dev = bytes.to(m.fp.device());
  g.broadcast(dev, root, "broadcast of a checkpoint string").wait();
  dev = dev.cpu();
  return std::string(static_cast<const char*>(dev.data_ptr()), static_cast<size_t>(n));
}

std::vector<CheckpointParam> current_params(const Engine::Impl& m) {
  std::map<std::string, const TensorPart*> parts;
  for (const TensorPart& p : m.groups.parts) parts[p.name] = &p;
  std::vector<CheckpointParam> out;
  for (int li : m.fp.layout_of_named) {
    if (li < 0) continue;
    // The layout's shape: at stage 3 a released parameter is a 0-element tensor.
    const std::vector<int64_t>& shape = m.param_shapes[li];
    const std::string& name = m.fp.layout.params()[li].name;
    // Whole unless groups.parts says where this rank's block lies in the model's tensor.
    CheckpointParam cp{name, shape, shape, std::vector<int64_t>(shape.size(), 0)};
    const auto it = parts.find(name);
    if (it != parts.end()) {
      const TensorPart& part = *it->second;
      bool inside = part.global_shape.size() == shape.size() && part.offset.size() == shape.size();
      for (size_t d = 0; inside && d < shape.size(); ++d) {
        inside = part.offset[d] >= 0 && part.offset[d] + shape[d] <= part.global_shape[d];
      }
      ZERO_CKPT_CHECK(inside, "zero: groups.parts: parameter '", name, "' of shape ",
                      c10::IntArrayRef(shape), " does not fit at offset ",
                      c10::IntArrayRef(part.offset), " into global shape ",
                      c10::IntArrayRef(part.global_shape),
                      "; make the parts with tensor_parallel::checkpoint_parts");
      cp.global_shape = part.global_shape;
      cp.offset = part.offset;
      parts.erase(it);
    }
    out.push_back(std::move(cp));
  }
  ZERO_CKPT_CHECK(parts.empty(), "zero: groups.parts names '",
                  parts.empty() ? "" : parts.begin()->first,
                  "', which is not a trainable parameter of the model");
  return out;
}

std::string current_dtype(const Engine::Impl& m) { return dtype_name(m.cfg.param_dtype()); }

namespace {

// Through at::Context, as zero::checkpoint does: no CUDA code here, and CUDA builds get the CUDA
// generator of the engine's device.
std::string generator_state(c10::Device device) {
  at::Generator gen = at::globalContext().defaultGenerator(device);
  std::lock_guard<std::mutex> lock(gen.mutex());
  at::Tensor s = gen.get_state();
  return std::string(static_cast<const char*>(s.data_ptr()), static_cast<size_t>(s.nbytes()));
}

void set_generator_state(c10::Device device, const std::string& bytes, const std::string& source) {
  at::Tensor s = at::empty({static_cast<int64_t>(bytes.size())}, at::kByte);
  std::memcpy(s.data_ptr(), bytes.data(), bytes.size());
  at::Generator gen = at::globalContext().defaultGenerator(device);
  std::lock_guard<std::mutex> lock(gen.mutex());
  try {
    gen.set_state(s);
  } catch (const std::exception& e) {
    fail(source, ": the saved ", device.str(),
         " random-generator state does not fit this LibTorch (", message_of(e),
         "); load it with the LibTorch version that saved it");
  }
}

// A device generator's state follows the CPU one's, then the CPU state's length and this tag.
// Files without the tag (CPU runs, and files written before devices were saved) hold only the
// CPU state.
constexpr char kDeviceRngTag[] = "ZRNGDEV1";
constexpr size_t kTagBytes = sizeof(kDeviceRngTag) - 1;

}  // namespace

std::string rng_state(c10::Device device) {
  std::string out = generator_state(c10::Device(c10::kCPU));
  if (device.is_cpu()) return out;
  const uint64_t cpu_bytes = out.size();
  out += generator_state(device);
  out.append(reinterpret_cast<const char*>(&cpu_bytes), sizeof(cpu_bytes));
  out.append(kDeviceRngTag, kTagBytes);
  return out;
}

void set_rng_state(const std::string& bytes, c10::Device device, const std::string& source) {
  const size_t trailer = sizeof(uint64_t) + kTagBytes;
  if (bytes.size() < trailer ||
      bytes.compare(bytes.size() - kTagBytes, kTagBytes, kDeviceRngTag) != 0) {
    set_generator_state(c10::Device(c10::kCPU), bytes, source);
    return;
  }
  uint64_t cpu_bytes = 0;
  std::memcpy(&cpu_bytes, bytes.data() + bytes.size() - trailer, sizeof(cpu_bytes));
  if (cpu_bytes > bytes.size() - trailer) fail(source, ": corrupted random-generator state");
  set_generator_state(c10::Device(c10::kCPU), bytes.substr(0, cpu_bytes), source);
  // A CPU run resuming a GPU run has no device generator to restore.
  if (!device.is_cpu()) {
    set_generator_state(device, bytes.substr(cpu_bytes, bytes.size() - trailer - cpu_bytes),
                        source);
  }
}

std::vector<std::pair<std::string, std::string>> config_values(const Config& c) {
  const auto& o = c.optimizer;
  const auto& s = c.scheduler;
  std::vector<std::pair<std::string, std::string>> v = {
      {"zero_optimization.stage", std::to_string(c.zero_optimization.stage)},
      {"zero_optimization.reduce_bucket_size",
       std::to_string(c.zero_optimization.reduce_bucket_size)},
      {"train_batch_size", std::to_string(c.train_batch_size)},
      {"train_micro_batch_size_per_gpu", std::to_string(c.train_micro_batch_size_per_gpu)},
      {"gradient_accumulation_steps", std::to_string(c.gradient_accumulation_steps)},
      {"gradient_clipping", to_text(c.gradient_clipping)},
      {"param_dtype", dtype_name(c.param_dtype())},
      {"optimizer.type", o.type},
      {"optimizer.lr", to_text(o.lr)},
      {"optimizer.betas", to_text(o.beta1) + "," + to_text(o.beta2)},
      {"optimizer.eps", to_text(o.eps)},
      {"optimizer.weight_decay", to_text(o.weight_decay)},
      {"optimizer.momentum", to_text(o.momentum)},
      {"scheduler.type", s.type},
      {"scheduler.warmup_num_steps", std::to_string(s.warmup_num_steps)},
      {"scheduler.total_num_steps", std::to_string(s.total_num_steps)},
      {"seed", std::to_string(c.seed)},
  };
  for (const auto& [k, val] : c.extra) v.emplace_back(k, val);
  return v;
}

}  // namespace zero::ckpt
