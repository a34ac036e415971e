// Reading parameters from several checkpoints that each hold parts of them: the saves of the
// tensor-parallel ranks of one run (save_dir/tp<r>/), each recording where its block of every
// parameter lies in the whole tensor (CheckpointParam::global_shape, offset). A reader asks for
// any block of the whole tensor (its own part under another tensor-parallel size, or the whole
// tensor when consolidating) and gets the values from whichever saved blocks cover it: resharding
// without an offline converter. Private to zero/.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "zero/checkpoint/checkpoint_format.hpp"

namespace zero::ckpt {

// One checkpoint directory (dir/tag), opened: its manifest, shard files and piece map. Only
// movable: the piece map points into the readers.
struct Source {
  std::string tag_dir;
  Manifest man;
  std::vector<ShardReader> readers;
  PieceMap map;
};

// Opens tag_dir's shard files (header and index checks) and maps their pieces; `man` is its
// parsed manifest. Checksums nothing (ShardReader::verify_payload does).
Source open_source(const std::string& tag_dir, Manifest man);

// The saved blocks of every parameter over a set of sources. A parameter saved whole by several
// sources (a norm every tensor-parallel rank holds) is read from the first; blocks of one
// parameter must agree on its global shape, never overlap partly, and tile it.
class PartMap {
 public:
  // Throws CheckpointError naming the directories when the blocks do not fit together.
  explicit PartMap(const std::vector<Source>& sources);

  // Parameter names in the first source's order, then any only later sources have.
  const std::vector<std::string>& names() const { return names_; }
  bool has(const std::string& name) const { return parts_.count(name) > 0; }
  const std::vector<int64_t>& global_shape(const std::string& name) const;
  // Whether some source saved `name` as a block of a larger tensor (tensor parallel).
  bool split(const std::string& name) const;

  // Elements [lo, hi) (row-major, of the block `want`: its shape, and its place in the global
  // tensor) of tensor kind `tensor` (0 the master values, 1 + i optimizer state i) into dst[0 ..
  // hi - lo). Returns how many of them the saved blocks hold (hi - lo when they cover it);
  // with dst null it only counts.
  int64_t read(const CheckpointParam& want, int tensor, int64_t lo, int64_t hi, float* dst) const;

 private:
  struct Part {
    int source = 0;
    const CheckpointParam* param = nullptr;
  };
  const std::vector<Source>& sources_;
  std::vector<std::string> names_;
  std::map<std::string, std::vector<Part>> parts_;
};

}  // namespace zero::ckpt
