// Engine::load_checkpoint: any number of ranks read a checkpoint saved by any number of ranks.
//
// Phases, each ended by agree() so that a failure stops every rank together:
//   1. rank 0 reads the manifest and checks it against this engine (model, dtype, optimizer);
//   2. every rank opens every shard file (header and index checks) and checksums its share of
//      the files' data; nothing of the engine has changed yet, so a bad checkpoint leaves the
//      run exactly as it was;
//   3. every rank reads the pieces overlapping what it owns under its own layout into host
//      memory (still nothing changed), restores its random generators, and only then copies
//      them into the masters and optimizer states, restores the step counters, and the
//      parameters are published to every rank's model.
#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <algorithm>
#include <filesystem>
#include <iostream>
#include <map>

#include "zero/engine_checkpoint.hpp"

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

// Reads the pieces of the checkpoint that overlap what this rank owns under the current layout
// into host tensors: first the master shard, then the optimizer states (state() order). Nothing
// of the engine changes here, so a checkpoint that turns out bad leaves the run as it was.
std::vector<at::Tensor> read_shards(const Engine::Impl& m, const ckpt::Manifest& man,
                                    const std::vector<ckpt::ShardReader>& readers,
                                    const ckpt::PieceMap& map) {
  const FlatLayout& L = m.fp.layout;
  const int owner = m.stage == 0 ? 0 : m.group->rank();
  // Padding stays zero, as in a fresh engine.
  std::vector<at::Tensor> host;
  const auto f32 = at::TensorOptions().dtype(at::kFloat);
  host.push_back(at::zeros({L.shard_numel()}, f32));
  for (size_t i = 0; i < man.state_names.size(); ++i) host.push_back(at::zeros_like(host[0]));
  for (const OwnedPiece& p : L.owned_pieces(owner)) {
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
      for (size_t t = 0; t < host.size(); ++t) {
        readers[ref.file].read(*ref.entry, static_cast<int>(t), lo - eb, hi - lo,
                               host[t].data_ptr<float>() + p.shard_offset + (lo - begin));
      }
      covered += hi - lo;
    }
    ZERO_CKPT_CHECK(covered == p.numel, "zero: parameter '", name, "' elements ", begin, "..", end,
                    " are only partly in the checkpoint");
  }
  return host;
}

// Copies what read_shards read into the master shard and the optimizer states.
void commit_shards(Engine::Impl& m, const ckpt::Manifest& man,
                   const std::vector<at::Tensor>& host) {
  m.fp.set_master_shard(host[0]);
  const auto states = m.opt.optimizer->state();
  for (size_t i = 0; i < man.state_names.size(); ++i) {
    for (const auto& s : states) {
      if (s.first == man.state_names[i]) s.second.copy_(host[1 + i]);
    }
  }
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

  // Everything is read and checked on every rank before anything of the engine changes.
  std::vector<at::Tensor> host;
  err = ckpt::attempt([&] { host = read_shards(m, man, readers, map); });
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
  commit_shards(m, man, host);
  restore_counters(m, man);
  warn_dtype_change(m, man, tag_dir);
  m.publish_parameters();
  m.sync->zero_grad();
  return tag;
}

}  // namespace zero
