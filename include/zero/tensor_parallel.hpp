// Tensor parallelism, Megatron-LM style: #include <zero/tensor_parallel.hpp>.
//
//   groups.hpp         the tp x dp process groups (tensor-parallel ranks adjacent); new code
//                      makes them with zero::ParallelDims (zero/parallel_dims.hpp)
//   mappings.hpp       the conjugate communication functions as autograd functions
//   linear.hpp         ColumnParallelLinear, RowParallelLinear
//   embedding.hpp      VocabParallelEmbedding
//   cross_entropy.hpp  vocab_parallel_cross_entropy (never the full logits on one rank)
//   placement.hpp      which parameters are sharded or replicated; the sequence-parallel
//                      all-reduce of replicated gradients; the global gradient norm
//   init.hpp           full initial weights from a seed, the same on every rank
//
// The layers take the tensor-parallel group (mesh.tp); the ZeRO engine is given the whole mesh,
// zero::initialize(model, cfg, mesh): it shards over mesh.dp and clips by the norm over dp and tp.
// Given mesh.dp alone it would clip by the data-parallel ranks' part of the norm only.
#pragma once

#include "zero/tensor_parallel/cross_entropy.hpp"
#include "zero/tensor_parallel/embedding.hpp"
#include "zero/tensor_parallel/groups.hpp"
#include "zero/tensor_parallel/init.hpp"
#include "zero/tensor_parallel/linear.hpp"
#include "zero/tensor_parallel/mappings.hpp"
#include "zero/tensor_parallel/placement.hpp"
