// The on-disk checkpoint format, shared by Engine::save/load_checkpoint and the consolidator.
// Private to zero/.
//
// Shard file (little-endian):
//   header  56 bytes: magic "ZEROCKPT", u32 version, u32 rank, u32 world, u32 flags (0),
//           u64 index_bytes, u64 payload_bytes, u32 index_crc, u32 payload_crc, u32 header_crc
//           (of the 48 bytes before it), u32 zero
//   index   u32 #states, #states x str; u64 #rng bytes, bytes; u64 #entries, #entries x
//           {str name, u64 param_numel, u64 param_offset, u64 count, u64 payload_offset}
//   payload per entry: (1 + #states) blocks of `count` fp32: master values, then each state
// str = u32 length + bytes. A piece is a contiguous range of one parameter in its logical
// (row-major, unpadded) element order, so any layout can pick what it owns: resharding.
#pragma once

#include <cstdint>
#include <sstream>
#include <string>
#include <unordered_map>
#include <vector>

#include "zero/checkpoint_io.hpp"

namespace zero::ckpt {

constexpr uint32_t kFormatVersion = 1;
constexpr uint64_t kHeaderBytes = 56;

// Throws CheckpointError with the pieces streamed together (like TORCH_CHECK).
template <typename... Args>
[[noreturn]] void fail(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  throw CheckpointError(os.str());
}
#define ZERO_CKPT_CHECK(cond, ...)                \
  do {                                            \
    if (!(cond)) ::zero::ckpt::fail(__VA_ARGS__); \
  } while (0)

// IEEE CRC-32 (zlib's crc32), chainable: crc = crc32(crc, data, n), starting from 0.
uint32_t crc32(uint32_t crc, const void* data, size_t n);
// FNV-1a 64, as 16 hex digits: run fingerprints.
std::string fnv1a_hex(const std::string& text);

// A POSIX file descriptor, closed on destruction. Every error names the path.
class File {
 public:
  static File open_read(const std::string& path);
  static File create(const std::string& path);  // truncates
  File(File&& o) noexcept;
  File& operator=(File&& o) noexcept;
  File(const File&) = delete;
  ~File();

  void write_all(const void* data, size_t n);
  void pwrite_all(const void* data, size_t n, uint64_t offset);
  // Throws "truncated" when the file ends before offset + n.
  void pread_all(void* data, size_t n, uint64_t offset) const;
  uint64_t size() const;
  void sync();  // fsync: the data is on disk before a rename makes it visible
  void close();
  const std::string& path() const { return path_; }

 private:
  File(int fd, std::string path) : fd_(fd), path_(std::move(path)) {}
  int fd_ = -1;
  std::string path_;
};

void fsync_dir(const std::string& dir);
// path.tmp, fsync, rename over path, fsync the directory: readers see old or new, never half.
void write_file_atomic(const std::string& path, const std::string& bytes);
// Throws "<path>: missing (<hint>)" when there is no such file.
std::string read_text(const std::string& path, const std::string& hint);
// Makes `tmp_dir` visible as `final_dir`, replacing an existing one atomically where the
// filesystem can swap directories (renameat2 RENAME_EXCHANGE).
void publish_dir(const std::string& tmp_dir, const std::string& final_dir);

std::string shard_file_name(int rank, int world);

struct ShardEntry {
  std::string name;
  int64_t param_numel = 0;
  int64_t param_offset = 0;
  int64_t count = 0;
  uint64_t payload_offset = 0;  // bytes from the payload's start
};

struct ShardIndex {
  int rank = 0;
  int world = 1;
  std::vector<std::string> state_names;
  std::string rng_state;  // the rank's CPU (and CUDA) generator states, opaque bytes
  std::vector<ShardEntry> entries;
  uint64_t payload_bytes = 0;
  uint32_t payload_crc = 0;
};

// Lays out entries' payload offsets (in order) and returns the payload size.
uint64_t assign_payload_offsets(ShardIndex& index);

struct WrittenFile {
  uint64_t bytes = 0;
  uint32_t payload_crc = 0;
};

// Streams a shard file to `path`.tmp; finish() fsyncs and renames it to `path`.
class ShardWriter {
 public:
  ShardWriter(std::string path, const ShardIndex& index);
  // Next payload block: `n` fp32 values, in the order the index lays out.
  void append(const float* data, int64_t n);
  WrittenFile finish();

