// Engine::save_checkpoint: every rank writes its pieces into dir/tag.tmp/, rank 0 adds the
// manifest, renames the directory to dir/tag and only then points dir/latest at it. A crash at
// any point leaves the previous checkpoint and `latest` as they were.
//
// At stage 3 a rank's pieces are its shard of every unit, as at stages 1-2 its shard of the one
// unit: no rank gathers the model, and the files are the same format (pieces by parameter name),
// so a stage-3 save loads at any stage and world size. The manifest also lists the units.
#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <algorithm>
#include <filesystem>
#include <functional>

#include "zero/errors.hpp"
#include "zero/engine/engine_checkpoint.hpp"

namespace zero {
namespace fs = std::filesystem;
namespace {

ckpt::WrittenFile write_shard(Engine::Impl& m, const fs::path& tmp_dir) {
  const FlatLayout& L = m.fp.layout;
  const int rank = m.group->rank(), world = m.group->size();
  // Stage 0 keeps every value on every rank: rank 0 writes them, the others only their RNG.
  // Each unit's pieces, in layout order.
  std::vector<std::pair<const ShardedUnit*, OwnedPiece>> pieces;
  if (m.sharding.optimizer || rank == 0) {
    for (const auto& u : m.units) {
      for (const OwnedPiece& p : u->owned_pieces()) pieces.emplace_back(u.get(), p);
    }
  }
  ckpt::ShardIndex index;
  index.rank = rank;
  index.world = world;
  index.rng_state = ckpt::rng_state(m.fp.device());
  // Every unit steps the same optimizer: the state names are the first's.
  for (const auto& s : m.units.front()->optimizer_window()) index.state_names.push_back(s.first);
  for (const auto& [u, p] : pieces) {
    const ParamSlot& slot = L.params()[p.param];
    index.entries.push_back({slot.name, slot.numel, p.param_offset, p.numel, 0});
  }
  ckpt::assign_payload_offsets(index);
  ckpt::ShardWriter w((tmp_dir / ckpt::shard_file_name(rank, world)).string(), index);
  // Piece by piece from the master and the states where they are (sharded fp32: the master is
  // this rank's slot of each bucket of the flat buffer), through a host buffer of at most one
  // bucket's shard for states outside host memory: a save holds no copy of a whole shard.
  const int64_t chunk = std::max<int64_t>(L.chunk_numel(), 1);
  at::Tensor staging;
  for (const auto& [u, p] : pieces) {
    std::vector<at::Tensor> from{u->master_window(L.buckets()[L.params()[p.param].bucket])};
    for (const auto& s : u->optimizer_window()) from.push_back(s.second);
    for (const at::Tensor& t : from) {
      for (int64_t at = 0; at < p.numel; at += chunk) {
        const int64_t n = std::min(chunk, p.numel - at);
        const at::Tensor piece = t.narrow(0, p.shard_offset + at, n);
        if (piece.is_cpu()) {
          w.append(piece.data_ptr<float>(), n);
          continue;
        }
        // Page-locked: a device-to-host copy into pageable memory goes through the driver's own
        // bounce buffer at a fraction of the bandwidth.
        if (!staging.defined()) staging = ckpt::checkpoint_staging(m, chunk);
        staging.narrow(0, 0, n).copy_(piece);
        w.append(staging.data_ptr<float>(), n);
      }
    }
  }
  return w.finish();
}

ckpt::Manifest make_manifest(const Engine::Impl& m, const std::string& tag,
                             const at::Tensor& file_stats) {
  ckpt::Manifest man;
  man.tag = tag;
  man.world_size = m.group->size();
  man.stage = m.sharding.stage();
  man.param_dtype = ckpt::current_dtype(m);
  man.params = ckpt::current_params(m);
  if (m.sharding.params) {
    const FlatLayout& L = m.fp.layout;
    for (const auto& u : m.units) {
      const UnitSlot& s = u->slot();
      ckpt::Manifest::Unit rec{u->name(), {}, {}, s.flat_end - s.flat_begin};
      for (int li : s.params) {
        rec.params.push_back(L.params()[li].name);
        rec.offsets.push_back(L.params()[li].flat_offset - s.flat_begin);
      }
      man.units.push_back(std::move(rec));
    }
  }
  man.fingerprint = ckpt::run_fingerprint(man.params, man.param_dtype);
  man.optimizer = m.store.optimizer->name();
  for (const auto& s : m.store.optimizer->state()) man.state_names.push_back(s.first);
  man.param_groups = param_groups_text(m.cfg.optimizer.param_groups);
  man.optimizer_internal_steps = m.store.optimizer->steps();
  man.optimizer_steps = m.stats.optimizer_steps;
  man.micro_steps = m.stats.micro_steps;
  man.skipped_steps = m.stats.skipped_steps;
  man.accumulation = m.accumulation;
  man.last_grad_norm = m.stats.last_grad_norm;
  const LossScaler::State s = m.scaler.state();
  man.loss_scale = s.scale;
  man.scaler_iter = s.iter;
  man.scaler_last_overflow_iter = s.last_overflow_iter;
  man.scaler_hysteresis_left = s.hysteresis_left;
  man.config_source = m.cfg.source;
  // The file as written (before --set overrides; `config` has the resolved values).
  std::error_code ec;
  if (fs::is_regular_file(m.cfg.source, ec) && fs::file_size(m.cfg.source, ec) < (1 << 20)) {
    man.config_text = ckpt::read_text(m.cfg.source, "the config file");
  }
  man.config = ckpt::config_values(m.cfg);
  const int64_t* v = file_stats.data_ptr<int64_t>();
  for (int r = 0; r < man.world_size; ++r) {
    man.files.push_back({ckpt::shard_file_name(r, man.world_size), static_cast<uint64_t>(v[2 * r]),
                         static_cast<uint32_t>(v[2 * r + 1])});
  }
  return man;
}

// The save once every rank entered it: the directory, the shards, the manifest, `latest`.
// `weights16` set (stage 3 with stage3_gather_16bit_weights_on_model_save): a collective giving
// rank 0 the whole model in the compute dtype, written as tag/model.safetensors.
void save_into(Engine::Impl& m, const std::string& tag, const fs::path& root,
               const fs::path& final_dir, const fs::path& tmp_dir, int keep_last,
               const std::string& what, const std::function<StateDict()>& weights16);

}  // namespace

void Engine::save_checkpoint(const std::string& dir, const std::string& tag_arg, int keep_last) {
  auto& m = *impl_;
  at::NoGradGuard no_grad;
  m.settle();  // the counters below must include the last step's outcome
  const std::string tag =
      tag_arg.empty() ? "step" + std::to_string(m.stats.optimizer_steps) : tag_arg;
  // Checks every rank makes alike, so they may throw before the first collective.
  ckpt::check_tag(tag);
  ZERO_CKPT_CHECK(!dir.empty(), "zero: save_checkpoint needs a directory (trainer.save_dir)");
  ZERO_CKPT_CHECK(m.stats.micro_steps % m.accumulation == 0, "zero: save_checkpoint at micro-step ",
                  m.stats.micro_steps, " is inside a gradient-accumulation window of ",
                  m.accumulation,
                  " micro-steps, whose gradients a checkpoint does not keep; save right after "
                  "engine.step() returned true");
  const std::string what = "save_checkpoint('" + dir + "', '" + tag + "')";
  const fs::path root(dir);
  const fs::path final_dir = root / tag;
  const fs::path tmp_dir = root / (tag + ".tmp");
  const int rank = m.group->rank();
  // Before anything is written: a rank whose peers never come (a save on rank 0 only) hears so
  // within seconds and leaves no directory behind.
  try {
    m.enter("save_checkpoint");
  } catch (const CommError& e) {
    throw CheckpointError(e.what());
  }
  // Stage 3 on a device: the last backward's gather-order comparison first, so that a pass that
  // mixed its units' shards fails here rather than being saved (units/order_check.hpp).
  if (m.unit_runtime) m.unit_runtime->settle_order(*m.unit_group, m.fp.device());
  // DeepSpeed's save_16bit_model: only stage 3 reads the key (below it the config warns).
  std::function<StateDict()> weights16;
  if (m.sharding.params && m.cfg.zero_optimization.stage3.gather_16bit_weights_on_model_save) {
    weights16 = [this] { return state_dict({.master = false, .to_rank = 0, .cpu = true}); };
  }
  try {
    save_into(m, tag, root, final_dir, tmp_dir, keep_last, what, weights16);
  } catch (...) {
    // A failed save leaves no half-written tag.tmp (rank 0 made it; every rank fails alike).
    if (rank == 0) {
      std::error_code ec;
      fs::remove_all(tmp_dir, ec);
    }
    throw;
  }
}

namespace {

void save_into(Engine::Impl& m, const std::string& tag, const fs::path& root,
               const fs::path& final_dir, const fs::path& tmp_dir, int keep_last,
               const std::string& what, const std::function<StateDict()>& weights16) {
  const std::string dir = root.string();
  const int rank = m.group->rank(), world = m.group->size();
  std::string err;
  if (rank == 0) {
    err = ckpt::attempt([&] {
      fs::create_directories(root);
      fs::remove_all(tmp_dir);  // left by a save that crashed
      fs::create_directory(tmp_dir);
    });
  }
  ckpt::agree(m, err, what);

  ckpt::WrittenFile written;
  err = ckpt::attempt([&] {
    written = write_shard(m, tmp_dir);
    ckpt::save_error_feedback(m, tmp_dir.string());
  });
  ckpt::agree(m, err, what);

  if (weights16) {
    // Gathered unit by unit from the masters (rounded as the step rounds them); rank 0 holds
    // the whole model once, in host memory, as DeepSpeed's consolidated 16-bit state dict does.
    err = ckpt::attempt([&] {
      const StateDict weights = weights16();
      if (rank != 0) return;
      write_safetensors((tmp_dir / "model.safetensors").string(), weights, m.param_dtype,
                        {{"format", "pt"},
                         {"zero.tag", tag},
                         {"zero.optimizer_steps", std::to_string(m.stats.optimizer_steps)}});
    });
    ckpt::agree(m, err, what);
  }

  at::Tensor mine =
      at::tensor({static_cast<int64_t>(written.bytes), static_cast<int64_t>(written.payload_crc)},
                 at::kLong)
          .to(m.fp.device());
  at::Tensor all = at::empty({2 * world}, mine.options());
  m.group->all_gather(all, mine, "all_gather of checkpoint file sizes").wait();
  all = all.cpu();

  if (rank == 0) {
    err = ckpt::attempt([&] {
      const ckpt::Manifest man = make_manifest(m, tag, all);
      ckpt::write_file_atomic((tmp_dir / "manifest.json").string(), ckpt::manifest_to_json(man));
      ckpt::fsync_dir(tmp_dir.string());
      ckpt::publish_dir(tmp_dir.string(), final_dir.string());
      ckpt::write_file_atomic((root / "latest").string(), tag + "\n");
      prune_checkpoints(dir, keep_last);
    });
  }
  ckpt::agree(m, err, what);
}

}  // namespace

}  // namespace zero
