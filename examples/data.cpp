#include "data.hpp"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <stdexcept>

#include "file_checks.hpp"
#include "megatron_data.hpp"
#include "synthetic_data.hpp"

namespace zero::examples {
namespace {

class SyntheticDataset final : public Dataset {
 public:
  SyntheticDataset(int64_t vocab, uint64_t seed, int64_t len)
      : corpus_(vocab, seed), vocab_(vocab), len_(len) {}
  int64_t size() const override { return 0; }
  int64_t vocab() const override { return vocab_; }
  at::Tensor sample(int64_t index) const override { return corpus_.sample(index, len_); }
  std::string describe() const override {
    char buf[96];
    std::snprintf(buf, sizeof buf, "synthetic Markov corpus (entropy %.4f nats)",
                  corpus_.entropy());
    return buf;
  }

 private:
  SyntheticCorpus corpus_;
  int64_t vocab_, len_;
};

// Tokens held in memory as int64: the example's files are small, and a memory map would buy
// nothing but a platform dependency here.
class TokenFileDataset final : public Dataset {
 public:
  TokenFileDataset(at::Tensor tokens, int64_t vocab, int64_t len, std::string what)
      : tokens_(std::move(tokens)), vocab_(vocab), len_(len), what_(std::move(what)) {}
  int64_t size() const override { return (tokens_.numel() - 1) / len_; }
  int64_t vocab() const override { return vocab_; }
  at::Tensor sample(int64_t index) const override {
    return tokens_.narrow(0, index * len_, len_ + 1).clone();
  }
  std::string describe() const override { return what_; }

 private:
  at::Tensor tokens_;
  int64_t vocab_, len_;
  std::string what_;
};

// The example holds every token in memory as int64 (8 bytes per token): a bound on the file keeps
// a wrong path (a device, a huge unrelated file) from exhausting memory.
constexpr uint64_t kMaxDataBytes = uint64_t{2} << 30;

std::vector<char> read_file(const std::string& path, const std::string& spec) {
  // A FIFO or a device would block or never end: only regular files are read.
  const uint64_t size = require_input_file(path, "trainer.data '" + spec + "'", kMaxDataBytes);
  std::ifstream in(path, std::ios::binary);
  std::vector<char> bytes(size);
  if (!in || !in.read(bytes.data(), static_cast<std::streamsize>(size))) {
    throw std::runtime_error("trainer.data '" + spec + "': cannot read '" + path + "'");
  }
  return bytes;
}

// llm.c's tokenized files: a header of 256 int32 (magic, version, token count), then the tokens.
// GPT-2 files (magic 20240520, version 1) hold uint16 tokens, Llama-3 files (20240801, version 7)
// uint32 tokens.
constexpr int32_t kLlmcGpt2Magic = 20240520;
constexpr int32_t kLlmcLlama3Magic = 20240801;
constexpr size_t kLlmcHeaderBytes = 1024;

at::Tensor read_bin(const std::string& path, const std::string& spec) {
  std::vector<char> bytes = read_file(path, spec);
  const std::string where = "trainer.data '" + spec + "': '" + path + "'";
  size_t offset = 0, width = 2;
  int32_t head[3] = {0, 0, 0};
  if (bytes.size() >= sizeof head) std::memcpy(head, bytes.data(), sizeof head);
  if (head[0] == kLlmcGpt2Magic || head[0] == kLlmcLlama3Magic) {
    const bool gpt2 = head[0] == kLlmcGpt2Magic;
    const int32_t want = gpt2 ? 1 : 7;
    if (head[1] != want) {
      throw std::runtime_error(where + " is an llm.c token file (magic " + std::to_string(head[0]) +
                               ") of header version " + std::to_string(head[1]) +
                               "; this reader knows version " + std::to_string(want) + " (" +
                               (gpt2 ? "uint16" : "uint32") +
                               " tokens): re-export it with llm.c's data_common.py");
    }
    if (bytes.size() < kLlmcHeaderBytes) {
      throw std::runtime_error(where + " is shorter than llm.c's 1024-byte header");
    }
    if (head[2] < 0) {
      throw std::runtime_error(where + ": the llm.c header's token count is negative (" +
                               std::to_string(head[2]) + "); the file is damaged");
    }
    offset = kLlmcHeaderBytes;
    width = gpt2 ? 2 : 4;
    const size_t need = offset + width * static_cast<size_t>(head[2]);
    if (bytes.size() < need) {
      throw std::runtime_error(where + " says it holds " + std::to_string(head[2]) +
                               " tokens but is truncated");
    }
    bytes.resize(need);
  } else if (bytes.size() % 2 != 0) {
    throw std::runtime_error(where +
                             " has an odd size; a headerless .bin file holds uint16 tokens");
  }
  const int64_t n = static_cast<int64_t>((bytes.size() - offset) / width);
  at::Tensor t = at::empty({n}, at::kLong);
  auto* o = t.data_ptr<int64_t>();
  for (int64_t i = 0; i < n; ++i) {
    const char* p = bytes.data() + offset + width * static_cast<size_t>(i);
    if (width == 2) {
      uint16_t v;
      std::memcpy(&v, p, 2);
      o[i] = v;
    } else {
      uint32_t v;
      std::memcpy(&v, p, 4);
      o[i] = v;
    }
  }
  return t;
}

}  // namespace

std::unique_ptr<Dataset> open_dataset(const std::string& spec, int64_t len, int64_t model_vocab,
                                      uint64_t seed) {
  if (spec == "synthetic") return std::make_unique<SyntheticDataset>(model_vocab, seed, len);
  const auto colon = spec.find(':');
  const std::string kind = colon == std::string::npos ? "" : spec.substr(0, colon);
  const std::string path = colon == std::string::npos ? "" : spec.substr(colon + 1);
  if (kind == "megatron") {
    if (path.empty()) {
      throw std::runtime_error("trainer.data '" + spec +
                               "': give the dataset's prefix, megatron:PATH/NAME for "
                               "PATH/NAME.idx and PATH/NAME.bin");
    }
    return std::make_unique<MegatronDataset>(path, len, model_vocab, spec);
  }
  at::Tensor tokens;
  int64_t vocab = 0;
  if (kind == "text") {
    std::vector<char> bytes = read_file(path, spec);
    tokens = at::empty({static_cast<int64_t>(bytes.size())}, at::kLong);
    auto* o = tokens.data_ptr<int64_t>();
    for (size_t i = 0; i < bytes.size(); ++i) o[i] = static_cast<unsigned char>(bytes[i]);
    vocab = 256;  // byte-level tokenizer: a token is a byte
  } else if (kind == "bin") {
    tokens = read_bin(path, spec);
    vocab = tokens.numel() ? tokens.max().item<int64_t>() + 1 : 0;
  } else {
    throw std::runtime_error(
        "trainer.data '" + spec +
        "' is not a data source; use synthetic, text:PATH, bin:PATH or megatron:PREFIX");
  }
  if (tokens.numel() < len + 1) {
    throw std::runtime_error(
        "trainer.data '" + spec + "': " + std::to_string(tokens.numel()) +
        " tokens is less than one sample of trainer.seq_len + 1 = " + std::to_string(len + 1));
  }
  if (vocab > model_vocab) {
    throw std::runtime_error("trainer.data '" + spec + "' has token ids up to " +
                             std::to_string(vocab - 1) + " but the model's vocabulary is " +
                             std::to_string(model_vocab) + "; pick a preset with a larger vocab");
  }
  const std::string what = spec + " (" + std::to_string(tokens.numel()) + " tokens)";
  return std::make_unique<TokenFileDataset>(std::move(tokens), model_vocab, len, what);
}

DistributedSampler::DistributedSampler(int64_t dataset_size, int rank, int world, uint64_t seed,
                                       bool shuffle)
    : n_(dataset_size), rank_(rank), world_(world), seed_(seed), shuffle_(shuffle) {
  if (world < 1 || rank < 0 || rank >= world) throw std::invalid_argument("bad rank/world");
  set_epoch(0);
}

void DistributedSampler::set_epoch(int64_t epoch) {
  epoch_ = epoch;
  if (n_ == 0) return;
  if (shuffle_) {
    auto gen = at::make_generator<at::CPUGeneratorImpl>(seed_ + static_cast<uint64_t>(epoch));
    at::Tensor p = at::randperm(n_, gen, at::kLong);
    perm_.assign(p.data_ptr<int64_t>(), p.data_ptr<int64_t>() + n_);
  } else {
    perm_.resize(n_);
    for (int64_t i = 0; i < n_; ++i) perm_[i] = i;
  }
}

int64_t DistributedSampler::per_rank() const { return n_ == 0 ? 0 : (n_ + world_ - 1) / world_; }

int64_t DistributedSampler::at(int64_t i) const {
  const int64_t pos = rank_ + static_cast<int64_t>(world_) * i;
  if (n_ == 0) return pos;
  // Padding wraps around to the start, as torch's sampler does, so every rank has as many
  // samples and collectives stay in step.
  return perm_[pos % n_];
}

BatchLoader::BatchLoader(std::shared_ptr<const Dataset> data, DistributedSampler sampler,
                         int64_t micro, int depth)
    : data_(std::move(data)), sampler_(std::move(sampler)), micro_(micro), depth_(depth) {
  worker_ = std::thread([this] { run(); });
}

BatchLoader::~BatchLoader() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  worker_.join();
}

