// File primitives of the checkpoint format: checksums, descriptors, atomic publication.
#include <c10/util/Exception.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "zero/checkpoint/checkpoint_format.hpp"

namespace zero::ckpt {
namespace fs = std::filesystem;
namespace {

// Slicing-by-8: eight table lookups per 8 bytes, a few GB/s, so checksumming stays well below
// the cost of the disk.
struct Crc32Tables {
  uint32_t t[8][256];
  Crc32Tables() {
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
      t[0][i] = c;
    }
    for (int i = 0; i < 256; ++i) {
      for (int s = 1; s < 8; ++s) t[s][i] = (t[s - 1][i] >> 8) ^ t[0][t[s - 1][i] & 0xFF];
    }
  }
};

const Crc32Tables& crc_tables() {
  static const Crc32Tables tables;
  return tables;
}

std::string errno_text() { return std::strerror(errno); }

}  // namespace

uint32_t crc32(uint32_t crc, const void* data, size_t n) {
  const auto& T = crc_tables().t;
  const auto* p = static_cast<const unsigned char*>(data);
  crc = ~crc;
  while (n >= 8) {
    uint32_t lo, hi;
    std::memcpy(&lo, p, 4);
    std::memcpy(&hi, p + 4, 4);
    lo ^= crc;
    crc = T[7][lo & 0xFF] ^ T[6][(lo >> 8) & 0xFF] ^ T[5][(lo >> 16) & 0xFF] ^ T[4][lo >> 24] ^
          T[3][hi & 0xFF] ^ T[2][(hi >> 8) & 0xFF] ^ T[1][(hi >> 16) & 0xFF] ^ T[0][hi >> 24];
    p += 8;
    n -= 8;
  }
  while (n-- > 0) crc = T[0][(crc ^ *p++) & 0xFF] ^ (crc >> 8);
  return ~crc;
}

std::string fnv1a_hex(const std::string& text) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : text) {
    h ^= c;
    h *= 1099511628211ull;
  }
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(h));
  return buf;
}

std::string message_of(const std::exception& e) {
  if (const auto* c = dynamic_cast<const c10::Error*>(&e)) return c->what_without_backtrace();
  return e.what();
}

File File::open_read(const std::string& path) {
  // O_NONBLOCK: opening a FIFO put in a file's place would otherwise wait for a writer forever.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) {
    const bool missing = errno == ENOENT;
    fail(path, missing ? ": missing" : ": cannot open: ", missing ? "" : errno_text(),
         missing ? " (the checkpoint is incomplete: every rank's shard file must be present; "
                   "copy it from where it was written or load another tag)"
                 : "");
  }
  File file(fd, path);
  struct stat st {};
  ZERO_CKPT_CHECK(::fstat(fd, &st) == 0 && S_ISREG(st.st_mode), path,
                  ": not a regular file (a FIFO, device or directory stands in its place); "
                  "restore the checkpoint's file or load another tag");
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);
  return file;
}

File File::create(const std::string& path) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  ZERO_CKPT_CHECK(fd >= 0, path, ": cannot create: ", errno_text(),
                  " (check that the checkpoint directory is writable and the disk has space)");
  return File(fd, path);
}

File::File(File&& o) noexcept : fd_(o.fd_), path_(std::move(o.path_)) { o.fd_ = -1; }

File& File::operator=(File&& o) noexcept {
  if (this != &o) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = o.fd_;
    path_ = std::move(o.path_);
    o.fd_ = -1;
  }
  return *this;
}

File::~File() {
  if (fd_ >= 0) ::close(fd_);
}

void File::write_all(const void* data, size_t n) {
  const auto* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t w = ::write(fd_, p, n);
    if (w < 0 && errno == EINTR) continue;
    ZERO_CKPT_CHECK(w > 0, path_, ": write failed: ", errno_text(), " (is the disk full?)");
    p += w;
    n -= static_cast<size_t>(w);
  }
}

