// Engine::load_checkpoint: any number of ranks read a checkpoint saved by any number of ranks.
//
// Phases, each ended by agree() so that a failure stops every rank together:
//   1. rank 0 reads the manifest and checks it against this engine (model, dtype, optimizer);
//   2. every rank opens every shard file (header and index checks) and checksums its share of
//      the files' data; nothing of the engine has changed yet, so a bad checkpoint leaves the
//      run exactly as it was;
//   3. every rank reads the pieces overlapping what it owns under its own layout, restores the
//      step counters, and the parameters are published to every rank's model.
#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <algorithm>
#include <filesystem>
#include <map>

#include "zero/checkpoint_engine.hpp"

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
    ZERO_CKPT_CHECK(man.param_dtype == dtype, path, ": saved with parameter dtype ",
                    man.param_dtype, " but this run uses ", dtype,
                    "; set bf16 / fp16 as in the run that saved it");
    // Same names, shapes and dtype in another registration order: loading goes by name.
  }
  std::vector<std::string> states;
  for (const auto& s : m.opt.optimizer->state()) states.push_back(s.first);
  ZERO_CKPT_CHECK(man.optimizer == m.opt.optimizer->name() && man.state_names == states, path,
                  ": saved with optimizer ", man.optimizer, " (states ", list_text(man.state_names),
                  ") but this run uses ", m.opt.optimizer->name(), " (states ", list_text(states),
                  "); set optimizer.type (and SGD momentum) as "
                  "in the run that saved it");
}

// Fills the master shard and the optimizer states with the pieces of the checkpoint that
// overlap what this rank owns under the current layout.
void fill_shards(Engine::Impl& m, const ckpt::Manifest& man,
                 const std::vector<ckpt::ShardReader>& readers, const ckpt::PieceMap& map) {
  const FlatLayout& L = m.fp.layout;
  const int owner = m.stage == 0 ? 0 : m.group->rank();
  std::vector<at::Tensor> dst{m.fp.master};
  const auto states = m.opt.optimizer->state();
  for (const std::string& name : man.state_names) {
    for (const auto& s : states) {
      if (s.first == name) dst.push_back(s.second);
    }
  }
  // Read straight into CPU tensors; device tensors get a host copy first.
  std::vector<at::Tensor> host;
  for (const at::Tensor& t : dst) host.push_back(t.is_cpu() ? t : at::empty_like(t, at::kCPU));
  // Padding stays zero, as in a fresh engine.
  for (at::Tensor& t : host) t.zero_();
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
  for (size_t t = 0; t < dst.size(); ++t) {
    if (!host[t].is_same(dst[t])) dst[t].copy_(host[t]);
  }
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
  if (m.cfg.fp16.enabled) {
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

  err = ckpt::attempt([&] {
    fill_shards(m, man, readers, map);
    restore_counters(m, man);
    // The generator states belong to ranks; a rank the saved run did not have keeps its own.
    if (rank < man.world_size) {
      const auto& rng = readers[rank].index().rng_state;
      if (!rng.empty()) ckpt::set_cpu_rng_state(rng, readers[rank].path());
    }
  });
  ckpt::agree(m, err, what);
  m.publish_parameters();
  m.sync->zero_grad();
  return tag;
}

}  // namespace zero
