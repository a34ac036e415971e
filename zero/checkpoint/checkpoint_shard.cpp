// Shard files: the index codec, the streaming writer, the validating reader, and the map from
// parameter names to the pieces that tile them.
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <vector>

#include "zero/checkpoint/checkpoint_format.hpp"

namespace zero::ckpt {
namespace {

constexpr char kMagic[8] = {'Z', 'E', 'R', 'O', 'C', 'K', 'P', 'T'};

std::string hex32(uint32_t v) {
  char buf[11];
  std::snprintf(buf, sizeof buf, "0x%08x", v);
  return buf;
}

// Little-endian encoding; explicit bytes rather than memcpy of structs, so the format does not
// depend on the compiler's padding.
struct Encoder {
  std::string out;
  void u32(uint32_t v) {
    for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xFF));
  }
  void u64(uint64_t v) {
    for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xFF));
  }
  void str(const std::string& s) {
    u32(static_cast<uint32_t>(s.size()));
    out += s;
  }
};

struct Decoder {
  const std::string& in;
  const std::string& path;
  size_t pos = 0;
  void need(size_t n) const {
    ZERO_CKPT_CHECK(in.size() - pos >= n, path,
                    ": corrupted: the index ends early (restore the file or load another tag)");
  }
  uint64_t uint(int bytes) {
    need(bytes);
    uint64_t v = 0;
    for (int i = 0; i < bytes; ++i)
      v |= static_cast<uint64_t>(static_cast<uint8_t>(in[pos++])) << (8 * i);
    return v;
  }
  uint32_t u32() { return static_cast<uint32_t>(uint(4)); }
  uint64_t u64() { return uint(8); }
  std::string str() {
    const uint32_t n = u32();
    need(n);
    std::string s = in.substr(pos, n);
    pos += n;
    return s;
  }
};

std::string encode_index(const ShardIndex& x) {
  Encoder e;
  e.u32(static_cast<uint32_t>(x.state_names.size()));
  for (const auto& s : x.state_names) e.str(s);
  e.u64(x.rng_state.size());
  e.out += x.rng_state;
  e.u64(x.entries.size());
  for (const ShardEntry& p : x.entries) {
    e.str(p.name);
    e.u64(static_cast<uint64_t>(p.param_numel));
    e.u64(static_cast<uint64_t>(p.param_offset));
    e.u64(static_cast<uint64_t>(p.count));
    e.u64(p.payload_offset);
  }
  return std::move(e.out);
}

std::string encode_header(const ShardIndex& x, uint64_t index_bytes, uint32_t index_crc) {
  Encoder e;
  e.out.append(kMagic, sizeof kMagic);
  e.u32(kFormatVersion);
  e.u32(static_cast<uint32_t>(x.rank));
  e.u32(static_cast<uint32_t>(x.world));
  e.u32(0);
  e.u64(index_bytes);
  e.u64(x.payload_bytes);
  e.u32(index_crc);
  e.u32(x.payload_crc);
  e.u32(crc32(0, e.out.data(), e.out.size()));
  e.u32(0);
  return std::move(e.out);
}

}  // namespace

uint64_t assign_payload_offsets(ShardIndex& index) {
  const uint64_t tensors = 1 + index.state_names.size();
  uint64_t at = 0;
  for (ShardEntry& e : index.entries) {
    e.payload_offset = at;
    at += tensors * static_cast<uint64_t>(e.count) * sizeof(float);
  }
  index.payload_bytes = at;
  return at;
}

ShardWriter::ShardWriter(std::string path, const ShardIndex& index)
    : path_(std::move(path)), file_(File::create(path_ + ".tmp")), index_(index) {
  index_bytes_ = encode_index(index_);
  // The header carries the payload checksum, known only at the end: reserve it now.
  const std::string placeholder(kHeaderBytes, '\0');
  file_.write_all(placeholder.data(), placeholder.size());
  file_.write_all(index_bytes_.data(), index_bytes_.size());
}

void ShardWriter::append(const float* data, int64_t n) {
  const size_t bytes = static_cast<size_t>(n) * sizeof(float);
  crc_ = crc32(crc_, data, bytes);
  file_.write_all(data, bytes);
  written_ += bytes;
}

