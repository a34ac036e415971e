// Engine::load_checkpoint: any number of ranks read a checkpoint saved by any number of ranks.
//
// Phases, each ended by agree() so that a failure stops every rank together:
//   1. rank 0 reads the manifest and checks it against this engine (model, dtype, optimizer);
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

void check_compatible(const Engine::Impl& m, const ckpt::Manifest& man, const std::string& path) {
  const auto cur = ckpt::current_params(m);
  const std::string dtype = ckpt::current_dtype(m);
  if (man.fingerprint != ckpt::run_fingerprint(cur, dtype)) {
    const char* hint =
        " (load it into the model it was saved from; for a new model use another save_dir)";
    std::map<std::string, std::vector<int64_t>> saved;
    for (const auto& p : man.params) saved[p.name] = p.shape;
    for (const auto& p : cur) {
      auto it = saved.find(p.name);
      ZERO_CKPT_CHECK(it != saved.end(), path, ": a different model: this model's parameter '",
                      p.name, "' ", shape_text(p.shape), " is not in the checkpoint", hint);
      ZERO_CKPT_CHECK(it->second == p.shape, path, ": a different model: parameter '", p.name,
                      "' has shape ", shape_text(it->second), " in the checkpoint but ",
                      shape_text(p.shape), " in this model", hint);
      saved.erase(it);
    }
    ZERO_CKPT_CHECK(saved.empty(), path, ": a different model: the checkpoint's parameter '",
                    saved.empty() ? "" : saved.begin()->first, "' is not in this model", hint);
    // Same names and shapes in another registration order, or another compute dtype: loading
    // goes by name, and the shards hold fp32 masters whatever the compute dtype was.
  }
  // Pieces are read by name and element offset into the tensor as held: a part of a larger
  // tensor (a tensor-parallel shard) loads only into the same part.
  std::map<std::string, const CheckpointParam*> saved_part;
  for (const auto& p : man.params) saved_part[p.name] = &p;
  for (const auto& p : cur) {
    const auto it = saved_part.find(p.name);
    if (it == saved_part.end()) continue;
    const CheckpointParam& s = *it->second;
    ZERO_CKPT_CHECK(s.global_shape == p.global_shape && s.offset == p.offset, path, ": parameter '",
                    p.name, "' was saved as the part at offset ", shape_text(s.offset), " of a ",
                    shape_text(s.global_shape), " tensor, but this run holds the part at offset ",
                    shape_text(p.offset), " of a ", shape_text(p.global_shape),
                    " tensor; load it with the tensor-parallel layout it was saved with");
  }
  std::vector<std::string> states;
  for (const auto& s : m.opt.optimizer->state()) states.push_back(s.first);
  ZERO_CKPT_CHECK(man.optimizer == m.opt.optimizer->name() && man.state_names == states, path,
                  ": saved with optimizer ", man.optimizer, " (states ", list_text(man.state_names),
                  ") but this run uses ", m.opt.optimizer->name(), " (states ", list_text(states),
                  "); set optimizer.type (and SGD momentum) as "
                  "in the run that saved it");
  // The states would load, but each parameter would resume under another lr scale or weight
  // decay than it trained with: a silent change of the run.
  const std::string groups = param_groups_text(m.cfg.optimizer.param_groups);
  ZERO_CKPT_CHECK(man.param_groups == groups, path, ": saved with optimizer.param_groups ",
                  man.param_groups.empty() ? "(none)" : man.param_groups, " but this run has ",
                  groups.empty() ? "(none)" : groups,
                  "; resume with the groups that run used (change them in a fresh run, or "
                  "start from the consolidated weights with zero-consolidate)");
}

// Calls f(piece, ref, lo, hi) for every overlap of a checkpoint entry with a piece of what this
// rank owns under the current layout (lo..hi: elements of the parameter); checks that the
// checkpoint covers every piece whole.
template <class F>
void for_each_overlap(const Engine::Impl& m, const ckpt::PieceMap& map, F f) {
  const FlatLayout& L = m.fp.layout;
  for (const OwnedPiece& p : L.owned_pieces(m.sharding.owner)) {
    const std::string& name = L.params()[p.param].name;
    const auto it = map.find(name);
    ZERO_CKPT_CHECK(it != map.end(), "zero: parameter '", name, "' is not in the checkpoint");
    const int64_t begin = p.param_offset, end = p.param_offset + p.numel;
    int64_t covered = 0;
    for (const ckpt::PieceRef& ref : it->second) {
      const int64_t eb = ref.entry->param_offset, ee = eb + ref.entry->count;
      if (eb >= end) break;  // sorted by offset
      const int64_t lo = std::max(begin, eb), hi = std::min(end, ee);
      if (lo >= hi) continue;
      f(p, ref, lo, hi);
      covered += hi - lo;
    }
    ZERO_CKPT_CHECK(covered == p.numel, "zero: parameter '", name, "' elements ", begin, "..", end,
                    " are only partly in the checkpoint");
  }
}

