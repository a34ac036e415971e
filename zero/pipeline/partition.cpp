#include "zero/pipeline/partition.hpp"

#include <algorithm>
#include <numeric>
#include <stdexcept>
#include <string>

namespace zero::pipeline {
namespace {

void check(int items, int parts) {
  if (parts < 1)
    throw std::invalid_argument("pipeline.stages is " + std::to_string(parts) +
                                "; it must be at least 1");
  if (items < parts)
    throw std::invalid_argument("pipeline: " + std::to_string(items) + " layers cannot fill " +
                                std::to_string(parts) +
                                " stages (every stage needs a layer; use fewer stages)");
}

// The fewest parts a greedy left-to-right cut needs so that no part weighs more than `cap`.
int parts_needed(const std::vector<int64_t>& w, int64_t cap) {
  int parts = 1;
  int64_t sum = 0;
  for (int64_t x : w) {
    if (sum + x > cap) {
      ++parts;
      sum = 0;
    }
    sum += x;
  }
  return parts;
}

}  // namespace

std::string_view partition_method_name(PartitionMethod m) {
  switch (m) {
    case PartitionMethod::Uniform:
      return "uniform";
    case PartitionMethod::Compute:
      return "compute";
    case PartitionMethod::Parameters:
      break;
  }
  return "parameters";
}

PartitionMethod parse_partition_method(std::string_view name) {
  if (name == "uniform") return PartitionMethod::Uniform;
  if (name == "parameters") return PartitionMethod::Parameters;
  if (name == "compute") return PartitionMethod::Compute;
  throw std::invalid_argument("pipeline.partition: unknown method '" + std::string(name) +
                              "' (choose parameters, compute or uniform)");
}

std::vector<int> partition_uniform(int items, int parts) {
  check(items, parts);
  // As ds_utils.partition_uniform: chunks of items / parts, the first items % parts one longer.
  const int chunk = items / parts, residual = items % parts;
  std::vector<int> bounds(parts + 1, 0);
  for (int p = 0; p < parts; ++p) bounds[p + 1] = bounds[p] + chunk + (p < residual ? 1 : 0);
  return bounds;
}

std::vector<int> partition_balanced(const std::vector<int64_t>& weights, int parts) {
  const int items = static_cast<int>(weights.size());
  check(items, parts);
  for (int64_t w : weights)
    if (w < 0) throw std::invalid_argument("pipeline: a layer's weight is negative");
  // The smallest cap on a part's weight that `parts` contiguous parts can meet (the linear
  // partition problem ds_utils.partition_balanced solves), by bisection on the cap.
  int64_t lo = *std::max_element(weights.begin(), weights.end());
  int64_t hi = std::accumulate(weights.begin(), weights.end(), int64_t{0});
  while (lo < hi) {
    int64_t mid = lo + (hi - lo) / 2;
    if (parts_needed(weights, mid) <= parts)
      hi = mid;
    else
      lo = mid + 1;
  }
  // Cut greedily under that cap, but leave at least one layer for each part still to come, so
  // that no stage is empty (a zero-weight layer could otherwise let a part swallow the rest).
  std::vector<int> bounds{0};
  int64_t sum = 0;
  for (int i = 0; i < items; ++i) {
    const int parts_left = parts - static_cast<int>(bounds.size());  // after the current one
    const bool must_cut = items - i == parts_left;
    const bool over_cap = sum + weights[i] > lo;
    if (i > bounds.back() && parts_left > 0 && (must_cut || over_cap)) {
      bounds.push_back(i);
      sum = 0;
    }
    sum += weights[i];
  }
  bounds.push_back(items);
  return bounds;
}

std::vector<int> partition_layers(PartitionMethod method, const std::vector<int64_t>& weights,
                                  int parts) {
  if (method == PartitionMethod::Uniform)
    return partition_uniform(static_cast<int>(weights.size()), parts);
  return partition_balanced(weights, parts);
}

}  // namespace zero::pipeline
