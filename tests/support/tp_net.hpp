// A small language model in two forms with the same initial weights: TpNet, tensor-parallel
// (vocabulary-parallel embedding and head, a column -> row MLP, LayerNorms replicated, optionally
// sequence-parallel), and FullNet, the same model from plain LibTorch modules in one process,
// its reference. Parameters have the same names in both ("fc1.weight"), so a test can compare
// each rank's shard with the same part of the reference's tensor.
//
//   embed -> x;  x = x + fc2(gelu(fc1(norm1(x))));  logits = head(norm2(x));  cross-entropy
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>

#include <memory>
#include <string>

#include "comm/group.hpp"
#include "zero/tensor_parallel/embedding.hpp"
#include "zero/tensor_parallel/linear.hpp"
#include "zero/tensor_parallel/placement.hpp"

namespace zero::testing {

struct TpNetShape {
  int64_t vocab = 16;
  int64_t hidden = 8;
  int64_t ffn = 16;
};

class TpNetImpl : public torch::nn::Module, public tensor_parallel::SequenceParallelModule {
 public:
  TpNetImpl(std::shared_ptr<comm::Group> group, bool sequence_parallel, TpNetShape shape = {});
  // Both LayerNorms run on this rank's part of the sequence under sequence parallelism.
  tensor_parallel::SequenceShare sequence_share(const std::string& name) const override {
    return name.rfind("norm", 0) == 0 ? tensor_parallel::SequenceShare::kPartial
                                      : tensor_parallel::SequenceShare::kUnsaid;
  }
  // The per-token losses [B, S], the same on every rank (the head gathers the sequence).
  at::Tensor forward(const at::Tensor& ids, const at::Tensor& target);

  std::shared_ptr<comm::Group> group;
  tensor_parallel::VocabParallelEmbedding emb{nullptr};
  torch::nn::LayerNorm norm1{nullptr}, norm2{nullptr};
  tensor_parallel::ColumnParallelLinear fc1{nullptr};
  tensor_parallel::RowParallelLinear fc2{nullptr};
  tensor_parallel::ColumnParallelLinear head{nullptr};
};
TORCH_MODULE(TpNet);

class FullNetImpl : public torch::nn::Module {
 public:
  explicit FullNetImpl(TpNetShape shape = {});
  // The mean cross-entropy over all tokens.
  at::Tensor forward(const at::Tensor& ids, const at::Tensor& target);

  torch::nn::Embedding emb{nullptr};
  torch::nn::LayerNorm norm1{nullptr}, norm2{nullptr};
  torch::nn::Linear fc1{nullptr}, fc2{nullptr}, head{nullptr};
};
TORCH_MODULE(FullNet);

}  // namespace zero::testing
