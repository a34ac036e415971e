// The error-feedback residuals of zero_quantized_gradients in checkpoints: each rank writes its
// own (they are what that rank's quantization dropped, in its bucket layout) to
// error_feedback.rank<r>_of_<N>.pt beside its shard file, and reads it back on resume, so a
// resumed run sends exactly what the uninterrupted one would have. Each residual is written in
// its storage dtype (fp32, bf16, fp16; int8 storage as its fp32 values) and converted on load, so
// a run may resume under another zero_quantized_gradients_error_feedback_dtype (rounded once).
//
// Each file carries a fingerprint of the bucket layout its rows follow (every bucket's
// parameters by name, size and offset, the world size, the chunk size): a residual saved under
// another layout with buffers of the same sizes (parameters registered in another order, another
// reduce_bucket_size) would otherwise load into the wrong elements without a word. A mismatch,
// or a file from before the fingerprint, drops them with the warning below.
//
// Resharding drops them: a residual is laid out as the world x shard rows of each bucket of the
// saved world size, and what it holds (at most half a quantization step per element, summed
// over ranks) is not worth a redistribution that would have to read every saved rank's file.
// The first steps after such a load then carry one step's quantization error, as the first
// steps of a run do; rank 0 says so.
#include <torch/serialize.h>

#include <filesystem>
#include <iostream>
#include <sstream>

#include "zero/engine/engine_checkpoint.hpp"

namespace zero::ckpt {
namespace fs = std::filesystem;

namespace {

// FNV-1a over what the residual rows are laid out by.
int64_t layout_fingerprint(const FlatLayout& L) {
  uint64_t h = 1469598103934665603ull;
  auto mix = [&](const void* data, size_t n) {
    const auto* p = static_cast<const unsigned char*>(data);
    for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 1099511628211ull;
  };
  auto mix_int = [&](int64_t v) { mix(&v, sizeof v); };
  mix_int(L.world());
  mix_int(L.chunk_numel());
  for (const BucketSlot& b : L.buckets()) {
    mix_int(b.flat_offset);
    mix_int(b.shard.numel);
    for (int pi : b.params) {
      const ParamSlot& p = L.params()[pi];
      mix(p.name.data(), p.name.size() + 1);  // with the terminator: "ab","c" != "a","bc"
      mix_int(p.numel);
      mix_int(p.flat_offset);
    }
  }
  return static_cast<int64_t>(h);
}

std::string hex(int64_t v) {
  std::ostringstream os;
  os << std::hex << static_cast<uint64_t>(v);
  return os.str();
}

}  // namespace

std::string error_feedback_file(int rank, int world) {
  return "error_feedback.rank" + std::to_string(rank) + "_of_" + std::to_string(world) + ".pt";
}

void save_error_feedback(Engine::Impl& m, const std::string& dir) {
  compress::ErrorFeedback* ef = m.sync->reducer().error_feedback();
  if (!ef) return;
  const compress::ErrorFeedback::State s = ef->state();
  std::vector<at::Tensor> out{at::tensor(
      {static_cast<int64_t>(s.bits), s.block, layout_fingerprint(m.fp.layout)}, at::kLong)};
  for (const at::Tensor& r : s.residuals) out.push_back(r.cpu());
  const fs::path path = fs::path(dir) / error_feedback_file(m.group->rank(), m.group->size());
  torch::save(out, path.string());
}

void load_error_feedback(Engine::Impl& m, const std::string& tag_dir, int saved_world,
                         const std::string& drop_reason) {
  compress::ErrorFeedback* ef = m.sync->reducer().error_feedback();
  if (!ef) return;
  const int rank = m.group->rank(), world = m.group->size();
  const fs::path path = fs::path(tag_dir) / error_feedback_file(rank, world);
  auto drop = [&](const std::string& why) {
    ef->reset();
    if (rank == 0) {
      std::cerr << "zero: warning: " << tag_dir << ": the error-feedback residuals start at zero ("
                << why << "); the next step carries one step's quantization error\n";
    }
  };
  if (!drop_reason.empty()) {
    drop(drop_reason);
    return;
  }
  if (saved_world != world) {
    drop("the checkpoint was saved by " + std::to_string(saved_world) + " ranks, this run has " +
         std::to_string(world) + ": resharding drops them");
    return;
  }
  if (!fs::exists(path)) {
    drop("the checkpoint has none: it was saved without zero_quantized_gradients error feedback");
    return;
  }
  std::vector<at::Tensor> in;
  torch::load(in, path.string());
  TORCH_CHECK(!in.empty() && (in[0].numel() == 2 || in[0].numel() == 3), "zero: ",
              path.string(), " is not an error-feedback file");
  if (in[0].numel() == 2) {
    drop("saved without a bucket-layout fingerprint (an older checkpoint): whether its rows "
         "are this run's layout cannot be told");
    return;
  }
  const int64_t saved_layout = in[0][2].item<int64_t>();
  const int64_t layout = layout_fingerprint(m.fp.layout);
  if (saved_layout != layout) {
    drop("saved under bucket layout " + hex(saved_layout) + ", this run's is " + hex(layout) +
         " (" + std::to_string(m.fp.layout.buckets().size()) +
         " buckets): the parameters' order or sizes, reduce_bucket_size or the world size "
         "changed, so the residuals would land on other elements");
    return;
  }
  compress::ErrorFeedback::State s;
  s.bits = static_cast<int>(in[0][0].item<int64_t>());
  s.block = in[0][1].item<int64_t>();
  if (s.bits != ef->bits() || s.block != ef->block()) {
    drop("saved with zero_quantized_gradients_bits " + std::to_string(s.bits) + ", block " +
         std::to_string(s.block) + "; this run uses " + std::to_string(ef->bits()) + ", " +
         std::to_string(ef->block()));
    return;
  }
  s.residuals.assign(in.begin() + 1, in.end());
  if (s.residuals.size() != ef->buffers()) {
    // The hierarchical exchange keeps a second residual per reduction, in another row order.
    drop("saved with " + std::to_string(s.residuals.size()) + " residual buffers, this run has " +
         std::to_string(ef->buffers()) +
         ": the exchange changed between flat and hierarchical (zero_quantized_gradients_"
         "hierarchical, or the ranks per node)");
    return;
  }
  ef->load_state(s);  // checks every buffer's size before it copies any
}

}  // namespace zero::ckpt
