#include "megatron_data.hpp"

#include <ATen/ATen.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <stdexcept>

#include "file_checks.hpp"

namespace zero::examples {
namespace {

constexpr char kMagic[9] = {'M', 'M', 'I', 'D', 'I', 'D', 'X', '\0', '\0'};
// The index holds three int64/int32 arrays per sequence: a bound keeps a damaged count from
// asking for terabytes.
constexpr uint64_t kMaxIndexBytes = uint64_t{64} << 30;

int64_t item_bytes_of(int code) {
  switch (code) {
    case 1:
    case 2:
      return 1;  // uint8, int8
    case 3:
    case 8:
      return 2;  // int16, uint16
    case 4:
      return 4;  // int32
    case 5:
      return 8;  // int64
    default:
      return 0;  // 6, 7: float64, float32 (not token ids), or unknown
  }
}

template <typename T>
void widen(const char* src, int64_t n, int64_t* out) {
  for (int64_t i = 0; i < n; ++i) {
    T v;
    std::memcpy(&v, src + i * static_cast<int64_t>(sizeof(T)), sizeof(T));
    out[i] = static_cast<int64_t>(v);
  }
}

void widen(int code, const char* src, int64_t n, int64_t* out) {
  switch (code) {
    case 1:
      return widen<uint8_t>(src, n, out);
    case 2:
      return widen<int8_t>(src, n, out);
    case 3:
      return widen<int16_t>(src, n, out);
    case 4:
      return widen<int32_t>(src, n, out);
    case 5:
      return widen<int64_t>(src, n, out);
    case 8:
      return widen<uint16_t>(src, n, out);
  }
  throw std::logic_error("megatron: unchecked dtype code");
}

}  // namespace

// The .bin, mapped read-only for the dataset's lifetime: samples are copied out of the page
// cache on demand, so a dataset of any size costs only its index in memory.
struct MegatronDataset::Mapping {
  const char* data = nullptr;
  size_t size = 0;
  Mapping(const std::string& path, const std::string& what) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) throw std::runtime_error(what + ": cannot open '" + path + "'");
    struct stat st {};
    if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
      ::close(fd);
      throw std::runtime_error(what + ": '" + path + "' is not a regular file");
    }
    size = static_cast<size_t>(st.st_size);
    if (size > 0) {
      void* p = ::mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0);
      if (p == MAP_FAILED) {
        ::close(fd);
        throw std::runtime_error(what + ": cannot memory-map '" + path + "'");
      }
      data = static_cast<const char*>(p);
    }
    ::close(fd);  // the mapping keeps the file
  }
  ~Mapping() {
    if (data) ::munmap(const_cast<char*>(data), size);
  }
  Mapping(const Mapping&) = delete;
  Mapping& operator=(const Mapping&) = delete;
};

MegatronIndex read_megatron_index(const std::string& path, const std::string& spec) {
  const std::string what = "trainer.data '" + spec + "': '" + path + "'";
  const uint64_t size = require_input_file(path, "trainer.data '" + spec + "'", kMaxIndexBytes);
  std::ifstream in(path, std::ios::binary);
  auto read = [&](void* dst, uint64_t n, const char* field) {
    if (!in.read(static_cast<char*>(dst), static_cast<std::streamsize>(n))) {
      throw std::runtime_error(what + " ends inside the " + field +
                               "; the index is truncated (rebuild it with Megatron's "
                               "preprocess_data.py)");
    }
  };
  char magic[9];
  read(magic, sizeof magic, "header");
  if (std::memcmp(magic, kMagic, sizeof magic) != 0) {
    throw std::runtime_error(what +
                             " does not start with MMIDIDX: not a Megatron-LM / GPT-NeoX "
                             "indexed dataset index (megatron:PREFIX names PREFIX.idx and "
                             "PREFIX.bin)");
  }
  uint64_t version = 0, sequences = 0, documents = 0;
  uint8_t code = 0;
  read(&version, 8, "version");
  if (version != 1) {
    throw std::runtime_error(what + " has index version " + std::to_string(version) +
                             "; zero reads version 1 (Megatron-LM, megatron-core, GPT-NeoX)");
  }
  read(&code, 1, "dtype code");
  MegatronIndex idx;
  idx.dtype_code = code;
  idx.item_bytes = item_bytes_of(code);
  if (idx.item_bytes == 0) {
    throw std::runtime_error(what + " has dtype code " + std::to_string(code) +
                             (code == 6 || code == 7 ? " (a float type)" : " (unknown)") +
                             "; token ids are integers: codes 1-5 and 8");
  }
  read(&sequences, 8, "sequence count");
  read(&documents, 8, "document count");
  const uint64_t body = 34 + sequences * 12 + documents * 8;
  if (sequences > size || documents > size || body > size) {
    throw std::runtime_error(what + " says " + std::to_string(sequences) + " sequences and " +
                             std::to_string(documents) + " documents but holds " +
                             std::to_string(size) + " bytes; the index is truncated or damaged");
  }
  idx.sequence_lengths.resize(sequences);
  idx.sequence_pointers.resize(sequences);
  idx.document_indices.resize(documents);
  read(idx.sequence_lengths.data(), sequences * 4, "sequence lengths");
  read(idx.sequence_pointers.data(), sequences * 8, "sequence pointers");
  read(idx.document_indices.data(), documents * 8, "document indices");
  const auto& d = idx.document_indices;
  if (d.empty() || d.front() != 0 || d.back() != static_cast<int64_t>(sequences) ||
      !std::is_sorted(d.begin(), d.end())) {
    throw std::runtime_error(what +
                             ": the document indices must rise from 0 to the sequence count (" +
                             std::to_string(sequences) + "); the index is damaged");
  }
  return idx;
}

