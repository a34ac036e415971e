// Sharded training checkpoints on disk, read without a process group.
//
// Engine::save_checkpoint(dir, tag) writes dir/tag/ with one shard file per rank and a
// manifest; Engine::load_checkpoint(dir, tag) reads it back on any number of ranks (the files
// hold each parameter's pieces by name, in logical element order, without padding), and
// load_checkpoint(dirs, tag) the tensor-parallel ranks' saves under any tensor-parallel size. This
// header is the part that needs no engine: consolidation into one safetensors file (tools/
// zero-consolidate), inspection, and pruning old checkpoints.
//
//   dir/latest                        the tag of the newest complete checkpoint (written last)
//   dir/<tag>/manifest.json           run fingerprint, world size, stage, steps, files, checksums
//   dir/<tag>/shard_rank<r>_of_<N>.bin fp32 master values and optimizer states of rank r's pieces
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "zero/errors.hpp"

namespace zero {

struct CheckpointParam {
  std::string name;
  std::vector<int64_t> shape;  // as the saving rank held it
  // Where that tensor sits in the model's whole parameter: its global shape and the index of
  // its first element along each dimension. Without tensor parallelism every rank holds
  // parameters whole (shape, zeros); a tensor-parallel rank holds a block of a split weight
  // (Groups::parts), and the records say which, so that the save loads under another
  // tensor-parallel size and consolidates (read_consolidated(dirs)). Checkpoints written before
  // these fields existed read as whole.
  std::vector<int64_t> global_shape;
  std::vector<int64_t> offset;
  bool whole() const;
};

// What the manifest says about a checkpoint.
struct CheckpointInfo {
  std::string dir;  // dir/tag
  std::string tag;
  std::string fingerprint;  // hash of parameter names, shapes and compute dtype
  int world_size = 1;
  int stage = 0;
  std::string param_dtype;  // "fp32", "bf16", "fp16"
  std::string optimizer;
  std::vector<std::string> state_names;  // optimizer state tensors, e.g. exp_avg, exp_avg_sq
  int64_t optimizer_steps = 0;
  int64_t micro_steps = 0;
  std::vector<CheckpointParam> params;  // the model's named_parameters() order
};

// The tag `dir/latest` names; empty when there is no `latest` file.
std::string latest_checkpoint_tag(const std::string& dir);
// Reads dir/tag/manifest.json (tag "" = latest). Throws CheckpointError.
CheckpointInfo read_checkpoint_info(const std::string& dir, const std::string& tag = "");

// The full, unpadded fp32 tensors of one kind, by parameter name in model order: `state`
// "master" for the parameters, or an optimizer state name from CheckpointInfo::state_names.
// Verifies every file's checksum. Throws CheckpointError naming the file on any mismatch.
std::vector<std::pair<std::string, at::Tensor>> read_consolidated(
    const std::string& dir, const std::string& tag = "", const std::string& state = "master");

// The same from several directories that together hold one save: the tensor-parallel ranks'
// (dir/tp0, dir/tp1, ...), each holding blocks of the split parameters (CheckpointParam::offset
// in global_shape). The blocks are put together into whole tensors, in dirs[0]'s parameter
// order. Throws CheckpointError naming the parameter when the directories do not hold all of it.
std::vector<std::pair<std::string, at::Tensor>> read_consolidated(
    const std::vector<std::string>& dirs, const std::string& tag = "",
    const std::string& state = "master");

// The directories that hold the save `tag` ("" = the newest) of a trainer.save_dir `save_dir`:
// {save_dir} when a run without tensor parallelism saved it (save_dir/<tag>), {save_dir/tp0, ...,
// save_dir/tp<T-1>} when T tensor-parallel ranks did (each its own save_dir/tp<r>/<tag>). When
// both hold it (a run resumed under another tensor-parallel size), the one with more optimizer
// steps (tag ""), or the flat one. Empty when neither does. Reads manifests only.
std::vector<std::string> checkpoint_dirs(const std::string& save_dir, const std::string& tag = "");

// Whether dir/tag is a complete checkpoint: its manifest.json reads back and every shard file it
// lists is there with the size it records (a save writes the manifest last, into a directory it
// renames into place only then, so a save cut short leaves no such directory). Reads no payload.
bool checkpoint_complete(const std::string& dir, const std::string& tag);
// The complete checkpoints in `dir`, newest (most optimizer steps) first; `latest` is not
// consulted. Empty when there are none (or no such directory).
std::vector<CheckpointInfo> complete_checkpoints(const std::string& dir);
// The newest tag that is complete in every one of `dirs` (the tensor-parallel ranks' or the
// pipeline stages' directories of one save): the one a run resumes from when a save was cut
// short after some of them had written theirs (their `latest` then names a tag the others lack).
// "" when no tag is complete in all of them.
std::string newest_common_checkpoint(const std::vector<std::string>& dirs);

// Writes `tensors` as a safetensors file (cast to `dtype`: at::kFloat, at::kBFloat16 or
// at::kHalf), atomically. `metadata` lands in the header's "__metadata__".
void write_safetensors(const std::string& path,
                       const std::vector<std::pair<std::string, at::Tensor>>& tensors,
                       at::ScalarType dtype, const std::map<std::string, std::string>& metadata);

// Deletes complete checkpoints in `dir` except the `keep_last` newest (by optimizer step) and
// the one `latest` names. keep_last <= 0 keeps everything. No collective: call it on one rank.
void prune_checkpoints(const std::string& dir, int keep_last);

}  // namespace zero
