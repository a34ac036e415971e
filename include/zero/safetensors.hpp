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
  const std::map<std::string, std::string>& metadata() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace zero
