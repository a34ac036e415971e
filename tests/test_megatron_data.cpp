// trainer.data: megatron:PREFIX against the index format written byte by byte here from
// megatron-core's _IndexWriter (indexed_dataset.py), independently of the reader: every token of
// every document, the document boundaries, samples across sequence boundaries, the dtype taken
// from the index, resume through the sampler, and damaged files failing with the file named.
// MegatronCore.EveryTokenOfABuiltDataset compares against a dataset megatron-core itself built
// (tests/e2e/megatron_data.sh sets ZERO_MEGATRON_PREFIX; skipped otherwise).
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>

#include "data.hpp"
#include "megatron_data.hpp"

namespace zero::examples {
namespace {

namespace fs = std::filesystem;

struct TempDir {
  fs::path path = fs::temp_directory_path() /
                  ("zero_mmidx_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
  TempDir() { fs::create_directories(path); }
  ~TempDir() { fs::remove_all(path); }
  static inline int counter = 0;
};

template <typename T>
void put(std::string& out, T v) {
  out.append(reinterpret_cast<const char*>(&v), sizeof v);
}

// Documents of sequences of tokens, written as megatron-core's builder does: the .bin is the
// sequences back to back in `Item`, the .idx header, lengths, byte pointers and document indices.
template <typename Item>
void write_dataset(const std::string& prefix, uint8_t code,
                   const std::vector<std::vector<std::vector<int64_t>>>& docs,
                   uint64_t version = 1) {
  std::string bin, idx = std::string("MMIDIDX\0\0", 9);
  std::vector<int32_t> lengths;
  std::vector<int64_t> pointers, doc_idx = {0};
  for (const auto& doc : docs) {
    for (const auto& seq : doc) {
      pointers.push_back(static_cast<int64_t>(bin.size()));
      lengths.push_back(static_cast<int32_t>(seq.size()));
      for (const int64_t t : seq) put(bin, static_cast<Item>(t));
    }
    doc_idx.push_back(static_cast<int64_t>(lengths.size()));
  }
  put<uint64_t>(idx, version);
  put<uint8_t>(idx, code);
  put<uint64_t>(idx, lengths.size());
  put<uint64_t>(idx, doc_idx.size());
  for (auto v : lengths) put(idx, v);
  for (auto v : pointers) put(idx, v);
  for (auto v : doc_idx) put(idx, v);
  std::ofstream(prefix + ".bin", std::ios::binary) << bin;
  std::ofstream(prefix + ".idx", std::ios::binary) << idx;
}

const std::vector<std::vector<std::vector<int64_t>>> kDocs = {
    {{1, 2, 3, 4, 5}, {6, 7}},   // a document of two sequences (sentence split)
    {{8, 9, 10, 11}},            //
    {{}, {12, 13, 14, 15, 16}},  // an empty sequence
    {{300, 17, 0}},              // ids above 255 need 16 bits
};

std::vector<int64_t> stream_of(const std::vector<std::vector<std::vector<int64_t>>>& docs) {
  std::vector<int64_t> out;
  for (const auto& d : docs)
    for (const auto& s : d) out.insert(out.end(), s.begin(), s.end());
  return out;
}

std::vector<int64_t> vec(const at::Tensor& t) {
  return {t.data_ptr<int64_t>(), t.data_ptr<int64_t>() + t.numel()};
}

TEST(MegatronData, EveryTokenDocumentBoundariesAndSamplesAcrossSequences) {
  TempDir dir;
  const std::string prefix = (dir.path / "corpus_text_document").string();
  write_dataset<uint16_t>(prefix, 8, kDocs);
  const MegatronDataset d(prefix, 4, 512, "megatron:" + prefix);
  const auto want = stream_of(kDocs);
  ASSERT_EQ(d.total_tokens(), static_cast<int64_t>(want.size()));
  EXPECT_EQ(vec(d.tokens(0, d.total_tokens())), want);
  EXPECT_EQ(d.documents(), 4);
  const std::vector<int64_t> starts = {0, 7, 11, 16, 19};
  for (int64_t i = 0; i <= 4; ++i) EXPECT_EQ(d.document_start(i), starts[i]) << i;
  // Samples of len + 1 = 5 tokens at multiples of 4, crossing sequences and documents.
  EXPECT_EQ(d.size(), (19 - 1) / 4);
  for (int64_t i = 0; i < d.size(); ++i) {
    const std::vector<int64_t> s(want.begin() + i * 4, want.begin() + i * 4 + 5);
    EXPECT_EQ(vec(d.sample(i)), s) << i;
  }
  EXPECT_NE(d.describe().find("4 documents"), std::string::npos) << d.describe();
}

TEST(MegatronData, TheDtypeComesFromTheIndex) {
  TempDir dir;
  const auto want = stream_of(kDocs);
  const std::string p32 = (dir.path / "i32").string(), p64 = (dir.path / "i64").string();
  write_dataset<int32_t>(p32, 4, kDocs);
  write_dataset<int64_t>(p64, 5, kDocs);
  EXPECT_EQ(vec(MegatronDataset(p32, 4, 512, "x").tokens(0, 19)), want);
  EXPECT_EQ(vec(MegatronDataset(p64, 4, 512, "x").tokens(0, 19)), want);
  const std::string p8 = (dir.path / "u8").string();
  write_dataset<uint8_t>(p8, 1, {{{1, 2, 3, 250, 5, 6}}});
  EXPECT_EQ(vec(MegatronDataset(p8, 4, 256, "x").tokens(0, 6)),
            (std::vector<int64_t>{1, 2, 3, 250, 5, 6}));
}

TEST(MegatronData, ThroughOpenDatasetTheSamplerAndAResumedLoader) {
  TempDir dir;
  const std::string prefix = (dir.path / "c").string();
  std::vector<std::vector<std::vector<int64_t>>> docs;
  for (int64_t d = 0; d < 40; ++d) {
    std::vector<int64_t> seq;
    for (int64_t i = 0; i < 7 + d % 5; ++i) seq.push_back((d * 31 + i * 7) % 256);
    docs.push_back({seq});
  }
  write_dataset<uint16_t>(prefix, 8, docs);
  std::shared_ptr<const Dataset> data = open_dataset("megatron:" + prefix, 8, 256, 0);
  const auto stream = stream_of(docs);
  ASSERT_EQ(data->size(), static_cast<int64_t>(stream.size() - 1) / 8);
  // A loader that skips 5 batches (what a resumed run does) yields the 6th batch of a fresh one.
  BatchLoader a(data, DistributedSampler(data->size(), 1, 2, 7), 2);
  BatchLoader b(data, DistributedSampler(data->size(), 1, 2, 7), 2);
  for (int i = 0; i < 5; ++i) a.next();
  std::vector<BatchLoader::Batch> fresh;
  for (int i = 0; i < 6; ++i) fresh.push_back(b.next());
  const auto resumed = a.next();
  EXPECT_TRUE(at::equal(resumed.tokens, fresh.back().tokens));
  // Targets are the inputs shifted by one, taken from the stream.
  DistributedSampler s(data->size(), 1, 2, 7);
  const int64_t first = s.at(0);
  EXPECT_EQ(vec(fresh[0].tokens[0]),
            std::vector<int64_t>(stream.begin() + first * 8, stream.begin() + first * 8 + 8));
  EXPECT_EQ(vec(fresh[0].targets[0]),
            std::vector<int64_t>(stream.begin() + first * 8 + 1, stream.begin() + first * 8 + 9));
}

void expect_error(const std::function<void()>& f, const std::string& want) {
  try {
    f();
    ADD_FAILURE() << "no error; wanted one naming '" << want << "'";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
  }
}

TEST(MegatronData, DamagedOrForeignFilesFailNamingTheFile) {
  TempDir dir;
  const std::string p = (dir.path / "c").string();
  auto open = [&] { MegatronDataset(p, 4, 512, "megatron:" + p); };
  write_dataset<uint16_t>(p, 8, kDocs, /*version=*/2);
  expect_error(open, "index version 2");
  write_dataset<float>(p, 7, kDocs);
  expect_error(open, "dtype code 7 (a float type)");
  write_dataset<uint16_t>(p, 8, kDocs);
  fs::resize_file(p + ".bin", 20);
  expect_error(open, p + ".bin' is shorter than its index says");
  write_dataset<uint16_t>(p, 8, kDocs);
  fs::resize_file(p + ".idx", 40);
  expect_error(open, p + ".idx");
  std::ofstream(p + ".idx", std::ios::binary) << "not an index at all, just text";
  expect_error(open, "does not start with MMIDIDX");
  write_dataset<uint16_t>(p, 8, kDocs);
  expect_error([&] { MegatronDataset(p, 4, 256, "megatron:" + p); }, "token ids up to 300");
  expect_error([&] { MegatronDataset(p, 40, 512, "megatron:" + p); }, "less than one sample");
  fs::remove(p + ".bin");
  expect_error(open, p + ".bin");
  expect_error([&] { open_dataset("megatron:", 4, 256, 0); }, "megatron:PATH/NAME");
}

// Against megatron-core's own IndexedDatasetBuilder (run by tests/e2e/megatron_data.sh, which
// writes the documents it added, one per line, to ZERO_MEGATRON_TOKENS).
TEST(MegatronCore, EveryTokenOfABuiltDataset) {
  const char* prefix = std::getenv("ZERO_MEGATRON_PREFIX");
  const char* tokens = std::getenv("ZERO_MEGATRON_TOKENS");
  if (!prefix || !tokens) GTEST_SKIP() << "run by tests/e2e/megatron_data.sh";
  std::ifstream in(tokens);
  std::vector<std::vector<int64_t>> docs;
  for (std::string line; std::getline(in, line);) {
    std::istringstream is(line);
    docs.emplace_back();
    for (int64_t t; is >> t;) docs.back().push_back(t);
  }
  const MegatronDataset d(prefix, 16, int64_t{1} << 40, "megatron:" + std::string(prefix));
  ASSERT_EQ(d.documents(), static_cast<int64_t>(docs.size()));
  int64_t compared = 0;
  for (size_t i = 0; i < docs.size(); ++i) {
    const int64_t start = d.document_start(static_cast<int64_t>(i));
    ASSERT_EQ(d.document_start(static_cast<int64_t>(i) + 1) - start,
              static_cast<int64_t>(docs[i].size()))
        << "document " << i;
    EXPECT_EQ(vec(d.tokens(start, static_cast<int64_t>(docs[i].size()))), docs[i])
        << "document " << i;
    compared += static_cast<int64_t>(docs[i].size());
  }
  EXPECT_EQ(compared, d.total_tokens());
  std::printf("compared %lld tokens of %zu documents: %s\n", static_cast<long long>(compared),
              docs.size(), d.describe().c_str());
}

}  // namespace
}  // namespace zero::examples
