// What the pipeline tests of the example GPT share: next-token batches per optimizer step drawn
// from a generator of their own (rank threads share torch's global one), and the plain model's
// parameters by name (the reference's initial weights, loaded into each layout's model).
#pragma once

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "zero/models/gpt.hpp"

namespace zero::testing {

struct StepBatch {
  at::Tensor inputs, targets;  // [rows, seq]: targets are the inputs shifted by one token
};

inline std::vector<StepBatch> step_batches(int64_t vocab, int steps, int64_t rows, int64_t seq,
                                           uint64_t seed = 99) {
  auto gen = at::detail::createCPUGenerator(seed);
  std::vector<StepBatch> out;
  for (int s = 0; s < steps; ++s) {
    at::Tensor t = at::randint(vocab, {rows, seq + 1}, gen, at::kLong);
    out.push_back({t.narrow(1, 0, seq).contiguous(), t.narrow(1, 1, seq).contiguous()});
  }
  return out;
}

// The tiny preset, untied, with 2 P - 2 blocks: P stages of the embedding, the blocks and the
// head when cut uniformly (two layers each).
inline models::GptConfig gpt_for_stages(int stages) {
  models::GptConfig c = models::gpt_preset("tiny");
  c.tied = false;
  c.layers = 2 * stages - 2;
  return c;
}

using GptParams = std::map<std::string, at::Tensor>;

inline GptParams snapshot(const models::Gpt& m) {
  GptParams out;
  for (const auto& p : m->named_parameters()) out[p.key()] = p.value().detach().clone();
  return out;
}

inline void load(models::Gpt& m, const GptParams& state) {
  at::NoGradGuard g;
  for (auto& p : m->named_parameters()) p.value().copy_(state.at(p.key()));
}

}  // namespace zero::testing
