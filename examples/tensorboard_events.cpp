#include "tensorboard_events.hpp"

#include <unistd.h>

#include <array>
#include <chrono>
#include <filesystem>
#include <stdexcept>

#ifdef ZERO_HAVE_PROTOBUF
#include "tensorboard_event.pb.h"
#endif

namespace zero::examples {
namespace {

std::array<uint32_t, 256> crc_table() {
  std::array<uint32_t, 256> t{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? 0x82F63B78u ^ (c >> 1) : c >> 1;  // reflected
    t[i] = c;
  }
  return t;
}

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

}  // namespace

bool tensorboard_available() {
#ifdef ZERO_HAVE_PROTOBUF
  return true;
#else
  return false;
#endif
}

uint32_t crc32c(const void* data, size_t n) {
  static const std::array<uint32_t, 256> table = crc_table();
  const auto* p = static_cast<const unsigned char*>(data);
  uint32_t c = 0xFFFFFFFFu;
  for (size_t i = 0; i < n; ++i) c = table[(c ^ p[i]) & 0xFF] ^ (c >> 8);
  return c ^ 0xFFFFFFFFu;
}

uint32_t masked_crc32c(const void* data, size_t n) {
  const uint32_t c = crc32c(data, n);
  return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

EventFileWriter::EventFileWriter(const std::string& dir) {
#ifndef ZERO_HAVE_PROTOBUF
  throw std::runtime_error(
      "tensorboard.enabled is true but this build has no libprotobuf "
      "(install libprotobuf-dev and protobuf-compiler, then rebuild), or "
      "use csv_monitor");
#else
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  char host[256] = "localhost";
  ::gethostname(host, sizeof host - 1);
  path_ = (std::filesystem::path(dir) /
           ("events.out.tfevents." + std::to_string(static_cast<int64_t>(now_seconds())) + "." +
            host + "." + std::to_string(::getpid())))
              .string();
  out_.open(path_, std::ios::binary | std::ios::trunc);
  if (!out_) throw std::runtime_error("tensorboard: cannot write '" + path_ + "'");
  zero::tb::Event e;
  e.set_wall_time(now_seconds());
  e.set_file_version("brain.Event:2");
  write_record(e.SerializeAsString());
#endif
}

void EventFileWriter::write_scalars(int64_t step, double wall_time,
                                    const std::vector<std::pair<std::string, double>>& scalars) {
#ifdef ZERO_HAVE_PROTOBUF
  zero::tb::Event e;
  e.set_wall_time(wall_time);
  e.set_step(step);
  for (const auto& [tag, value] : scalars) {
    auto* v = e.mutable_summary()->add_value();
    v->set_tag(tag);
    v->set_simple_value(static_cast<float>(value));
  }
  write_record(e.SerializeAsString());
#else
  (void)step, (void)wall_time, (void)scalars;
#endif
}

void EventFileWriter::write_record(const std::string& bytes) {
  const uint64_t len = bytes.size();
  char head[12];
  for (int i = 0; i < 8; ++i) head[i] = static_cast<char>((len >> (8 * i)) & 0xFF);
  const uint32_t len_crc = masked_crc32c(head, 8);
  for (int i = 0; i < 4; ++i) head[8 + i] = static_cast<char>((len_crc >> (8 * i)) & 0xFF);
  const uint32_t data_crc = masked_crc32c(bytes.data(), bytes.size());
  char tail[4];
  for (int i = 0; i < 4; ++i) tail[i] = static_cast<char>((data_crc >> (8 * i)) & 0xFF);
  out_.write(head, sizeof head);
  out_.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  out_.write(tail, sizeof tail);
  out_.flush();
  if (!out_) throw std::runtime_error("tensorboard: cannot write '" + path_ + "'");
}

}  // namespace zero::examples
