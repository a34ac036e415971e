// Reading safetensors files (the Hugging Face weight format) tensor by tensor. Writing is
// zero::write_safetensors in checkpoint_io.hpp.
//
// Only the header is read when a file is opened; read() then fetches exactly one tensor's bytes,
// so a program can take what it needs from a file far larger than its memory.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace zero {

class SafetensorsFile {
 public:
  struct Entry {
    std::string dtype;  // the format's code: F32, BF16, F16, F64, I64, I32, I16, I8, U8, BOOL
    std::vector<int64_t> shape;
    uint64_t begin = 0, end = 0;  // byte range within the data section
  };

  // Parses and checks the header (offsets in bounds, sizes matching shapes and dtypes). Throws
  // zero::CheckpointError naming the file.
  explicit SafetensorsFile(const std::string& path);
  ~SafetensorsFile();
  SafetensorsFile(SafetensorsFile&&) noexcept;
  SafetensorsFile& operator=(SafetensorsFile&&) noexcept;

  const std::string& path() const;
  bool contains(const std::string& name) const;
  std::vector<std::string> names() const;  // sorted
  // Throws CheckpointError naming the tensor and the file when there is no such tensor.
  const Entry& entry(const std::string& name) const;
  // The tensor on the CPU, in the file's dtype.
  at::Tensor read(const std::string& name) const;
  // Elements [begin, begin + count) of tensor `name` in row-major order, as a 1-D CPU tensor in
  // the file's dtype: copied out of a read-only memory map of the file, so only the pages that
  // hold them are read (a rank taking its shard of a model reads its shard). Throws
  // CheckpointError naming the tensor for a range outside it. Safe to call from several threads.
  at::Tensor read_range(const std::string& name, int64_t begin, int64_t count) const;
  // Bytes read_range has copied out of this file so far.
  uint64_t range_bytes_read() const;
  const std::map<std::string, std::string>& metadata() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace zero
