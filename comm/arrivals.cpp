#include "comm/arrivals.hpp"

#include <algorithm>

namespace zero::comm {

std::string arrival_entry(int rank, int world_size) {
  return std::to_string(rank) + ":" + std::to_string(world_size) + ",";
}

Arrivals parse_arrivals(const std::vector<uint8_t>& bytes, int world_size) {
  std::vector<bool> seen(static_cast<size_t>(std::max(world_size, 0)), false);
  Arrivals out;
  // Field 0 is the rank, field 1 the world size it was launched with. An entry without the
  // size ("2,", the older form) counts as an arrival that does not disagree.
  int64_t num[2] = {0, 0};
  bool digits[2] = {false, false};
  int field = 0;
  bool bad = false;
  for (uint8_t c : bytes) {
    if (c >= '0' && c <= '9') {
      num[field] = std::min<int64_t>(num[field] * 10 + (c - '0'), 1 << 30);
      digits[field] = true;
    } else if (c == ':' && field == 0) {
      field = 1;
    } else if (c == ',') {
      const bool sized = field == 1 && digits[1];
      if (!bad && digits[0] && (field == 0 || sized)) {
        const int r = static_cast<int>(num[0]);
        const int w = sized ? static_cast<int>(num[1]) : world_size;
        ++out.entries;
        if (w != world_size) {
          out.other_sizes.emplace_back(r, w);
        } else if (r < world_size) {
          seen[static_cast<size_t>(r)] = true;
        }
      }
      num[0] = num[1] = 0;
      digits[0] = digits[1] = false;
      field = 0;
      bad = false;
    } else {
      bad = true;
    }
  }
  for (int i = 0; i < world_size; ++i) {
    if (!seen[static_cast<size_t>(i)]) out.missing.push_back(i);
  }
  return out;
}

std::string world_size_mismatch(int rank, int world_size, const Arrivals& a) {
  std::string others;
  for (const auto& [r, w] : a.other_sizes) {
    others += (others.empty() ? "" : ", ") + std::string("rank ") + std::to_string(r) +
              " was launched with WORLD_SIZE=" + std::to_string(w);
  }
  return others + ", this rank (rank " + std::to_string(rank) +
         ") with WORLD_SIZE=" + std::to_string(world_size) +
         ": the ranks disagree on the world size; launch every rank with the same WORLD_SIZE "
         "(torchrun: the same --nnodes and --nproc-per-node on every node)";
}

}  // namespace zero::comm
