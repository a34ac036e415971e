// The safetensors reader: an 8-byte little-endian header length, a JSON header (parsed with
// yaml-cpp, JSON being YAML's flow syntax), then the tensors' bytes.
#include <ATen/ATen.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>
#include <yaml-cpp/yaml.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <mutex>

#include "zero/checkpoint/checkpoint_format.hpp"
#include "zero/safetensors.hpp"

namespace zero {
namespace {

struct DtypeInfo {
  const char* code;
  at::ScalarType type;
};
constexpr DtypeInfo kDtypes[] = {
    {"F64", at::kDouble}, {"F32", at::kFloat}, {"F16", at::kHalf},  {"BF16", at::kBFloat16},
    {"I64", at::kLong},   {"I32", at::kInt},   {"I16", at::kShort}, {"I8", at::kChar},
    {"U8", at::kByte},    {"BOOL", at::kBool},
};

const DtypeInfo* find_dtype(const std::string& code) {
  for (const auto& d : kDtypes) {
    if (code == d.code) return &d;
  }
  return nullptr;
}

// A header larger than this is not a safetensors file (the format's own limit is 100 MB).
constexpr uint64_t kMaxHeaderBytes = 100'000'000;

}  // namespace

struct SafetensorsFile::Impl {
  ckpt::File file;
  uint64_t data_begin = 0;
  std::map<std::string, Entry> entries;
  std::map<std::string, std::string> metadata;
  // read_range's read-only map of the whole file, made on its first call.
  std::once_flag mapped;
  const uint8_t* map = nullptr;
  size_t map_bytes = 0;
  std::atomic<uint64_t> range_bytes{0};