MegatronDataset::MegatronDataset(const std::string& prefix, int64_t len, int64_t model_vocab,
                                 const std::string& spec)
    : spec_(spec), len_(len), vocab_(model_vocab) {
  index_ = read_megatron_index(prefix + ".idx", spec);
  const std::string bin_path = prefix + ".bin";
  const std::string what = "trainer.data '" + spec + "': '" + bin_path + "'";
  bin_ = std::make_unique<Mapping>(bin_path, "trainer.data '" + spec + "'");
  const size_t n = index_.sequence_lengths.size();
  seq_start_.assign(n + 1, 0);
  int64_t max_token = -1;
  std::vector<int64_t> buf;
  for (size_t i = 0; i < n; ++i) {
    const int64_t count = index_.sequence_lengths[i], at_byte = index_.sequence_pointers[i];
    if (count < 0 || at_byte < 0 ||
        static_cast<uint64_t>(at_byte) + static_cast<uint64_t>(count * index_.item_bytes) >
            bin_->size) {
      throw std::runtime_error(what + " is shorter than its index says (sequence " +
                               std::to_string(i) + " of " + std::to_string(count) +
                               " tokens at byte " + std::to_string(at_byte) + "; the file has " +
                               std::to_string(bin_->size) + " bytes)");
    }
    seq_start_[i + 1] = seq_start_[i] + count;
    // Every token is checked once here against the model's vocabulary (the page cache makes a
    // first epoch no slower), so a wrong tokenizer fails before training, naming the file.
    buf.resize(static_cast<size_t>(count));
    widen(index_.dtype_code, bin_->data + at_byte, count, buf.data());
    for (const int64_t t : buf) {
      if (t < 0) {
        throw std::runtime_error(what + " holds a negative token id (" + std::to_string(t) +
                                 ") in sequence " + std::to_string(i));
      }
      max_token = std::max(max_token, t);
    }
  }
  total_ = seq_start_.back();
  if (total_ < len + 1) {
    throw std::runtime_error(
        "trainer.data '" + spec + "': " + std::to_string(total_) +
        " tokens is less than one sample of trainer.seq_len + 1 = " + std::to_string(len + 1));
  }
  if (max_token >= model_vocab) {
    throw std::runtime_error("trainer.data '" + spec + "' has token ids up to " +
                             std::to_string(max_token) + " but the model's vocabulary is " +
                             std::to_string(model_vocab) + "; pick a preset with a larger vocab");
  }
}

MegatronDataset::~MegatronDataset() = default;

int64_t MegatronDataset::document_start(int64_t d) const {
  if (d < 0 || d > documents())
    throw std::out_of_range("megatron: no document " + std::to_string(d));
  return seq_start_[static_cast<size_t>(index_.document_indices[static_cast<size_t>(d)])];
}

at::Tensor MegatronDataset::tokens(int64_t start, int64_t count) const {
  if (start < 0 || count < 0 || start + count > total_) {
    throw std::out_of_range("megatron: tokens [" + std::to_string(start) + ", " +
                            std::to_string(start + count) + ") outside the stream");
  }
  at::Tensor out = at::empty({count}, at::kLong);
  int64_t* o = out.data_ptr<int64_t>();
  // The sequence holding `start`, then as many following ones as the window spans.
  size_t s = static_cast<size_t>(std::upper_bound(seq_start_.begin(), seq_start_.end(), start) -
                                 seq_start_.begin() - 1);
  for (int64_t done = 0; done < count; ++s) {
    const int64_t from = start + done - seq_start_[s];
    const int64_t take = std::min(count - done, seq_start_[s + 1] - seq_start_[s] - from);
    if (take <= 0) continue;  // an empty sequence
    widen(index_.dtype_code, bin_->data + index_.sequence_pointers[s] + from * index_.item_bytes,
          take, o + done);
    done += take;
  }
  return out;
}

std::string MegatronDataset::describe() const {
  return spec_ + " (Megatron indexed dataset: " + std::to_string(total_) + " tokens, " +
         std::to_string(documents()) + " documents, " +
         std::to_string(index_.sequence_lengths.size()) + " sequences, " +
         std::to_string(index_.item_bytes * 8) + "-bit ids)";
}

}  // namespace zero::examples
