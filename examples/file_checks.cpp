#include "file_checks.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <stdexcept>

namespace zero::examples {
namespace fs = std::filesystem;

uint64_t require_input_file(const std::string& path, const std::string& what, uint64_t max_bytes) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    throw std::runtime_error(what + ": cannot open '" + path + "': " + std::strerror(errno) +
                             "; give an existing file");
  }
  if (!S_ISREG(st.st_mode)) {
    const char* kind = S_ISDIR(st.st_mode)    ? "a directory"
                       : S_ISFIFO(st.st_mode) ? "a FIFO"
                       : S_ISCHR(st.st_mode)  ? "a character device"
                                              : "not a regular file";
    throw std::runtime_error(what + ": '" + path + "' is " + kind + "; give a regular file");
  }
  const auto size = static_cast<uint64_t>(st.st_size);
  if (size > max_bytes) {
    throw std::runtime_error(what + ": '" + path + "' has " + std::to_string(size) +
                             " bytes, more than the " + std::to_string(max_bytes) +
                             " this input may have; is it the right file?");
  }
  return size;
}

void require_writable_file(const std::string& path, const std::string& what) {
  std::error_code ec;
  if (fs::is_directory(path, ec)) {
    throw std::runtime_error(what + ": '" + path + "' is a directory; give a file path");
  }
  const bool existed = fs::exists(path, ec);
  // O_APPEND without O_TRUNC: an existing file keeps its contents until it is really written.
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC | O_NONBLOCK, 0644);
  if (fd < 0) {
    throw std::runtime_error(what + ": cannot write '" + path + "': " + std::strerror(errno) +
                             "; check that its directory exists and is writable");
  }
  ::close(fd);
  if (!existed) ::unlink(path.c_str());
}

void require_writable_dir(const std::string& dir, const std::string& what) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (!fs::is_directory(dir)) {
    throw std::runtime_error(what + ": cannot create the directory '" + dir +
                             "': " + (ec ? ec.message() : "a file of that name exists") +
                             "; give a writable directory");
  }
  const std::string probe =
      (fs::path(dir) / (".zero-write-test." + std::to_string(::getpid()))).string();
  const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) {
    throw std::runtime_error(what + ": cannot write in '" + dir + "': " + std::strerror(errno) +
                             "; give a writable directory");
  }
  ::close(fd);
  ::unlink(probe.c_str());
}

}  // namespace zero::examples