  ~Impl() {
    if (map != nullptr) ::munmap(const_cast<uint8_t*>(map), map_bytes);
  }
  void map_file() {
    std::call_once(mapped, [this] {
      const int fd = ::open(file.path().c_str(), O_RDONLY | O_CLOEXEC);
      ZERO_CKPT_CHECK(fd >= 0, file.path(), ": cannot open to map: ", std::strerror(errno));
      map_bytes = static_cast<size_t>(file.size());
      void* p = ::mmap(nullptr, map_bytes, PROT_READ, MAP_SHARED, fd, 0);
      const int err = errno;
      ::close(fd);  // the map keeps the file
      ZERO_CKPT_CHECK(p != MAP_FAILED, file.path(), ": cannot map ", map_bytes,
                      " bytes read-only: ", std::strerror(err));
      map = static_cast<const uint8_t*>(p);
    });
  }
};

SafetensorsFile::SafetensorsFile(const std::string& path) {
  ckpt::File f = ckpt::File::open_read(path);
  const uint64_t size = f.size();
  ZERO_CKPT_CHECK(size >= 8, path, ": not a safetensors file (", size, " bytes)");
  uint8_t len_bytes[8];
  f.pread_all(len_bytes, 8, 0);
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | len_bytes[i];
  ZERO_CKPT_CHECK(header_len <= kMaxHeaderBytes && 8 + header_len <= size, path,
                  ": not a safetensors file (header length ", header_len, " for a file of ", size,
                  " bytes)");
  std::string header(header_len, '\0');
  f.pread_all(header.data(), header_len, 8);

  // Parenthesised aggregate initialisation: Impl holds a once_flag, so it cannot be moved.
  auto impl = std::make_unique<Impl>(std::move(f), 8 + header_len);
  const uint64_t data_bytes = size - impl->data_begin;
  YAML::Node root;
  try {
    root = YAML::Load(header);
  } catch (const YAML::Exception& e) {
    ckpt::fail(path, ": the safetensors header is not valid JSON: ", e.what());
  }
  ZERO_CKPT_CHECK(root.IsMap(), path, ": the safetensors header is not a JSON object");
  try {
    for (const auto& kv : root) {
      const std::string name = kv.first.as<std::string>();
      if (name == "__metadata__") {
        for (const auto& m : kv.second) {
          impl->metadata[m.first.as<std::string>()] = m.second.as<std::string>();
        }
        continue;
      }
      const YAML::Node& t = kv.second;
      Entry e;
      e.dtype = t["dtype"].as<std::string>();
      const DtypeInfo* d = find_dtype(e.dtype);
      ZERO_CKPT_CHECK(d, path, ": tensor '", name, "' has dtype ", e.dtype,
                      ", which zero does not read");
      int64_t numel = 1;
      for (const auto& s : t["shape"]) {
        e.shape.push_back(s.as<int64_t>());
        ZERO_CKPT_CHECK(e.shape.back() >= 0, path, ": tensor '", name, "' has a negative size");
        numel *= e.shape.back();
      }
      const YAML::Node& off = t["data_offsets"];
      ZERO_CKPT_CHECK(off.IsSequence() && off.size() == 2, path, ": tensor '", name,
                      "' has no data_offsets pair");
      e.begin = off[0].as<uint64_t>();
      e.end = off[1].as<uint64_t>();
      const uint64_t want = static_cast<uint64_t>(numel) * c10::elementSize(d->type);
      ZERO_CKPT_CHECK(e.begin <= e.end && e.end <= data_bytes && e.end - e.begin == want, path,
                      ": tensor '", name, "' has data_offsets [", e.begin, ", ", e.end,
                      "], which do not hold its ", want, " bytes within the file's ", data_bytes,
                      " data bytes (truncated or corrupted file)");
      impl->entries.emplace(name, std::move(e));
    }
  } catch (const YAML::Exception& e) {
    ckpt::fail(path, ": malformed safetensors header: ", e.what());
  }
  impl_ = std::move(impl);
}

SafetensorsFile::~SafetensorsFile() = default;
SafetensorsFile::SafetensorsFile(SafetensorsFile&&) noexcept = default;
SafetensorsFile& SafetensorsFile::operator=(SafetensorsFile&&) noexcept = default;

const std::string& SafetensorsFile::path() const { return impl_->file.path(); }

bool SafetensorsFile::contains(const std::string& name) const {
  return impl_->entries.count(name) > 0;
}

std::vector<std::string> SafetensorsFile::names() const {
  std::vector<std::string> out;
  for (const auto& kv : impl_->entries) out.push_back(kv.first);
  return out;
}

const SafetensorsFile::Entry& SafetensorsFile::entry(const std::string& name) const {
  const auto it = impl_->entries.find(name);
  ZERO_CKPT_CHECK(it != impl_->entries.end(), path(), ": no tensor named '", name, "'");
  return it->second;
}

at::Tensor SafetensorsFile::read(const std::string& name) const {
  const Entry& e = entry(name);
  at::Tensor t = at::empty(e.shape, find_dtype(e.dtype)->type);
  // The format is little-endian, as is every machine zero builds for.
  impl_->file.pread_all(t.data_ptr(), e.end - e.begin, impl_->data_begin + e.begin);
  return t;
}

at::Tensor SafetensorsFile::read_range(const std::string& name, int64_t begin,
                                       int64_t count) const {
  const Entry& e = entry(name);
  const at::ScalarType type = find_dtype(e.dtype)->type;
  const auto size = static_cast<int64_t>(c10::elementSize(type));
  const auto numel = static_cast<int64_t>((e.end - e.begin)) / size;
  ZERO_CKPT_CHECK(begin >= 0 && count >= 0 && begin + count <= numel, path(), ": elements [",
                  begin, ", ", begin + count, ") of tensor '", name, "' lie outside its ", numel);
  at::Tensor t = at::empty({count}, type);
  if (count == 0) return t;
  impl_->map_file();
  const uint64_t at_byte = impl_->data_begin + e.begin + static_cast<uint64_t>(begin * size);
  const auto bytes = static_cast<size_t>(count * size);
  // Little-endian, as every machine zero builds for.
  std::memcpy(t.data_ptr(), impl_->map + at_byte, bytes);
  impl_->range_bytes += bytes;
  // The pages only this range used leave the process (the page cache keeps them): resident
  // memory stays what the rank keeps, not what it has read.
  const auto page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  const uint64_t first = (at_byte + page - 1) / page * page;
  const uint64_t last = (at_byte + bytes) / page * page;
  if (last > first) {
    ::madvise(const_cast<uint8_t*>(impl_->map) + first, last - first, MADV_DONTNEED);
  }
  return t;
}

uint64_t SafetensorsFile::range_bytes_read() const { return impl_->range_bytes.load(); }

const std::map<std::string, std::string>& SafetensorsFile::metadata() const {
  return impl_->metadata;
}

}  // namespace zero
