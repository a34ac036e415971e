// Engine::load_checkpoint: any number of ranks read a checkpoint saved by any number of ranks,
// and, from the tensor-parallel ranks' directories of one save, under any tensor-parallel size
// (each rank reads the saved blocks that cover its own: zero/checkpoint/checkpoint_parts.hpp).
//
// Phases, each ended by agree() so that a failure stops every rank together:
//   1. rank 0 reads the manifests and checks them against this engine (model, dtype, optimizer);
//   2. every rank opens every shard file (header and index checks) and checksums its share of
//      the files' data; nothing of the engine has changed yet, so a bad checkpoint leaves the
//      run exactly as it was;
//   3. every rank checks that the pieces overlapping what it owns under its own layout are all
//      there (still nothing changed), restores its random generators, and only then reads them
//      straight into the masters and optimizer states (no second copy of them: a load's peak is
//      the run's states plus one bucket's host buffer), restores the step counters, and the
//      parameters are published to every rank's model.
#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <algorithm>
#include <filesystem>
#include <iostream>
#include <map>
#include <memory>

#include "zero/checkpoint/checkpoint_parts.hpp"
#include "zero/errors.hpp"
#include "zero/engine/engine_checkpoint.hpp"

namespace zero {
namespace fs = std::filesystem;
namespace {

std::string shape_text(const std::vector<int64_t>& s) {
  std::string t = "[";
  for (size_t i = 0; i < s.size(); ++i) t += (i ? ", " : "") + std::to_string(s[i]);
  return t + "]";
}

std::string list_text(const std::vector<std::string>& v) {
  std::string t = "[";
  for (size_t i = 0; i < v.size(); ++i) t += (i ? ", " : "") + v[i];
  return t + "]";
}

std::string dirs_text(const std::vector<ckpt::Source>& sources) {
  std::string t;
  for (size_t i = 0; i < sources.size(); ++i) t += (i ? ", " : "") + sources[i].tag_dir;
  return t;
}

// The model by name and whole (global) shape; the optimizer, its states and parameter groups
// per directory; and, over several directories, that they are one save.
void check_compatible(const Engine::Impl& m, const std::vector<ckpt::Manifest>& mans,
                      const std::vector<std::string>& paths, const ModelPart& part) {
  const auto cur = ckpt::current_params(m);
  // The fingerprint covers the blocks' shapes, not the whole tensors': compared by name always.
  {
    const char* hint =
        " (load it into the model it was saved from; for a new model use another save_dir)";
    // Over several directories a missing parameter could have been in any: name them all.
    std::string path = paths.front();
    for (size_t i = 1; i < paths.size(); ++i) path += ", " + paths[i];
    // Under tensor parallelism a rank holds a block of a parameter: the whole tensor's shape is
    // what must agree, the blocks are read wherever they lie.
    std::map<std::string, std::vector<int64_t>> saved;
    for (const auto& man : mans) {
      for (const auto& p : man.params) {
        if (!part || part(p.name)) saved.emplace(p.name, p.global_shape);
      }
    }
    for (const auto& p : cur) {
      auto it = saved.find(p.name);
      // A part of the model (a pipeline stage) reads only the directories that should hold it.
      if (part) {
        ZERO_CKPT_CHECK(it != saved.end(), "zero: parameter '", p.name, "' ",
                        shape_text(p.global_shape), " is in none of the directories read (", path,
                        ")", hint);
      }
      ZERO_CKPT_CHECK(it != saved.end(), path, ": a different model: this model's parameter '",
                      p.name, "' ", shape_text(p.global_shape), " is not in the checkpoint", hint);
      ZERO_CKPT_CHECK(it->second == p.global_shape, path, ": a different model: parameter '",
                      p.name, "' has shape ", shape_text(it->second), " in the checkpoint but ",
                      shape_text(p.global_shape), " in this model", hint);
      saved.erase(it);
    }
    ZERO_CKPT_CHECK(saved.empty(), path, ": a different model: the checkpoint's parameter '",
                    saved.empty() ? "" : saved.begin()->first, "' is not in this model", hint);
    // Same names and shapes in another registration order, or another compute dtype: loading
    // goes by name, and the shards hold fp32 masters whatever the compute dtype was.
  }
  std::vector<std::string> states;
  for (const auto& s : m.store.optimizer->state()) states.push_back(s.first);
  const std::string groups = param_groups_text(m.cfg.optimizer.param_groups);
  for (size_t i = 0; i < mans.size(); ++i) {
    const ckpt::Manifest& man = mans[i];
    const std::string& path = paths[i];
    ZERO_CKPT_CHECK(man.optimizer == m.store.optimizer->name() && man.state_names == states, path,
                    ": saved with optimizer ", man.optimizer, " (states ",
                    list_text(man.state_names), ") but this run uses ", m.store.optimizer->name(),
                    " (states ", list_text(states),
                    "); set optimizer.type (and SGD momentum) as "
                    "in the run that saved it");
    // The states would load, but each parameter would resume under another lr scale or weight
    // decay than it trained with: a silent change of the run.
    ZERO_CKPT_CHECK(man.param_groups == groups, path, ": saved with optimizer.param_groups ",
                    man.param_groups.empty() ? "(none)" : man.param_groups, " but this run has ",
                    groups.empty() ? "(none)" : groups,
                    "; resume with the groups that run used (change them in a fresh run, or "
                    "start from the consolidated weights with zero-consolidate)");
    ZERO_CKPT_CHECK(man.optimizer_steps == mans.front().optimizer_steps &&
                        man.optimizer_internal_steps == mans.front().optimizer_internal_steps,
                    path, ": saved at optimizer step ", man.optimizer_steps, " but ", paths.front(),
                    " at step ", mans.front().optimizer_steps,
                    " (the directories are not the tensor-parallel ranks or pipeline stages "
                    "of one save)");
  }
}

// Every unit's pieces of what this rank holds, in layout order.
std::vector<OwnedPiece> owned_pieces(const Engine::Impl& m) {
  std::vector<OwnedPiece> out;
  for (const auto& u : m.units) {
    for (const OwnedPiece& p : u->owned_pieces()) out.push_back(p);
  }
  return out;
}

// Calls f(piece, want) for every piece of what this rank owns under the current layout, `want`
// its parameter's block in the whole tensor (CheckpointParam), after checking that the
// checkpoints' blocks cover the piece.
template <class F>
void for_each_owned(const Engine::Impl& m, const ckpt::PartMap& parts, bool several, F f) {
  const FlatLayout& L = m.fp.layout;
  std::map<std::string, CheckpointParam> blocks;
  for (auto& p : ckpt::current_params(m)) blocks.emplace(p.name, std::move(p));
  for (const OwnedPiece& p : owned_pieces(m)) {
    const std::string& name = L.params()[p.param].name;
    ZERO_CKPT_CHECK(parts.has(name), "zero: parameter '", name, "' is not in the checkpoint");
    const CheckpointParam& want = blocks.at(name);
    const int64_t begin = p.param_offset, end = p.param_offset + p.numel;
    const int64_t covered = parts.read(want, 0, begin, end, nullptr);
    ZERO_CKPT_CHECK(covered == p.numel, "zero: parameter '", name, "' elements ", begin, "..", end,
                    " are only partly in the checkpoint",
                    several || !want.whole() || parts.split(name)
                        ? " (its blocks at this tensor-parallel layout need every tensor-parallel "
                          "rank's directory of the save: dir/tp0, dir/tp1, ...)"
                        : "");
    f(p, want);
  }
}

// Reads the blocks of the checkpoints that cover what this rank owns under the current layout
// straight into the master shard and the optimizer states (state() names), piece by piece: a
// load holds no second copy of the states, only, for states outside host memory, a host buffer
// of at most one bucket's shard. Padding is zeroed, as in a fresh engine. Runs once everything
// that can be checked was (the files' checksums, the coverage, the generator states); a read
// that fails now leaves the states partly overwritten, which the error says.
void read_into_states(Engine::Impl& m, const ckpt::Manifest& man, const ckpt::PartMap& parts,
                      bool several) {
  const FlatLayout& L = m.fp.layout;
  // Every unit steps the same optimizer: its states, addressed like the shard.
  const auto states = m.units.front()->optimizer_window();
  std::vector<at::Tensor> targets;  // per checkpoint tensor: master, then the states it names
  targets.emplace_back();           // the master: per bucket, below
  for (const std::string& name : man.state_names) {
    at::Tensor t;
    for (const auto& s : states) {
      if (s.first == name) t = s.second;
    }
    targets.push_back(t);
  }
  for (const auto& u : m.units) u->zero_master_and_states();
  at::Tensor staging;  // host, for targets that are not
  for_each_owned(m, parts, several, [&](const OwnedPiece& p, const CheckpointParam& want) {
    const BucketSlot& b = L.buckets()[L.params()[p.param].bucket];
    const int64_t lo = p.param_offset, hi = p.param_offset + p.numel;
    for (size_t t = 0; t < targets.size(); ++t) {
      at::Tensor to = t == 0 ? m.unit_of(L.params()[p.param].bucket).master_window(b) : targets[t];
      if (!to.defined()) continue;
      const int64_t chunk = std::max<int64_t>(L.chunk_numel(), 1);
      for (int64_t at = lo; at < hi; at += chunk) {
        const int64_t n = std::min(chunk, hi - at);
        at::Tensor slot = to.narrow(0, p.shard_offset + (at - lo), n);
        if (slot.is_cpu()) {
          parts.read(want, static_cast<int>(t), at, at + n, slot.data_ptr<float>());
          continue;
        }
        // Page-locked, as the save's: a copy from pageable memory is staged by the driver.
        if (!staging.defined()) staging = ckpt::checkpoint_staging(m, chunk);
        parts.read(want, static_cast<int>(t), at, at + n, staging.data_ptr<float>());
        slot.copy_(staging.narrow(0, 0, n));
      }
    }
  });
}

// The key that makes a run compute in `dtype`, for the message below.
std::string dtype_setting(const std::string& dtype) {
  if (dtype == dtype_name(Dtype::kBFloat16)) return "bf16.enabled: true";
  if (dtype == dtype_name(Dtype::kFloat16)) return "fp16.enabled: true";
  return "bf16.enabled and fp16.enabled false";
}

// Loading across compute dtypes is allowed (the shards hold fp32 masters either way), but it
// changes the run's precision: say so rather than change it without a word.
void warn_dtype_change(const Engine::Impl& m, const ckpt::Manifest& man, const std::string& dir) {
  const std::string now = ckpt::current_dtype(m);
  if (m.group->rank() != 0 || man.param_dtype == now) return;
  std::cerr << "zero: warning: " << dir << " was saved by a run computing in " << man.param_dtype
            << "; this run computes in " << now << ": training goes on from the checkpoint's fp32 "
            << "master weights in " << now << " (to keep " << man.param_dtype << ", set "
            << dtype_setting(man.param_dtype) << ")\n";
}

void restore_counters(Engine::Impl& m, const ckpt::Manifest& man) {
  if (m.verdict.pending()) m.verdict.get();  // a step taken before the load no longer counts
  m.deferred_error.clear();
  m.store.optimizer->set_steps(man.optimizer_internal_steps);
  m.stats.optimizer_steps = man.optimizer_steps;
  m.stats.skipped_steps = man.skipped_steps;
  m.stats.last_grad_norm = man.last_grad_norm;
  // A resharded run may split the same global batch into another number of micro-steps: keep
  // the count of windows, so accumulation boundaries stay where they belong.
  m.stats.micro_steps = man.micro_steps / std::max<int64_t>(man.accumulation, 1) * m.accumulation;
  // The loss scale of an fp16 run; a run of another dtype starts fp16 with a fresh scaler.
  if (m.cfg.fp16.enabled && man.param_dtype == dtype_name(Dtype::kFloat16)) {
    m.scaler.set_state({man.loss_scale, man.scaler_iter, man.scaler_last_overflow_iter,
                        static_cast<int>(man.scaler_hysteresis_left)});
  }
}

}  // namespace

std::string Engine::load_checkpoint(const std::string& dir, const std::string& tag) {
  return load_checkpoint(std::vector<std::string>{dir}, tag);
}

std::string Engine::load_checkpoint(const std::vector<std::string>& dirs,
                                    const std::string& tag_arg, const ModelPart& part) {
  auto& m = *impl_;
  at::NoGradGuard no_grad;
  const int rank = m.group->rank(), world = m.group->size();
  TORCH_CHECK(!dirs.empty(), "zero: load_checkpoint: no checkpoint directory given");
  try {
    m.enter("load_checkpoint");
  } catch (const CommError& e) {
    throw CheckpointError(e.what());
  }
  const std::string what =
      "load_checkpoint('" + dirs.front() + "'" +
      (dirs.size() > 1 ? " and " + std::to_string(dirs.size() - 1) + " more" : "") + ")";

  std::string tag, err;
  std::vector<std::string> texts(dirs.size());
  if (rank == 0) {
    err = ckpt::attempt([&] {
      tag = ckpt::resolve_tag(dirs.front(), tag_arg);
      std::vector<ckpt::Manifest> mans;
      std::vector<std::string> paths;
      for (size_t i = 0; i < dirs.size(); ++i) {
        paths.push_back((fs::path(dirs[i]) / tag / "manifest.json").string());
        texts[i] = ckpt::read_text(
            paths[i], "a save that did not finish writes no manifest; load another tag");
        mans.push_back(ckpt::parse_manifest(texts[i], paths[i]));
      }
      check_compatible(m, mans, paths, part);
    });
  }
  ckpt::agree(m, err, what);
  tag = ckpt::broadcast_string(m, tag, 0);
  for (auto& text : texts) text = ckpt::broadcast_string(m, text, 0);

  std::vector<ckpt::Source> sources;
  std::unique_ptr<ckpt::PartMap> parts;
  err = ckpt::attempt([&] {
    sources.reserve(dirs.size());
    for (size_t i = 0; i < dirs.size(); ++i) {
      const std::string tag_dir = (fs::path(dirs[i]) / tag).string();
      sources.push_back(
          ckpt::open_source(tag_dir, ckpt::parse_manifest(texts[i], tag_dir + "/manifest.json")));
    }
    parts = std::make_unique<ckpt::PartMap>(sources);
    // Each file's data is checksummed by one rank: the checkpoint is read once, in parallel.
    size_t f = 0;
    for (const auto& src : sources) {
      for (const auto& r : src.readers) {
        if (f++ % world == static_cast<size_t>(rank)) r.verify_payload();
      }
    }
  });
  ckpt::agree(m, err, what);
  const ckpt::Manifest& man = sources.front().man;
  const std::string& tag_dir = sources.front().tag_dir;
  const bool several = sources.size() > 1;

  // Does dirs[0] hold this rank's blocks as they are (no resharding of the tensor-parallel
  // layout) and nothing else (not another pipeline partition's stage)? Then its generator states
  // and error-feedback residuals (laid out by its buckets) are this rank's.
  // current_params checks this rank's groups.parts: inside the attempt, so that a rank whose
  // parts do not fit stops every rank through agree() instead of throwing alone while the others
  // wait in agree()'s all_gather until comm_timeout_s.
  bool same_blocks = true;
  // Everything is checked on every rank before anything of the engine changes.
  err = ckpt::attempt([&] {
    const auto cur = ckpt::current_params(m);
    same_blocks = man.params.size() == cur.size();
    std::map<std::string, const CheckpointParam*> saved;
    for (const auto& p : man.params) saved[p.name] = &p;
    for (const auto& p : cur) {
      const auto it = saved.find(p.name);
      same_blocks = same_blocks && it != saved.end() && it->second->shape == p.shape &&
                    it->second->offset == p.offset;
    }
    for_each_owned(m, *parts, several, [](auto&&...) {});
  });
  ckpt::agree(m, err, what);
  // zero_quantized_gradients' residuals: checked in full before anything is copied, so a bad
  // file leaves them as they were.
  err = ckpt::attempt([&] {
    ckpt::load_error_feedback(
        m, tag_dir, man.world_size,
        same_blocks ? ""
                    : "the checkpoint was saved under another tensor-parallel or pipeline "
                      "layout: resharding drops them");
  });
  ckpt::agree(m, err, what);

  // The generator states belong to ranks; a rank the saved run did not have keeps its own. If
  // any rank cannot restore its own, every rank puts its generators back.
  const std::string rng_before = ckpt::rng_state(m.fp.device());
  err = ckpt::attempt([&] {
    if (same_blocks && rank < man.world_size) {
      const ckpt::ShardReader& r = sources.front().readers[rank];
      const auto& rng = r.index().rng_state;
      if (!rng.empty()) ckpt::set_rng_state(rng, m.fp.device(), r.path());
    }
  });
  try {
    ckpt::agree(m, err, what);
  } catch (...) {
    ckpt::set_rng_state(rng_before, m.fp.device(), "the generator state before the load");
    throw;
  }
  err = ckpt::attempt([&] { read_into_states(m, man, *parts, several); });
  if (!err.empty()) {
    err +=
        " (the masters and optimizer states are partly overwritten: load a checkpoint again "
        "before training on)";
  }
  ckpt::agree(m, err, what);
  restore_counters(m, man);
  warn_dtype_change(m, man, tag_dir);
  m.publish_units();
  m.sync->zero_grad();
  return tag;
}

}  // namespace zero
