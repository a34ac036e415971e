// Megatron-LM / GPT-NeoX indexed datasets (trainer.data: megatron:PREFIX): PREFIX.idx (the index)
// and PREFIX.bin (the tokens), as megatron-core's IndexedDatasetBuilder and the preprocessing
// scripts (tools/preprocess_data.py) write them. The .bin is memory-mapped, not read.
//
// PREFIX.idx, little-endian (megatron/core/datasets/indexed_dataset.py, _IndexWriter):
//   9 bytes "MMIDIDX\0\0", uint64 version (1), uint8 dtype code (1 uint8, 2 int8, 3 int16,
//   4 int32, 5 int64, 6 float64, 7 float32, 8 uint16), uint64 sequence count S, uint64 document
//   count D, int32 sequence_lengths[S] (tokens), int64 sequence_pointers[S] (byte offsets into
//   the .bin), int64 document_indices[D] (0, then the sequence index that ends each document),
//   and for multimodal datasets int8 sequence_modes[S] (ignored).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "data.hpp"

namespace zero::examples {

struct MegatronIndex {
  int dtype_code = 0;
  int64_t item_bytes = 0;
  std::vector<int32_t> sequence_lengths;
  std::vector<int64_t> sequence_pointers;
  std::vector<int64_t> document_indices;  // D entries: documents are [d[i], d[i + 1])
};

// Reads and checks PREFIX.idx; errors name the file, the field and what was expected. `spec` is
// the trainer.data value the messages quote.
MegatronIndex read_megatron_index(const std::string& idx_path, const std::string& spec);

// The dataset: the documents' sequences in order as one token stream (documents in the
// index's order, their sequences concatenated, as Megatron's GPTDataset reads them unshuffled),
// cut into non-overlapping samples of len + 1 tokens like the other file sources. The document
// boundaries stay known (document_start) and are counted in describe().
class MegatronDataset final : public Dataset {
 public:
  MegatronDataset(const std::string& prefix, int64_t len, int64_t model_vocab,
                  const std::string& spec);
  ~MegatronDataset() override;
  MegatronDataset(const MegatronDataset&) = delete;
  MegatronDataset& operator=(const MegatronDataset&) = delete;

  int64_t size() const override { return (total_ - 1) / len_; }
  int64_t vocab() const override { return vocab_; }
  at::Tensor sample(int64_t index) const override { return tokens(index * len_, len_ + 1); }
  std::string describe() const override;

  int64_t total_tokens() const { return total_; }
  int64_t documents() const { return static_cast<int64_t>(index_.document_indices.size()) - 1; }
  // The stream position of document d's first token (d == documents(): the end).
  int64_t document_start(int64_t d) const;
  // `count` tokens of the stream from `start`, as int64.
  at::Tensor tokens(int64_t start, int64_t count) const;

 private:
  struct Mapping;
  std::string spec_;
  MegatronIndex index_;
  std::unique_ptr<Mapping> bin_;
  std::vector<int64_t> seq_start_;  // S + 1 stream positions
  int64_t len_, vocab_, total_ = 0;
};

}  // namespace zero::examples
