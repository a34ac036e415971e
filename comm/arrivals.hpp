// The start-up handshake's arrival list. Every rank appends "RANK:WORLD_SIZE," to one store
// key, so one read tells which ranks are missing and whether a rank was launched with another
// WORLD_SIZE (a launch mistake that would otherwise look like a rank that never arrives, or a
// network problem once the ranks that did agree try to connect).
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace zero::comm {

std::string arrival_entry(int rank, int world_size);

struct Arrivals {
  std::vector<int> missing;  // ranks of this world that have not appended their entry
  // (rank, WORLD_SIZE) of the entries that name another world size than this rank's.
  std::vector<std::pair<int, int>> other_sizes;
  int entries = 0;  // well-formed entries, whatever world size they name
};

// Reads the key's bytes for a rank launched with `world_size`; malformed entries are skipped,
// and an entry without the size ("RANK,") counts as agreeing.
Arrivals parse_arrivals(const std::vector<uint8_t>& bytes, int world_size);

// "rank 1 was launched with WORLD_SIZE=3, this rank (rank 0 of 2) with WORLD_SIZE=2: ...".
std::string world_size_mismatch(int rank, int world_size, const Arrivals& a);

}  // namespace zero::comm
