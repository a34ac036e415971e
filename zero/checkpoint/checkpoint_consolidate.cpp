// Reading a sharded checkpoint back as whole tensors, without a process group, and writing
// safetensors: what tools/zero-consolidate does, as functions tests can call.
#include <ATen/ATen.h>

#include <algorithm>
#include <filesystem>

#include "zero/checkpoint/checkpoint_format.hpp"

namespace zero {
namespace fs = std::filesystem;

std::vector<std::pair<std::string, at::Tensor>> read_consolidated(const std::string& dir,
                                                                  const std::string& tag,
                                                                  const std::string& state) {
  const std::string t = ckpt::resolve_tag(dir, tag);
  const std::string tag_dir = (fs::path(dir) / t).string();
  const std::string path = tag_dir + "/manifest.json";
  const ckpt::Manifest man = ckpt::parse_manifest(
      ckpt::read_text(path, "a save that did not finish writes no manifest; load another tag"),
      path);
  int tensor = 0;
  if (state != "master") {
    const auto it = std::find(man.state_names.begin(), man.state_names.end(), state);
    std::string known = "master";
    for (const auto& s : man.state_names) known += ", " + s;
    ZERO_CKPT_CHECK(it != man.state_names.end(), path, ": the checkpoint has no tensor kind '",
                    state, "'; it has: ", known);
    tensor = 1 + static_cast<int>(it - man.state_names.begin());
  }
  std::vector<ckpt::ShardReader> readers;
  readers.reserve(man.files.size());
  for (const auto& f : man.files) readers.emplace_back(tag_dir + "/" + f.name);
  const ckpt::PieceMap map = ckpt::build_piece_map(man, readers, tag_dir);
  for (const auto& r : readers) r.verify_payload();

  std::vector<std::pair<std::string, at::Tensor>> out;
  for (const CheckpointParam& p : man.params) {
    ZERO_CKPT_CHECK(p.whole(), path, ": parameter '", p.name,
                    "' is saved as a part of a larger tensor (tensor parallel); consolidating "
                    "parts is not supported yet");
    int64_t numel = 1;
    for (int64_t d : p.shape) numel *= d;
    at::Tensor full = at::empty({numel}, at::kFloat);
    for (const ckpt::PieceRef& ref : map.at(p.name)) {
      readers[ref.file].read(*ref.entry, tensor, 0, ref.entry->count,
                             full.data_ptr<float>() + ref.entry->param_offset);
    }
    out.emplace_back(p.name, full.view(p.shape));
  }
  return out;
}

void write_safetensors(const std::string& path,
                       const std::vector<std::pair<std::string, at::Tensor>>& tensors,
                       at::ScalarType dtype, const std::map<std::string, std::string>& metadata) {
  ZERO_CKPT_CHECK(dtype == at::kFloat || dtype == at::kBFloat16, path,
                  ": safetensors output supports fp32 and bf16, not ", c10::toString(dtype));
  const char* code = dtype == at::kFloat ? "F32" : "BF16";
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