WrittenFile ShardWriter::finish() {
  ZERO_CKPT_CHECK(written_ == index_.payload_bytes, path_, ": internal error: wrote ", written_,
                  " payload bytes, the index promises ", index_.payload_bytes);
  index_.payload_crc = crc_;
  const std::string header = encode_header(index_, index_bytes_.size(),
                                           crc32(0, index_bytes_.data(), index_bytes_.size()));
  file_.pwrite_all(header.data(), header.size(), 0);
  file_.sync();
  file_.close();
  std::error_code ec;
  std::filesystem::rename(path_ + ".tmp", path_, ec);
  ZERO_CKPT_CHECK(!ec, "cannot rename ", path_, ".tmp to ", path_, ": ", ec.message());
  return {kHeaderBytes + index_bytes_.size() + written_, crc_};
}

ShardReader::ShardReader(const std::string& path) : file_(File::open_read(path)) {
  file_bytes_ = file_.size();
  const char* redo = " (the write did not finish or the copy was partial; load an earlier tag)";
  ZERO_CKPT_CHECK(file_bytes_ >= kHeaderBytes, path, ": truncated: ", file_bytes_,
                  " bytes, shorter than the ", kHeaderBytes, "-byte header", redo);
  std::string h(kHeaderBytes, '\0');
  file_.pread_all(h.data(), h.size(), 0);
  ZERO_CKPT_CHECK(std::memcmp(h.data(), kMagic, sizeof kMagic) == 0, path,
                  ": not a zero checkpoint shard (bad magic bytes)");
  Decoder d{h, path, sizeof kMagic};
  const uint32_t version = d.u32();
  index_.rank = static_cast<int>(d.u32());
  index_.world = static_cast<int>(d.u32());
  d.u32();  // flags
  const uint64_t index_bytes = d.u64();
  index_.payload_bytes = d.u64();
  const uint32_t index_crc = d.u32();
  index_.payload_crc = d.u32();
  const uint32_t header_crc = d.u32();
  ZERO_CKPT_CHECK(header_crc == crc32(0, h.data(), 48), path,
                  ": corrupted: the header checksum does not match (restore the file or load "
                  "another tag)");
  ZERO_CKPT_CHECK(version == kFormatVersion, path, ": written in checkpoint format version ",
                  version, "; this build reads version ", kFormatVersion,
                  " (use the zero version that wrote it)");
  const uint64_t expected = kHeaderBytes + index_bytes + index_.payload_bytes;
  ZERO_CKPT_CHECK(file_bytes_ >= expected, path, ": truncated: ", file_bytes_,
                  " bytes but its header promises ", expected, redo);
  ZERO_CKPT_CHECK(file_bytes_ == expected, path, ": corrupted: ", file_bytes_ - expected,
                  " bytes after the end its header promises (", expected, ")");

  std::string ib(index_bytes, '\0');
  file_.pread_all(ib.data(), ib.size(), kHeaderBytes);
  const uint32_t got = crc32(0, ib.data(), ib.size());
  ZERO_CKPT_CHECK(got == index_crc, path, ": corrupted: the index checksum is ", hex32(got),
                  " but the header records ", hex32(index_crc),
                  " (restore the file or load another tag)");
  Decoder x{ib, path};
  const uint32_t states = x.u32();
  for (uint32_t i = 0; i < states; ++i) index_.state_names.push_back(x.str());
  const uint64_t rng = x.u64();
  x.need(rng);
  index_.rng_state = ib.substr(x.pos, rng);
  x.pos += rng;
  const uint64_t n = x.u64();
  const uint64_t tensors = 1 + states;
  for (uint64_t i = 0; i < n; ++i) {
    ShardEntry e;
    e.name = x.str();
    e.param_numel = static_cast<int64_t>(x.u64());
    e.param_offset = static_cast<int64_t>(x.u64());
    e.count = static_cast<int64_t>(x.u64());
    e.payload_offset = x.u64();
    ZERO_CKPT_CHECK(
        e.count > 0 && e.param_offset >= 0 && e.param_offset + e.count <= e.param_numel &&
            e.payload_offset + tensors * e.count * sizeof(float) <= index_.payload_bytes,
        path, ": corrupted: the index entry of '", e.name, "' is out of range");
    index_.entries.push_back(std::move(e));
  }
  payload_begin_ = kHeaderBytes + index_bytes;
}