// Reads the pieces of the checkpoint that overlap what this rank owns under the current layout
// straight into the master shard and the optimizer states (state() names), piece by piece: a
// load holds no second copy of the states, only, for states outside host memory, a host buffer
// of at most one bucket's shard. Padding is zeroed, as in a fresh engine. Runs once everything
// that can be checked was (the files' checksums, the coverage, the generator states); a read
// that fails now leaves the states partly overwritten, which the error says.
void read_into_states(Engine::Impl& m, const ckpt::Manifest& man,
                      const std::vector<ckpt::ShardReader>& readers, const ckpt::PieceMap& map) {
  const FlatLayout& L = m.fp.layout;
  const auto states = m.opt.optimizer->state();
  std::vector<at::Tensor> targets;  // per checkpoint tensor: master, then the states it names
  targets.emplace_back();           // the master: per bucket, below
  for (const std::string& name : man.state_names) {
    at::Tensor t;
    for (const auto& s : states) {
      if (s.first == name) t = s.second;
    }
    targets.push_back(t);
  }
  for (const BucketSlot& b : L.buckets()) m.fp.bucket_master(b).zero_();
  for (const auto& s : states) s.second.zero_();
  at::Tensor staging;  // host, for targets that are not
  for_each_overlap(
      m, map, [&](const OwnedPiece& p, const ckpt::PieceRef& ref, int64_t lo, int64_t hi) {
        const BucketSlot& b = L.buckets()[L.params()[p.param].bucket];
        const int64_t dst = p.shard_offset + (lo - p.param_offset);
        for (size_t t = 0; t < targets.size(); ++t) {
          at::Tensor to = t == 0 ? m.fp.master_window(b) : targets[t];
          if (!to.defined()) continue;
          const int64_t chunk = std::max<int64_t>(L.chunk_numel(), 1);
          for (int64_t at = lo; at < hi; at += chunk) {
            const int64_t n = std::min(chunk, hi - at);
            at::Tensor slot = to.narrow(0, dst + (at - lo), n);
            if (slot.is_cpu()) {
              readers[ref.file].read(*ref.entry, static_cast<int>(t), at - ref.entry->param_offset,
                                     n, slot.data_ptr<float>());
              continue;
            }
            // Page-locked, as the save's: a copy from pageable memory is staged by the driver.
            if (!staging.defined()) staging = ckpt::checkpoint_staging(m, chunk);
            readers[ref.file].read(*ref.entry, static_cast<int>(t), at - ref.entry->param_offset, n,
                                   staging.data_ptr<float>());
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
  m.opt.optimizer->set_steps(man.optimizer_internal_steps);
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

std::string Engine::load_checkpoint(const std::string& dir, const std::string& tag_arg) {
  auto& m = *impl_;
  at::NoGradGuard no_grad;
  const int rank = m.group->rank(), world = m.group->size();
  const std::string what = "load_checkpoint('" + dir + "')";

  std::string tag, text, err;
  if (rank == 0) {
    err = ckpt::attempt([&] {
      tag = ckpt::resolve_tag(dir, tag_arg);
      const std::string path = (fs::path(dir) / tag / "manifest.json").string();
      text =
          ckpt::read_text(path, "a save that did not finish writes no manifest; load another tag");
      check_compatible(m, ckpt::parse_manifest(text, path), path);
    });
  }
  ckpt::agree(m, err, what);
  tag = ckpt::broadcast_string(m, tag, 0);
  text = ckpt::broadcast_string(m, text, 0);
  const std::string tag_dir = (fs::path(dir) / tag).string();
  const ckpt::Manifest man = ckpt::parse_manifest(text, tag_dir + "/manifest.json");

  std::vector<ckpt::ShardReader> readers;
  ckpt::PieceMap map;
  err = ckpt::attempt([&] {
    readers.reserve(man.files.size());
    for (const auto& f : man.files) readers.emplace_back(tag_dir + "/" + f.name);
    map = ckpt::build_piece_map(man, readers, tag_dir);
    // Each file's data is checksummed by one rank: the checkpoint is read once, in parallel.
    for (size_t f = rank; f < readers.size(); f += world) readers[f].verify_payload();
  });
  ckpt::agree(m, err, what);

  // Everything is checked on every rank before anything of the engine changes.
  err = ckpt::attempt([&] { for_each_overlap(m, map, [](auto&&...) {}); });
  ckpt::agree(m, err, what);
  // zero_quantized_gradients' residuals: checked in full before anything is copied, so a bad
  // file leaves them as they were.
  err = ckpt::attempt([&] { ckpt::load_error_feedback(m, tag_dir, man.world_size); });
  ckpt::agree(m, err, what);

  // The generator states belong to ranks; a rank the saved run did not have keeps its own. If
  // any rank cannot restore its own, every rank puts its generators back.
  const std::string rng_before = ckpt::rng_state(m.fp.flat.device());
  err = ckpt::attempt([&] {
    if (rank < man.world_size) {
      const auto& rng = readers[rank].index().rng_state;
      if (!rng.empty()) ckpt::set_rng_state(rng, m.fp.flat.device(), readers[rank].path());
    }
  });
  try {
    ckpt::agree(m, err, what);
  } catch (...) {
    ckpt::set_rng_state(rng_before, m.fp.flat.device(), "the generator state before the load");
    throw;
  }
  err = ckpt::attempt([&] { read_into_states(m, man, readers, map); });
  if (!err.empty()) {
    err +=
        " (the masters and optimizer states are partly overwritten: load a checkpoint again "
        "before training on)";
  }
  ckpt::agree(m, err, what);
  restore_counters(m, man);
  warn_dtype_change(m, man, tag_dir);
  m.publish_parameters();
  m.sync->zero_grad();
  return tag;
}

}  // namespace zero
