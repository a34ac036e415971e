// A TensorBoard event file writer for scalars: the records are protobuf Event messages
// (TensorBoard's event.proto / summary.proto subset in proto/tensorboard_event.proto, encoded
// by libprotobuf) in TFRecord framing (a little-endian uint64 length, the masked CRC32C of the
// length, the bytes, their masked CRC32C). The framing is written here: it is 16 bytes around
// each record, and outside TensorFlow no packaged C++ library provides it.
#pragma once

#include <cstdint>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

namespace zero::examples {

// Whether this build has libprotobuf (CMake found it): without it, tensorboard is refused.
bool tensorboard_available();

// CRC-32C (Castagnoli) and TFRecord's masked form of it.
uint32_t crc32c(const void* data, size_t n);
uint32_t masked_crc32c(const void* data, size_t n);

class EventFileWriter {
 public:
  // Creates DIR/events.out.tfevents.<seconds>.<host> (TensorBoard finds files by that name) and
  // writes the file_version record. Throws std::runtime_error naming the path.
  explicit EventFileWriter(const std::string& dir);
  const std::string& path() const { return path_; }
  // One Event at `step` holding the scalars; flushed, so TensorBoard shows it live.
  void write_scalars(int64_t step, double wall_time,
                     const std::vector<std::pair<std::string, double>>& scalars);

 private:
  void write_record(const std::string& bytes);
  std::string path_;
  std::ofstream out_;
};

}  // namespace zero::examples
