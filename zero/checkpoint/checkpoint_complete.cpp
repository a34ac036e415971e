// Which checkpoints are complete, and the newest one every directory of a save holds: what a
// resume picks when the directories' `latest` pointers disagree (a save killed after one
// tensor-parallel rank or pipeline stage had published its part and before the others had).
#include <algorithm>
#include <filesystem>

#include "zero/checkpoint/checkpoint_format.hpp"
#include "zero/checkpoint_io.hpp"

namespace zero {
namespace fs = std::filesystem;

bool checkpoint_complete(const std::string& dir, const std::string& tag) {
  std::error_code ec;
  const fs::path tag_dir = fs::path(dir) / tag;
  const fs::path manifest = tag_dir / "manifest.json";
  if (tag.empty() || tag.ends_with(".tmp") || tag.ends_with(".old") ||
      !fs::is_regular_file(manifest, ec)) {
    return false;
  }
  try {
    const ckpt::Manifest m =
        ckpt::parse_manifest(ckpt::read_text(manifest.string(), "manifest"), manifest.string());
    if (m.files.empty()) return false;
    for (const auto& f : m.files) {
      const fs::path p = tag_dir / f.name;
      if (!fs::is_regular_file(p, ec) || fs::file_size(p, ec) != f.bytes || ec) return false;
    }
  } catch (const std::exception&) {
    return false;  // damaged or foreign: not a save to resume from
  }
  return true;
}

std::vector<CheckpointInfo> complete_checkpoints(const std::string& dir) {
  std::vector<CheckpointInfo> out;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return out;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string tag = e.path().filename().string();
    if (!e.is_directory(ec) || tag == "latest" || !checkpoint_complete(dir, tag)) continue;
    try {
      out.push_back(read_checkpoint_info(dir, tag));
    } catch (const std::exception&) {
      // A tag read_checkpoint_info refuses (an odd name) is not one to resume from.
    }
  }
  // Newest first; equal steps (two tags of one step) by name, so every rank orders alike.
  std::sort(out.begin(), out.end(), [](const CheckpointInfo& a, const CheckpointInfo& b) {
    return a.optimizer_steps != b.optimizer_steps ? a.optimizer_steps > b.optimizer_steps
                                                  : a.tag > b.tag;
  });
  return out;
}

std::string newest_common_checkpoint(const std::vector<std::string>& dirs) {
  if (dirs.empty()) return "";
  for (const CheckpointInfo& c : complete_checkpoints(dirs.front())) {
    bool everywhere = true;
    for (size_t i = 1; i < dirs.size() && everywhere; ++i) {
      everywhere = checkpoint_complete(dirs[i], c.tag) &&
                   read_checkpoint_info(dirs[i], c.tag).optimizer_steps == c.optimizer_steps;
    }
    if (everywhere) return c.tag;
  }
  return "";
}

}  // namespace zero