void ShardReader::verify_payload() const {
  constexpr uint64_t kChunk = 8 << 20;
  std::vector<char> buf(std::min<uint64_t>(kChunk, std::max<uint64_t>(index_.payload_bytes, 1)));
  uint32_t crc = 0;
  for (uint64_t at = 0; at < index_.payload_bytes;) {
    const uint64_t n = std::min<uint64_t>(buf.size(), index_.payload_bytes - at);
    file_.pread_all(buf.data(), n, payload_begin_ + at);
    crc = crc32(crc, buf.data(), n);
    at += n;
  }
  ZERO_CKPT_CHECK(crc == index_.payload_crc, path(), ": corrupted: the data checksum is ",
                  hex32(crc), " but the header records ", hex32(index_.payload_crc),
                  " (a damaged disk or a partial copy; restore the file or load another tag)");
}

void ShardReader::read(const ShardEntry& e, int tensor, int64_t first, int64_t n,
                       float* dst) const {
  const uint64_t off = payload_begin_ + e.payload_offset +
                       (static_cast<uint64_t>(tensor) * e.count + first) * sizeof(float);
  file_.pread_all(dst, static_cast<size_t>(n) * sizeof(float), off);
}

PieceMap build_piece_map(const Manifest& m, const std::vector<ShardReader>& readers,
                         const std::string& dir) {
  std::unordered_map<std::string, int64_t> numel;
  for (const CheckpointParam& p : m.params) {
    int64_t n = 1;
    for (int64_t s : p.shape) n *= s;
    numel[p.name] = n;
  }
  PieceMap map;
  for (size_t f = 0; f < readers.size(); ++f) {
    const ShardReader& r = readers[f];
    const ShardIndex& x = r.index();
    const Manifest::FileInfo& info = m.files[f];
    ZERO_CKPT_CHECK(x.rank == static_cast<int>(f) && x.world == m.world_size, r.path(),
                    ": holds rank ", x.rank, " of ", x.world, " but the manifest expects rank ", f,
                    " of ", m.world_size, " (files of different saves were mixed)");
    ZERO_CKPT_CHECK(r.file_bytes() == info.bytes && x.payload_crc == info.payload_crc, r.path(),
                    ": ", r.file_bytes(), " bytes with data checksum ", hex32(x.payload_crc),
                    ", but ", dir, "/manifest.json records ", info.bytes, " bytes and ",
                    hex32(info.payload_crc), " (the file is from another save or was replaced)");
    ZERO_CKPT_CHECK(x.state_names == m.state_names, r.path(),
                    ": its optimizer states differ from the manifest's");
    for (const ShardEntry& e : x.entries) {
      auto it = numel.find(e.name);
      ZERO_CKPT_CHECK(it != numel.end(), r.path(), ": holds parameter '", e.name,
                      "' that the manifest does not list");
      ZERO_CKPT_CHECK(it->second == e.param_numel, r.path(), ": parameter '", e.name, "' has ",
                      e.param_numel, " elements here but ", it->second, " in the manifest");
      map[e.name].push_back({static_cast<int>(f), &e});
    }
  }
  for (const CheckpointParam& p : m.params) {
    auto& pieces = map[p.name];
    std::sort(pieces.begin(), pieces.end(), [](const PieceRef& a, const PieceRef& b) {
      return a.entry->param_offset < b.entry->param_offset;
    });
    int64_t next = 0;
    for (const PieceRef& r : pieces) {
      ZERO_CKPT_CHECK(r.entry->param_offset == next, dir, ": parameter '", p.name, "': elements ",
                      std::min(next, r.entry->param_offset), "..",
                      std::max(next, r.entry->param_offset),
                      (r.entry->param_offset > next ? " are in no shard file"
                                                    : " are in more than one shard file"),
                      " (files of different saves were mixed)");
      next += r.entry->count;
    }
    ZERO_CKPT_CHECK(next == numel[p.name], dir, ": parameter '", p.name, "': elements ", next, "..",
                    numel[p.name], " are in no shard file (an incomplete checkpoint)");
  }
  return map;
}

}  // namespace zero::ckpt
