// What the example-GPT tests train on: the tiny preset at a short sequence, and learnable token
// batches (target = 3 * token + 1 mod vocab: the loss falls) drawn from a generator of their own,
// so rank threads and the reference see the same batch without touching torch's global one.
#pragma once

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <cstdint>

#include "zero/models/gpt_config.hpp"

namespace zero::testing {

inline models::GptConfig tiny_gpt(int64_t max_seq) {
  models::GptConfig c = models::gpt_preset("tiny");
  c.max_seq = max_seq;
  return c;
}

struct TokenBatch {
  at::Tensor tokens, targets;
};

inline TokenBatch token_batch(uint64_t seed, int64_t rows, int64_t seq, int64_t vocab) {
  at::Generator gen = at::detail::createCPUGenerator(seed);
  TokenBatch b;
  b.tokens = at::randint(vocab, {rows, seq}, gen);
  b.targets = (b.tokens * 3 + 1) % vocab;
  return b;
}

}  // namespace zero::testing