void File::pwrite_all(const void* data, size_t n, uint64_t offset) {
  const auto* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t w = ::pwrite(fd_, p, n, static_cast<off_t>(offset));
    if (w < 0 && errno == EINTR) continue;
    ZERO_CKPT_CHECK(w > 0, path_, ": write failed: ", errno_text(), " (is the disk full?)");
    p += w;
    offset += static_cast<uint64_t>(w);
    n -= static_cast<size_t>(w);
  }
}

void File::pread_all(void* data, size_t n, uint64_t offset) const {
  auto* p = static_cast<char*>(data);
  while (n > 0) {
    const ssize_t r = ::pread(fd_, p, n, static_cast<off_t>(offset));
    if (r < 0 && errno == EINTR) continue;
    ZERO_CKPT_CHECK(r >= 0, path_, ": read failed: ", errno_text());
    ZERO_CKPT_CHECK(r > 0, path_, ": truncated: it ends before byte ", offset + n,
                    " (the write did not finish; load an earlier tag)");
    p += r;
    offset += static_cast<uint64_t>(r);
    n -= static_cast<size_t>(r);
  }
}

uint64_t File::size() const {
  struct stat st {};
  ZERO_CKPT_CHECK(::fstat(fd_, &st) == 0, path_, ": stat failed: ", errno_text());
  return static_cast<uint64_t>(st.st_size);
}

void File::sync() { ZERO_CKPT_CHECK(::fsync(fd_) == 0, path_, ": fsync failed: ", errno_text()); }

void File::close() {
  if (fd_ < 0) return;
  const int rc = ::close(fd_);
  fd_ = -1;
  ZERO_CKPT_CHECK(rc == 0, path_, ": close failed: ", errno_text());
}

void fsync_dir(const std::string& dir) {
  // Makes a rename durable. Some filesystems refuse fsync on directories; that is not an error.
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return;
  ::fsync(fd);
  ::close(fd);
}

void write_file_atomic(const std::string& path, const std::string& bytes) {
  const std::string tmp = path + ".tmp";
  File f = File::create(tmp);
  f.write_all(bytes.data(), bytes.size());
  f.sync();
  f.close();
  ZERO_CKPT_CHECK(::rename(tmp.c_str(), path.c_str()) == 0, "cannot rename ", tmp, " to ", path,
                  ": ", errno_text());
  fsync_dir(fs::path(path).parent_path().string());
}

std::string read_text(const std::string& path, const std::string& hint) {
  std::error_code ec;
  ZERO_CKPT_CHECK(fs::is_regular_file(path, ec), path, ": missing (", hint, ")");
  File f = File::open_read(path);
  std::string text(f.size(), '\0');
  if (!text.empty()) f.pread_all(text.data(), text.size(), 0);
  return text;
}

void publish_dir(const std::string& tmp_dir, const std::string& final_dir) {
  std::error_code ec;
  if (!fs::exists(final_dir, ec)) {
    fs::rename(tmp_dir, final_dir, ec);
    ZERO_CKPT_CHECK(!ec, "cannot rename ", tmp_dir, " to ", final_dir, ": ", ec.message());
  } else if (::renameat2(AT_FDCWD, tmp_dir.c_str(), AT_FDCWD, final_dir.c_str(), RENAME_EXCHANGE) ==
             0) {
    fs::remove_all(tmp_dir, ec);  // now the old contents
  } else {
    // No atomic swap here: move the old one aside first, so some complete copy always exists.
    const std::string old = final_dir + ".old";
    fs::remove_all(old, ec);
    fs::rename(final_dir, old, ec);
    ZERO_CKPT_CHECK(!ec, "cannot move ", final_dir, " aside to replace it: ", ec.message());
    fs::rename(tmp_dir, final_dir, ec);
    ZERO_CKPT_CHECK(!ec, "cannot rename ", tmp_dir, " to ", final_dir, ": ", ec.message(),
                    " (the previous checkpoint is in ", old, ")");
    fs::remove_all(old, ec);
  }
  fsync_dir(fs::path(final_dir).parent_path().string());
}

std::string shard_file_name(int rank, int world) {
  return "shard_rank" + std::to_string(rank) + "_of_" + std::to_string(world) + ".bin";
}

}  // namespace zero::ckpt
