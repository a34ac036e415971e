// The trainers' checkpoints agreed over every process of the job (every data-parallel,
// tensor-parallel and pipeline-stage rank), not one data-parallel group.
//
// Each tensor-parallel rank (save_dir/tp<r>/) and each pipeline stage (save_dir/stage<s>/) saves
// into a directory of its own over its own data-parallel group. A save cut short (preemption, a
// kill) can leave one directory a tag ahead of another: its `latest` names a tag the others
// never completed, and pruning to keep_last may already have deleted the tag they still hold.
// So the old tags are pruned only once every rank of the world has published the new one, and a
// resume takes the newest tag complete in every directory of the save, the same on every rank.
#pragma once

#include <c10/core/Device.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "zero/group.hpp"

namespace zero::examples {

// Runs `save` (this rank's part of the checkpoint, e.g. Engine::save_checkpoint with keep_last
// 0), then learns over `world` whether every rank's succeeded: when one failed, CheckpointError
// on every rank (the failed ranks' own text, the others' saying another rank failed); else
// `after_all` (pruning), which may now delete the tags the new one replaces.
void save_over_world(const std::function<void()>& save, const std::function<void()>& after_all,
                     const c10::Device& device, const std::shared_ptr<Group>& world);

// `tag`: this rank's choice ("" with `error` set when it could not choose). One all-gather over
// `world`: returns the tag when every rank chose the same one; else throws CheckpointError on
// every rank, naming the ranks that failed or disagreed.
std::string agree_on_tag(const std::string& tag, const std::string& error, int64_t steps,
                         const std::string& save_dir, const c10::Device& device,
                         const std::shared_ptr<Group>& world);

// What the plain and tensor-parallel trainer resumes from.
struct ResumePoint {
  std::vector<std::string> dirs;  // the save's directories (checkpoint_dirs), `own_dir` first
  std::string tag;
  int64_t steps = 0;
  std::string note;  // "" or why `tag` is not the one a directory's latest names
};
// The directories of the newest save under `save_root` (any tensor-parallel layout) and the tag
// every rank of `world` loads: `want` when given, else the tag every directory's `latest` names
// when they agree and it is complete in all of them, else the newest tag complete in all of
// them. A collective over `world`; CheckpointError on every rank when there is none.
ResumePoint agree_resume_point(const std::string& save_root, const std::string& want,
                               const std::string& own_dir, const c10::Device& device,
                               const std::shared_ptr<Group>& world);

// The same for a pipelined save (save_dir/stage<s>/): the tag to pass to
// PipelineEngine::load_checkpoint, complete in every stage directory of the layout it records.
std::string agree_pipeline_resume_tag(const std::string& save_dir, const std::string& want,
                                      std::string* note, const c10::Device& device,
                                      const std::shared_ptr<Group>& world);

}  // namespace zero::examples