BatchLoader::Batch BatchLoader::make(int64_t& epoch, int64_t& pos) {
  std::vector<at::Tensor> rows;
  const int64_t per_rank = sampler_.per_rank();
  for (int64_t i = 0; i < micro_; ++i) {
    if (per_rank > 0 && pos == per_rank) {  // the epoch is over: reshuffle
      sampler_.set_epoch(++epoch);
      pos = 0;
    }
    rows.push_back(data_->sample(sampler_.at(pos++)));
  }
  at::Tensor all = at::stack(rows);
  const int64_t len = all.size(1) - 1;
  return {all.narrow(1, 0, len).contiguous(), all.narrow(1, 1, len).contiguous(), epoch};
}

void BatchLoader::run() {
  int64_t epoch = 0, pos = 0;
  try {
    for (;;) {
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return stop_ || queue_.size() < depth_; });
        if (stop_) return;
      }
      Batch b = make(epoch, pos);
      {
        std::lock_guard<std::mutex> lock(mu_);
        queue_.push_back(std::move(b));
      }
      cv_.notify_all();
    }
  } catch (...) {
    std::lock_guard<std::mutex> lock(mu_);
    error_ = std::current_exception();
    cv_.notify_all();
  }
}

BatchLoader::Batch BatchLoader::next() {
  const auto start = std::chrono::steady_clock::now();
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return !queue_.empty() || error_; });
  if (queue_.empty() && error_) std::rethrow_exception(error_);
  Batch b = std::move(queue_.front());
  queue_.pop_front();
  lock.unlock();
  cv_.notify_all();
  wait_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return b;
}

}  // namespace zero::examples
