#include "zero/deferred_init.hpp"

#include <ATen/ATen.h>
#include <torch/nn/module.h>

#include <limits>
#include <map>
#include <mutex>
#include <tuple>
#include <unordered_set>

namespace zero {

namespace {

struct Placeholders {
  std::mutex mutex;
  // One 0-d NaN per device and dtype, kept for the process: every deferred parameter on that
  // device is an expansion of it (a NaN, so a forward run before initialize shows at once).
  std::map<std::tuple<int, int, int>, at::Tensor> by_kind;
  std::unordered_set<const c10::StorageImpl*> storages;
};

Placeholders& placeholders() {
  static Placeholders p;
  return p;
}

at::Tensor placeholder(const c10::Device& device, at::ScalarType dtype) {
  Placeholders& p = placeholders();
  std::lock_guard<std::mutex> lock(p.mutex);
  const auto key = std::make_tuple(static_cast<int>(device.type()), static_cast<int>(device.index()),
                                   static_cast<int>(dtype));
  auto it = p.by_kind.find(key);
  if (it == p.by_kind.end()) {
    at::Tensor t = at::full({}, std::numeric_limits<double>::quiet_NaN(),
                            at::TensorOptions().dtype(dtype).device(device));
    p.storages.insert(t.storage().unsafeGetStorageImpl());
    it = p.by_kind.emplace(key, std::move(t)).first;
  }
  return it->second;
}

}  // namespace

bool is_deferred(const at::Tensor& t) {
  if (!t.defined() || !t.has_storage()) return false;
  Placeholders& p = placeholders();
  std::lock_guard<std::mutex> lock(p.mutex);
  return p.storages.count(t.storage().unsafeGetStorageImpl()) != 0;
}

void defer_parameters(torch::nn::Module& module, const c10::Device& device) {
  at::NoGradGuard no_grad;
  for (at::Tensor& p : module.parameters(/*recurse=*/true)) {
    if (is_deferred(p)) continue;
    // set_data keeps the tensor object (the module's member, its requires_grad) and its shape.
    p.set_data(placeholder(device, p.scalar_type()).expand(p.sizes()));
  }
  for (at::Tensor& b : module.buffers(/*recurse=*/true)) {
    if (b.defined() && b.device() != device) b.set_data(b.to(device));
  }
}

}  // namespace zero
