#include "zero/units/unit_registry.hpp"

#include <torch/nn/module.h>

#include <map>
#include <mutex>
#include <utility>

#include "zero/sharding.hpp"
#include "zero/units/unit_runtime.hpp"

namespace zero::units {
namespace {

// A module's address can be reused once it is destroyed; the weak reference tells the two
// apart (a module not owned by a shared_ptr has none, and is taken at its address).
struct Key {
  std::weak_ptr<const torch::nn::Module> owner;
  bool owned = false;
  bool stale() const { return owned && owner.expired(); }
};

Key key_of(const torch::nn::Module& m) {
  Key k;
  k.owner = m.weak_from_this();
  k.owned = !k.owner.expired();
  return k;
}

struct Entry {
  Key key;
  bool marked = false;
  std::weak_ptr<UnitRuntime> runtime;
  int unit = -1;
};

std::mutex& registry_mutex() {
  static std::mutex m;
  return m;
}

std::map<const torch::nn::Module*, Entry>& entries() {
  static std::map<const torch::nn::Module*, Entry> e;
  return e;
}

// The live entry for `m`, dropping a stale one left by a destroyed module at the same address.
Entry* live(const torch::nn::Module& m) {
  auto& all = entries();
  auto it = all.find(&m);
  if (it == all.end()) return nullptr;
  if (it->second.key.stale()) {
    all.erase(it);
    return nullptr;
  }
  return &it->second;
}

Entry& live_or_new(const torch::nn::Module& m) {
  if (Entry* e = live(m)) return *e;
  Entry& e = entries()[&m];
  e.key = key_of(m);
  return e;
}

void erase_if_empty(const torch::nn::Module* m) {
  auto& all = entries();
  auto it = all.find(m);
  if (it != all.end() && !it->second.marked && it->second.runtime.expired()) all.erase(it);
}

}  // namespace

void mark(const torch::nn::Module& module) {
  std::lock_guard<std::mutex> lock(registry_mutex());
  live_or_new(module).marked = true;
}

bool marked(const torch::nn::Module& module) {
  std::lock_guard<std::mutex> lock(registry_mutex());
  const Entry* e = live(module);
  return e != nullptr && e->marked;
}

std::vector<std::string> marked_names(const torch::nn::Module& root) {
  std::vector<std::pair<std::string, const torch::nn::Module*>> modules;
  if (marked(root)) modules.emplace_back("", &root);
  for (const auto& item : root.named_modules(/*name_prefix=*/"", /*include_self=*/false)) {
    modules.emplace_back(item.key(), item.value().get());
  }
  std::vector<std::string> names;
  std::lock_guard<std::mutex> lock(registry_mutex());
  for (const auto& [name, m] : modules) {
    const Entry* e = live(*m);
    if (e != nullptr && e->marked) names.push_back(name);
  }
  return names;
}

void bind(const torch::nn::Module& module, const std::shared_ptr<UnitRuntime>& runtime, int unit) {
  std::lock_guard<std::mutex> lock(registry_mutex());
  Entry& e = live_or_new(module);
  e.runtime = runtime;
  e.unit = unit;
}

void unbind(const UnitRuntime& runtime) {
  std::lock_guard<std::mutex> lock(registry_mutex());
  auto& all = entries();
  for (auto it = all.begin(); it != all.end();) {
    Entry& e = it->second;
    const auto rt = e.runtime.lock();
    if (rt.get() == &runtime || e.runtime.expired()) {
      e.runtime.reset();
      e.unit = -1;
    }
    if (!e.marked && e.runtime.expired()) {
      it = all.erase(it);
    } else {
      ++it;
    }
  }
}

std::optional<Binding> find(const torch::nn::Module& module) {
  std::lock_guard<std::mutex> lock(registry_mutex());
  Entry* e = live(module);
  if (e == nullptr) return std::nullopt;
  auto rt = e->runtime.lock();
  if (!rt) {
    erase_if_empty(&module);
    return std::nullopt;
  }
  return Binding{std::move(rt), e->unit};
}

}  // namespace zero::units

namespace zero {

void shard(torch::nn::Module& module) { units::mark(module); }

bool is_sharded(const torch::nn::Module& module) { return units::marked(module); }

}  // namespace zero
