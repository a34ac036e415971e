#include "checkpoint_agreement.hpp"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <algorithm>
#include <filesystem>

#include "zero/checkpoint_io.hpp"
#include "zero/pipeline_engine.hpp"
#include "zero/tensor_parallel.hpp"

namespace zero::examples {
namespace {
namespace fs = std::filesystem;

// Every rank's `values` (the same count on each), gathered over `world` onto the host.
std::vector<std::vector<int64_t>> gather(const std::vector<int64_t>& values,
                                         const c10::Device& device,
                                         const std::shared_ptr<Group>& world) {
  at::NoGradGuard no_grad;
  const int64_t n = static_cast<int64_t>(values.size());
  at::Tensor mine = at::tensor(values, at::kLong).to(device);
  // gather_from_region concatenates along the last dimension, rank order.
  const at::Tensor all = tensor_parallel::gather_from_region(mine, world).cpu();
  std::vector<std::vector<int64_t>> out(world->size(), std::vector<int64_t>(n));
  for (int r = 0; r < world->size(); ++r)
    for (int64_t i = 0; i < n; ++i) out[r][i] = all[r * n + i].item<int64_t>();
  return out;
}

// FNV-1a, cut to 62 bits: ranks compare tags by it (the same on every process).
int64_t tag_hash(const std::string& s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  return static_cast<int64_t>(h >> 2);
}

}  // namespace

void save_over_world(const std::function<void()>& save, const std::function<void()>& after_all,
                     const c10::Device& device, const std::shared_ptr<Group>& world) {
  std::string error;
  try {
    save();
  } catch (const std::exception& e) {
    error = e.what();
  }
  const auto all = gather({error.empty() ? 0 : 1}, device, world);
  std::string failed;
  for (int r = 0; r < world->size(); ++r)
    if (all[r][0] != 0) failed += (failed.empty() ? "" : ", ") + std::to_string(r);
  if (!error.empty()) throw CheckpointError(error);
  if (!failed.empty()) {
    throw CheckpointError("the checkpoint save failed on rank(s) " + failed +
                          " (their error names the file); stopping");
  }
  after_all();
}

std::string agree_on_tag(const std::string& tag, const std::string& error, int64_t steps,
                         const std::string& save_dir, const c10::Device& device,
                         const std::shared_ptr<Group>& world) {
  const auto all = gather({error.empty() ? 0 : 1, steps, tag_hash(tag)}, device, world);
  if (!error.empty()) throw CheckpointError(error);
  std::string failed, differ;
  for (int r = 0; r < world->size(); ++r) {
    if (all[r][0] != 0) {
      failed += (failed.empty() ? "" : ", ") + std::to_string(r);
    } else if (all[r][1] != steps || all[r][2] != tag_hash(tag)) {
      differ += (differ.empty() ? "" : ", ") + std::to_string(r) + " (step " +
                std::to_string(all[r][1]) + ")";
    }
  }
  if (!failed.empty()) {
    throw CheckpointError("rank(s) " + failed + " found no checkpoint to resume from in " +
                          save_dir + " (their error says why); stopping");
  }
  if (!differ.empty()) {
    throw CheckpointError("the ranks would resume from different saves in " + save_dir + ": rank " +
                          std::to_string(world->rank()) + " from " + tag + " (step " +
                          std::to_string(steps) + "), rank(s) " + differ +
                          " from another: trainer.save_dir must be one directory every rank "
                          "sees (a shared file system)");
  }
  return tag;
}

ResumePoint agree_resume_point(const std::string& save_root, const std::string& want,
                               const std::string& own_dir, const c10::Device& device,
                               const std::shared_ptr<Group>& world) {
  ResumePoint p;
  std::string error;
  try {
    p.dirs = checkpoint_dirs(save_root, want);
    if (p.dirs.empty()) p.dirs = {own_dir};  // the load says what is missing
    if (!want.empty()) {
      p.tag = want;
    } else if (p.dirs.size() == 1) {
      // One directory: its save is atomic (written aside, then renamed), so a latest that is
      // damaged or names an incomplete tag is damage, not a save cut short. The load reads and
      // checks latest itself and names what is wrong (falling back to an older tag would hide
      // it); the ranks still agree below that they all load that directory's latest.
    } else {
      // Every directory's latest, when they agree and it is complete everywhere (the common
      // case); else the newest tag every directory completed.
      const std::string first = latest_checkpoint_tag(p.dirs.front());
      bool same = !first.empty();
      for (const auto& d : p.dirs)
        same = same && latest_checkpoint_tag(d) == first && checkpoint_complete(d, first);
      p.tag = same ? first : newest_common_checkpoint(p.dirs);
      if (p.tag.empty()) {
        std::string held;
        for (const auto& d : p.dirs) {
          const auto c = complete_checkpoints(d);
          held += (held.empty() ? "" : ", ") + d + " " + (c.empty() ? "none" : c.front().tag);
        }
        throw CheckpointError(save_root +
                              ": no checkpoint is complete in every directory of the save "
                              "(the newest complete in each: " +
                              held +
                              "): a save was cut short before any finished everywhere; resume "
                              "from a tag all of them hold, or give an empty trainer.save_dir "
                              "to start afresh");
      }
      for (const auto& d : p.dirs) {
        const std::string l = latest_checkpoint_tag(d);
        if (l != p.tag && p.note.empty()) {
          p.note = d + "/latest names " + (l.empty() ? "nothing" : l) +
                   ", which is not complete in every directory of the save (a save cut short): "
                   "every rank resumes from " +
                   p.tag + ", the newest tag complete in all of them";
        }
      }
    }
    if (fs::exists(fs::path(p.dirs.front()) / p.tag / "manifest.json"))
      p.steps = read_checkpoint_info(p.dirs.front(), p.tag).optimizer_steps;
  } catch (const std::exception& e) {
    error = e.what();
  }
  agree_on_tag(p.tag, error, p.steps, save_root, device, world);
  // This rank's own directory first: its random-generator states (Engine::load_checkpoint).
  const auto own = std::find(p.dirs.begin(), p.dirs.end(), own_dir);
  if (own != p.dirs.end()) std::rotate(p.dirs.begin(), own, own + 1);
  return p;
}

std::string agree_pipeline_resume_tag(const std::string& save_dir, const std::string& want,
                                      std::string* note, const c10::Device& device,
                                      const std::shared_ptr<Group>& world) {
  // Stage 0's directory, or its tp0/ when a run under tensor parallelism saved the newest.
  const std::vector<std::string> first = checkpoint_dirs(save_dir + "/stage0", want);
  const std::string stage0 = first.empty() ? save_dir + "/stage0" : first.front();
  // A tag is a save when the layout it records names stage (and tensor-parallel) directories
  // that all completed it.
  auto whole = [&](const std::string& tag) {
    try {
      const pipeline::PipelineSaveLayout saved = pipeline::read_pipeline_save(save_dir, tag);
      for (const std::string& d : pipeline::pipeline_save_dirs(save_dir, saved))
        if (!checkpoint_complete(d, tag)) return false;
      return saved.stages > 0;
    } catch (const std::exception&) {
      return false;
    }
  };
  std::string tag, error;
  int64_t steps = 0;
  try {
    const std::string latest = latest_checkpoint_tag(stage0);
    if (!want.empty()) {
      tag = want;
    } else if (!latest.empty() && whole(latest)) {
      tag = latest;
    } else {
      for (const CheckpointInfo& c : complete_checkpoints(stage0)) {
        if (whole(c.tag)) {
          tag = c.tag;
          break;
        }
      }
      if (tag.empty()) {
        throw CheckpointError(save_dir +
                              ": no pipelined checkpoint is complete in every stage directory "
                              "(save_dir/stage<s>/<tag>): a save was cut short before any "
                              "finished everywhere; give an empty trainer.save_dir to start "
                              "afresh");
      }
      if (note) {
        *note = stage0 + "/latest names " + (latest.empty() ? "nothing" : latest) +
                ", which is not complete in every stage directory (a save cut short): every "
                "rank resumes from " +
                tag + ", the newest tag complete in all of them";
      }
    }
    if (checkpoint_complete(stage0, tag)) steps = read_checkpoint_info(stage0, tag).optimizer_steps;
  } catch (const std::exception& e) {
    error = e.what();
  }
  return agree_on_tag(tag, error, steps, save_dir, device, world);
}

}  // namespace zero::examples
