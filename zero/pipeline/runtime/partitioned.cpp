// PipelineRuntime under pipe_partitioned / grad_partitioned (RuntimeOptions): this rank's part
// of a tensor to send, the whole tensor from the parts (all-gathered over the partition group),
// and the check that a tensor to split is the same on every rank of that group.
#include <c10/util/accumulate.h>

#include <stdexcept>
#include <string>

#include "comm/group.hpp"
#include "zero/pipeline/runtime/p2p_queue.hpp"
#include "zero/pipeline/runtime/runtime.hpp"

namespace zero::pipeline {

bool PipelineRuntime::split_activations() const {
  return opts_.partition_activations && opts_.partition_group && opts_.partition_group->size() > 1;
}

bool PipelineRuntime::split_grads() const {
  return opts_.partition_grads && opts_.partition_group && opts_.partition_group->size() > 1;
}

at::Tensor PipelineRuntime::part_of(const at::Tensor& whole) const {
  const int64_t T = opts_.partition_group->size(), n = whole.numel(), k = (n + T - 1) / T;
  at::Tensor flat = whole.detach().reshape({-1});
  if (k * T != n) flat = at::cat({flat, at::zeros({k * T - n}, flat.options())});
  // A copy: the whole tensor's storage is not kept alive by the send of 1/T of it.
  return flat.narrow(0, opts_.partition_group->rank() * k, k).clone();
}

at::Tensor PipelineRuntime::whole_of(const at::Tensor& received, c10::IntArrayRef sizes, bool split,
                                     const std::string& what) {
  if (!split) return received;
  flush();  // nothing queued waits behind the collective
  comm::Group& g = *opts_.partition_group;
  const int64_t n = c10::multiply_integers(sizes);
  at::Tensor all = at::empty({received.numel() * g.size()}, received.options());
  at::Tensor part = received;
  g.all_gather(all, part, where("all-gather of the parts of " + what)).wait();
  if (all.numel() == n) return all.view(sizes);
  return all.narrow(0, 0, n).clone().view(sizes);  // the padding dropped
}

void PipelineRuntime::check_replicated(const at::Tensor& t, const std::string& what,
                                       const char* key) {
  flush();
  comm::Group& g = *opts_.partition_group;
  // Two sums in fp64: equal tensors give equal bits on every rank (the same data, the same
  // order); a rank holding its own shard (sequence parallelism, a layer leaving its output
  // split) differs in them. Bitwise on purpose (review 2026-12-07a L8): a replicated activation
  // is bit-identical where the ranks run the same kernels (NCCL's all-reduce gives every rank
  // the same bits); ranks on different GPU models or nondeterministic kernels may be refused, and
  // the message says so, since a tolerance of a few ulps of the sum would also pass two different
  // shards of a large bf16 activation.
  const at::Tensor d = t.detach().to(at::kDouble);
  at::Tensor mine = at::stack({d.sum(), (d * d).sum()});
  at::Tensor all = at::empty({2 * g.size()}, mine.options());
  g.all_gather(all, mine, where("all-gather of the checksums of " + what)).wait();
  const at::Tensor host = all.cpu().view({g.size(), 2});
  for (int r = 1; r < g.size(); ++r) {
    if (!at::equal(host[r], host[0]))
      throw std::invalid_argument(where(
          std::string("pipeline.") + key + " splits " + what +
          " over the tensor-parallel group, but its ranks hold different values (rank 0's sums " +
          std::to_string(host[0][0].item<double>()) + ", rank " + std::to_string(r) + "'s " +
          std::to_string(host[r][0].item<double>()) +
          "): only a tensor every tensor-parallel rank holds whole can be split; set pipeline." +
          key +
          ": false for layers whose outputs differ between the ranks (the check is bitwise: "
          "ranks on different GPU models or nondeterministic kernels differ by a few ulps "
          "and need it false too)"));
  }
}

}  // namespace zero::pipeline
