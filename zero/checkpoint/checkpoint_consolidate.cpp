// Reading a sharded checkpoint back as whole tensors, without a process group, and writing
// safetensors: what tools/zero-consolidate does, as functions tests can call.
#include <ATen/ATen.h>

#include <algorithm>
#include <filesystem>

#include "zero/checkpoint/checkpoint_format.hpp"
#include "zero/checkpoint/checkpoint_parts.hpp"

namespace zero {
namespace fs = std::filesystem;

std::vector<std::pair<std::string, at::Tensor>> read_consolidated(const std::string& dir,
                                                                  const std::string& tag,
                                                                  const std::string& state) {
  return read_consolidated(std::vector<std::string>{dir}, tag, state);
}

std::vector<std::pair<std::string, at::Tensor>> read_consolidated(
    const std::vector<std::string>& dirs, const std::string& tag, const std::string& state) {
  ZERO_CKPT_CHECK(!dirs.empty(), "zero: read_consolidated: no checkpoint directory given");
  const std::string t = ckpt::resolve_tag(dirs.front(), tag);
  std::vector<ckpt::Source> sources;
  sources.reserve(dirs.size());
  for (const std::string& dir : dirs) {
    const std::string tag_dir = (fs::path(dir) / t).string();
    const std::string path = tag_dir + "/manifest.json";
    sources.push_back(ckpt::open_source(
        tag_dir, ckpt::parse_manifest(ckpt::read_text(path,
                                                      "a save that did not finish writes "
                                                      "no manifest; load another tag"),
                                      path)));
    const ckpt::Source& src = sources.back();
    ZERO_CKPT_CHECK(src.man.optimizer_steps == sources.front().man.optimizer_steps, path,
                    ": saved at optimizer step ", src.man.optimizer_steps, " but ",
                    sources.front().tag_dir, " at step ", sources.front().man.optimizer_steps,
                    " (the directories are not the tensor-parallel ranks of one save)");
  }
  const ckpt::Manifest& man = sources.front().man;
  const std::string path = sources.front().tag_dir + "/manifest.json";
  int tensor = 0;
  if (state != "master") {
    const auto it = std::find(man.state_names.begin(), man.state_names.end(), state);
    std::string known = "master";
    for (const auto& s : man.state_names) known += ", " + s;
    ZERO_CKPT_CHECK(it != man.state_names.end(), path, ": the checkpoint has no tensor kind '",
                    state, "'; it has: ", known);
    tensor = 1 + static_cast<int>(it - man.state_names.begin());
  }
  const ckpt::PartMap parts(sources);
  for (const auto& src : sources) {
    for (const auto& r : src.readers) r.verify_payload();
  }

  std::vector<std::pair<std::string, at::Tensor>> out;
  for (const std::string& name : parts.names()) {
    const std::vector<int64_t>& shape = parts.global_shape(name);
    const CheckpointParam whole{name, shape, shape, std::vector<int64_t>(shape.size(), 0)};
    int64_t numel = 1;
    for (int64_t d : shape) numel *= d;
    at::Tensor full = at::empty({numel}, at::kFloat);
    const int64_t got = parts.read(whole, tensor, 0, numel, nullptr);
    ZERO_CKPT_CHECK(got == numel, path, ": parameter '", name, "' ", c10::IntArrayRef(shape),
                    ": the checkpoint holds ", got, " of its ", numel,
                    " elements: it is split over tensor-parallel ranks; give every rank's "
                    "directory (zero-consolidate --checkpoint SAVE_DIR finds SAVE_DIR/tp0, "
                    "tp1, ...)");
    parts.read(whole, tensor, 0, numel, full.data_ptr<float>());
    out.emplace_back(name, full.view(shape));
  }
  return out;
}

std::vector<std::string> checkpoint_dirs(const std::string& save_dir, const std::string& tag) {
  std::error_code ec;
  // A layout qualifies when its first directory holds the tag (or a latest); its steps decide.
  // One that cannot be read (a damaged latest or manifest) qualifies with 0 steps: the load
  // that follows names what is wrong with it.
  auto steps_of = [&](const std::string& dir) -> int64_t {
    try {
      const std::string t = tag.empty() ? latest_checkpoint_tag(dir) : tag;
      if (t.empty() || !fs::exists(fs::path(dir) / t / "manifest.json", ec)) return -1;
      return read_checkpoint_info(dir, t).optimizer_steps;
    } catch (const std::exception&) {
      return 0;
    }
  };
  const std::string tp0 = (fs::path(save_dir) / "tp0").string();
  const int64_t flat = steps_of(save_dir);
  const int64_t split = fs::is_directory(tp0, ec) ? steps_of(tp0) : -1;
  if (flat < 0 && split < 0) return {};
  if (split <= flat) return {save_dir};
  // How many tensor-parallel ranks saved it: the parts tp0 records say (a directory tp<r> left
  // over from a run with more ranks is not part of this save).
  CheckpointInfo info;
  try {
    info = read_checkpoint_info(tp0, tag);
  } catch (const std::exception&) {
    return {tp0};  // loading it says why it cannot be read
  }
  int64_t ranks = 1;
  for (const CheckpointParam& p : info.params) {
    int64_t part = 1, whole = 1;
    for (int64_t d : p.shape) part *= d;
    for (int64_t d : p.global_shape) whole *= d;
    if (part > 0) ranks = std::max(ranks, whole / part);
  }
  std::vector<std::string> out;
  for (int64_t r = 0; r < ranks; ++r) {
    out.push_back((fs::path(save_dir) / ("tp" + std::to_string(r))).string());
  }
  return out;
}

void write_safetensors(const std::string& path,
                       const std::vector<std::pair<std::string, at::Tensor>>& tensors,
                       at::ScalarType dtype, const std::map<std::string, std::string>& metadata) {
  ZERO_CKPT_CHECK(dtype == at::kFloat || dtype == at::kBFloat16 || dtype == at::kHalf, path,
                  ": safetensors output supports fp32, bf16 and fp16, not ", c10::toString(dtype));
  const char* code = dtype == at::kFloat ? "F32" : dtype == at::kBFloat16 ? "BF16" : "F16";
  std::vector<at::Tensor> data;
  std::string header = "{\"__metadata__\":{";
  bool first = true;
  for (const auto& [k, v] : metadata) {
    header += std::string(first ? "" : ",") + ckpt::json_quote(k) + ":" + ckpt::json_quote(v);
    first = false;
  }
  header += "}";
  uint64_t offset = 0;
  for (const auto& [name, t] : tensors) {
    at::Tensor c = t.detach().to(at::kCPU, dtype).contiguous();
    header += "," + ckpt::json_quote(name) + ":{\"dtype\":\"" + code + "\",\"shape\":[";
    for (int64_t d = 0; d < c.dim(); ++d) header += (d ? "," : "") + std::to_string(c.size(d));
    const uint64_t end = offset + c.nbytes();
    header += "],\"data_offsets\":[" + std::to_string(offset) + "," + std::to_string(end) + "]}";
    offset = end;
    data.push_back(std::move(c));
  }
  header += "}";
  // The format allows trailing spaces; 8-byte alignment lets readers map the data in place.
  header.append((8 - header.size() % 8) % 8, ' ');

  std::error_code ec;
  ZERO_CKPT_CHECK(!fs::is_directory(path, ec), path,
                  ": is a directory; give the path of the safetensors file to write");
  const std::string tmp = path + ".tmp";
  ckpt::File f = ckpt::File::create(tmp);
  uint8_t len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<uint8_t>((header.size() >> (8 * i)) & 0xFF);
  f.write_all(len, sizeof len);
  f.write_all(header.data(), header.size());
  for (const at::Tensor& c : data) f.write_all(c.data_ptr(), c.nbytes());
  f.sync();
  f.close();
  fs::rename(tmp, path, ec);
  if (ec) {
    std::error_code ignored;
    fs::remove(tmp, ignored);  // never leave the half-published file behind
  }
  ZERO_CKPT_CHECK(!ec, "cannot rename ", tmp, " to ", path, ": ", ec.message());
}

}  // namespace zero
