// Training data for the example trainer: datasets of fixed-length token samples, a distributed
// sampler that gives each rank a disjoint shard (reshuffled per epoch, as torch's
// DistributedSampler), and a loader that prepares the next micro-batch on a background thread.
#pragma once

#include <ATen/core/Tensor.h>

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace zero::examples {

// Sample i is len + 1 consecutive tokens (inputs and the targets shifted by one).
class Dataset {
 public:
  virtual ~Dataset() = default;
  virtual int64_t size() const = 0;                    // number of samples; 0 = an endless stream
  virtual int64_t vocab() const = 0;                   // tokens are in [0, vocab)
  virtual at::Tensor sample(int64_t index) const = 0;  // int64 [len + 1]
  virtual std::string describe() const = 0;
};

// `spec`: "synthetic" (the built-in Markov corpus), "text:PATH" (bytes of a text file, vocab
// 256), "bin:PATH" (uint16 tokens as nanoGPT writes them, or llm.c's file with its 1024-byte
// header), "megatron:PREFIX" (a Megatron-LM / GPT-NeoX indexed dataset, PREFIX.idx + PREFIX.bin;
// megatron_data.hpp). Files are cut into non-overlapping windows of len + 1 tokens.
std::unique_ptr<Dataset> open_dataset(const std::string& spec, int64_t len, int64_t model_vocab,
                                      uint64_t seed);

// Which samples rank `rank` of `world` visits in epoch `epoch`: a permutation of the dataset
// (seeded by seed + epoch, so every rank computes the same one), padded by wrapping so it splits
// evenly, then every world-th element from position `rank`. Endless datasets are not shuffled:
// position p of the stream is sample p.
class DistributedSampler {
 public:
  DistributedSampler(int64_t dataset_size, int rank, int world, uint64_t seed, bool shuffle = true);
  void set_epoch(int64_t epoch);
  int64_t epoch() const { return epoch_; }
  // Samples this rank visits per epoch (0 for an endless stream).
  int64_t per_rank() const;
  // The index of this rank's `i`-th sample in the current epoch.
  int64_t at(int64_t i) const;

 private:
  int64_t n_;
  int rank_, world_;
  uint64_t seed_;
  bool shuffle_;
  int64_t epoch_ = 0;
  std::vector<int64_t> perm_;
};

// Produces this rank's micro-batches in order, `depth` of them ahead on a worker thread, so the
// training loop never waits for data unless the worker cannot keep up (wait_seconds says).
class BatchLoader {
 public:
  BatchLoader(std::shared_ptr<const Dataset> data, DistributedSampler sampler, int64_t micro,
              int depth = 2);
  ~BatchLoader();
  BatchLoader(const BatchLoader&) = delete;
  BatchLoader& operator=(const BatchLoader&) = delete;

  struct Batch {
    at::Tensor tokens, targets;  // [micro, len] int64
    int64_t epoch = 0;
  };
  Batch next();
  double wait_seconds() const { return wait_seconds_; }

 private:
  void run();
  Batch make(int64_t& epoch, int64_t& pos);

  std::shared_ptr<const Dataset> data_;
  DistributedSampler sampler_;  // used by the worker only
  int64_t micro_;
  size_t depth_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Batch> queue_;
  std::exception_ptr error_;
  bool stop_ = false;
  double wait_seconds_ = 0;
  std::thread worker_;
};

}  // namespace zero::examples
