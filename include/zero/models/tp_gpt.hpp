// The GPT/LLaMA of gpt.hpp in Megatron-LM's tensor-parallel form, from the same GptConfig
// and presets: on each of the T ranks of the tensor-parallel group
//   - the embedding and the head split by vocabulary (VocabParallelEmbedding; a tied head reads
//     the embedding's shard, an untied one is a ColumnParallelLinear without gather), and the loss
//     the vocabulary-parallel cross-entropy: no rank holds the full logits;
//   - attention split by heads: q/k/v column-parallel (heads / T query heads and kv_heads / T
//     key/value heads per rank), the output projection row-parallel;
//   - the SwiGLU MLP split by ffn features: gate and up column-parallel, down row-parallel;
//   - the RMSNorms replicated.
// Optionally sequence-parallel (Megatron-SP): between the parallel regions the activations are
// split along the sequence (seq_len divisible by T), the norms see their rank's part only, and
// their gradients must be all-reduced over the tensor-parallel group before the step
// (tensor_parallel::all_reduce_partial_grads over placements(); the ZeRO engine does it itself
// for the parameters listed in its norm group's `partial`: initialize(model, cfg, mesh) fills it).
//
// Parameters have the plain Gpt's names ("blocks.0.wq.weight"), each rank its shard, so a plain
// model's weights split onto it (load_full) and its shards gather back (gather_full) by name.
#pragma once

#include <ATen/core/Generator.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "zero/models/gpt.hpp"
#include "zero/tensor_parallel.hpp"

namespace zero::models {

// Throws std::invalid_argument naming the numbers when `c` cannot be split over `tp` ranks
// (heads, kv_heads, ffn or vocab not divisible), before anything is allocated.
void check_tensor_parallel_shape(const GptConfig& c, int tp);

// Under sequence parallelism the norms see this rank's part of the sequence (between the
// parallel regions): the block and the model mark theirs partial (SequenceParallelModule).
struct TpBlockImpl : torch::nn::Module, tensor_parallel::SequenceParallelModule {
  TpBlockImpl(tensor_parallel::GroupPtr tp, const GptConfig& c, bool sequence_parallel);
  tensor_parallel::SequenceShare sequence_share(const std::string& name) const override;
  // x: [B, S, D], or under sequence parallelism this rank's [B, S / T, D]; cos/sin [S, hd].
  at::Tensor forward(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin);

  int64_t heads, kv_heads, head_dim;  // this rank's heads
  tensor_parallel::ColumnParallelLinear wq{nullptr}, wk{nullptr}, wv{nullptr};
  tensor_parallel::RowParallelLinear wo{nullptr};
  tensor_parallel::ColumnParallelLinear w_gate{nullptr}, w_up{nullptr};
  tensor_parallel::RowParallelLinear w_down{nullptr};
  RMSNorm attn_norm{nullptr}, mlp_norm{nullptr};
};
TORCH_MODULE(TpBlock);

struct TpGptImpl : torch::nn::Module, tensor_parallel::SequenceParallelModule {
  // Weights: the layers' own draws (tensor_parallel::init_full_*); load_full gives a plain
  // model's. Built on the CPU in fp32; move it with ->to().
  TpGptImpl(tensor_parallel::GroupPtr tp, const GptConfig& c, bool sequence_parallel = false);
  // Deferred (zero/deferred_init.hpp), as Gpt's: each child built as above (the generator passes
  // through the same draws), its parameters placeholders on deferred.device before the next is
  // built, the buffers there. Its values: initial_values_like_gpt.
  TpGptImpl(tensor_parallel::GroupPtr tp, const GptConfig& c, bool sequence_parallel,
            const zero::Deferred& deferred);

  // tokens [batch, seq] -> this rank's logits [batch, seq, vocab / T].
  at::Tensor forward(const at::Tensor& tokens);
  // The mean next-token cross-entropy over the targets that are not -100 (ignored), the same on
  // every tensor-parallel rank (Gpt::loss: at::cross_entropy_loss).
  at::Tensor loss(const at::Tensor& tokens, const at::Tensor& targets);

  // The final norm: partial under sequence parallelism (the blocks say theirs).
  tensor_parallel::SequenceShare sequence_share(const std::string& name) const override;

  // The per-call checks of the token ids (the embedding) and targets (the loss), each an
  // all-gather over the group and a host read, on by default (the layers' check_ids,
  // vocab_parallel_cross_entropy's check_targets). zero-train turns them off: its datasets check
  // every token against the vocabulary when they open, and the hot path then has neither.
  void set_check_inputs(bool on);
  bool check_inputs() const { return check_inputs_; }

  // How each parameter lies across the tensor-parallel ranks, by its plain-Gpt name.
  std::vector<tensor_parallel::NamedPlacement> placements() const;
  // Keeps this rank's part of every weight of `full` (the same model on every rank).
  void load_full(const GptImpl& full);
  // Every parameter gathered to its full shape under the plain Gpt's names, in its
  // named_parameters order (a collective over the tensor-parallel group).
  std::vector<std::pair<std::string, at::Tensor>> gather_full() const;

  GptConfig cfg;
  tensor_parallel::GroupPtr group;
  bool sequence_parallel;
  tensor_parallel::VocabParallelEmbedding embed{nullptr};
  torch::nn::ModuleList blocks;
  RMSNorm norm{nullptr};
  tensor_parallel::ColumnParallelLinear head{nullptr};  // null when tied to the embedding
  at::Tensor rope_cos, rope_sin;
  CheckpointPolicy checkpointing;  // recompute blocks in backward (collectives included)

 private:
  TpGptImpl(tensor_parallel::GroupPtr tp, const GptConfig& c, bool sequence_parallel,
            const zero::Deferred* deferred);
  bool check_inputs_ = true;
};
TORCH_MODULE(TpGpt);

// Gives `model` exactly the weights GptImpl(model.cfg) would draw from `gen` (the same draws in
// the same order: the embedding's and linears' constructor initialisations, then the GPT-2
// normal init, each full tensor drawn and this rank's part kept), without building the full
// model: the transient memory is one full tensor. `gen` advances as the plain constructor
// advances it. zero-train calls it with the default generator after at::manual_seed(seed), so a
// tensor-parallel run starts from the weights of the tp 1 run of the same seed.
void init_like_gpt(TpGptImpl& model, at::Generator gen);
// The same draws as a deferred model's source (zero::initialize's InitialValues): each full
// tensor drawn in turn from `gen` (a copy), this rank's part served. For a TpGpt built with
// zero::Deferred; the transient host memory is one full tensor and its part.
zero::InitialValues initial_values_like_gpt(const TpGptImpl& model, at::Generator gen);

}  // namespace zero::models
