#include "zero/tensor_parallel/shard.hpp"

#include <ATen/ATen.h>

#include <stdexcept>

namespace zero::tensor_parallel {

int64_t divide(int64_t total, int64_t parts, const std::string& what) {
  if (parts <= 0 || total % parts != 0) {
    throw std::invalid_argument(
        "zero: " + what + " = " + std::to_string(total) +
        " is not divisible by the tensor-parallel size " + std::to_string(parts) +
        " (each rank holds an equal part); choose a multiple of " + std::to_string(parts) +
        " or a tensor-parallel size that divides " + std::to_string(total));
  }
  return total / parts;
}

at::Tensor shard_of(const at::Tensor& full, int64_t dim, int rank, int parts,
                    const std::string& what) {
  const int64_t part = divide(full.size(dim), parts, what);
  return full.narrow(dim, rank * part, part);
}

}  // namespace zero::tensor_parallel