 private:
  std::string path_;
  File file_;
  ShardIndex index_;
  std::string index_bytes_;
  uint64_t written_ = 0;
  uint32_t crc_ = 0;
};

class ShardReader {
 public:
  // Checks the magic, version, header and index checksums, and the size; parses the index.
  explicit ShardReader(const std::string& path);
  const ShardIndex& index() const { return index_; }
  uint64_t file_bytes() const { return file_bytes_; }
  const std::string& path() const { return file_.path(); }
  // Reads the whole payload and compares its checksum with the header's.
  void verify_payload() const;
  // `n` values of tensor `tensor` (0 master, 1 + i state i) of entry `e`, from element `first`.
  void read(const ShardEntry& e, int tensor, int64_t first, int64_t n, float* dst) const;

 private:
  File file_;
  ShardIndex index_;
  uint64_t file_bytes_ = 0;
  uint64_t payload_begin_ = 0;
};

struct Manifest {
  int format_version = kFormatVersion;
  std::string tag;
  std::string fingerprint;
  int world_size = 1;
  int stage = 0;
  std::string param_dtype = "fp32";
  std::string optimizer;
  std::vector<std::string> state_names;
  std::string param_groups;              // param_groups_text(optimizer.param_groups); "" for none
  int64_t optimizer_internal_steps = 0;  // ShardOptimizer::steps(): bias correction
  int64_t optimizer_steps = 0;           // EngineStats
  int64_t micro_steps = 0;
  int64_t skipped_steps = 0;
  int64_t accumulation = 1;  // gradient_accumulation_steps: micro-steps per optimizer step
  double last_grad_norm = 0;
  double loss_scale = 1.0;  // LossScaler::State
  int64_t scaler_iter = 0;
  int64_t scaler_last_overflow_iter = -1;
  int64_t scaler_hysteresis_left = 1;
  std::string config_source;
  std::string config_text;  // the config file as it was (written, never read back)
  std::vector<std::pair<std::string, std::string>> config;  // key values, for humans
  std::vector<CheckpointParam> params;
  // Stage 3's units (zero::shard-marked modules, and the root), in layout order: which
  // parameters each flat buffer holds and where (element offsets in the unit's buffer, the
  // parameters in layout order), and its elements with padding. For tools and people: a load
  // maps pieces by parameter name (the shard files' entries), so any layout reads them. Empty
  // below stage 3 (one unit over the whole model) and in checkpoints written before stage 3.
  struct Unit {
    std::string name;
    std::vector<std::string> params;
    std::vector<int64_t> offsets;
    int64_t numel = 0;
  };
  std::vector<Unit> units;
  struct FileInfo {
    std::string name;
    uint64_t bytes = 0;
    uint32_t payload_crc = 0;
  };
  std::vector<FileInfo> files;
};

std::string json_quote(const std::string& s);  // a JSON string literal
std::string manifest_to_json(const Manifest& m);
Manifest parse_manifest(const std::string& text, const std::string& path);
std::string run_fingerprint(const std::vector<CheckpointParam>& params, const std::string& dtype);
// dir/latest's tag when `tag` is empty; throws when there is none.
std::string resolve_tag(const std::string& dir, const std::string& tag);
// Throws unless `tag` can name a checkpoint directory.
void check_tag(const std::string& tag);
// `s` for a message: printable ASCII as it is, other bytes as \xNN, at most `max_bytes` of it.
std::string escaped(const std::string& s, size_t max_bytes);

// Where each parameter's pieces are: per name, (file, entry) sorted by param_offset, checked to
// tile [0, numel) exactly once and to match the manifest's parameters.
struct PieceRef {
  int file = 0;
  const ShardEntry* entry = nullptr;
};
using PieceMap = std::unordered_map<std::string, std::vector<PieceRef>>;
// Also checks each reader against the manifest (rank, world, size, checksum, state names).
PieceMap build_piece_map(const Manifest& m, const std::vector<ShardReader>& readers,
                         const std::string& dir);

// The message of any exception, without a c10 backtrace.
std::string message_of(const std::exception& e);

}  // namespace zero::ckpt
