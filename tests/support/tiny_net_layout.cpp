#include "support/tiny_net_layout.hpp"

#include <vector>

#include "support/tiny_net.hpp"

namespace zero::testing {

FlatLayout tiny_net_layout(int shards, int64_t bucket) {
  auto net = make_tiny_net(0);
  std::vector<ParamSpec> specs;
  auto named = net->named_parameters();
  for (auto it = named.end(); it != named.begin();) {
    --it;
    specs.push_back({it->key(), it->value().numel()});
  }
  return FlatLayout::build(specs, bucket, shards, /*align=*/64);
}

}  // namespace zero::testing
