// A start-up that never holds the whole model (issue 33, docs/start-up.md): build the model with
// deferred parameters, hand zero::initialize a source of their values, and each rank fills only
// what it keeps (stage 3: its shard and the root unit; stages 0-2: the flat buffer, once, in the
// compute dtype on the model's device).
//
//   auto model = zero::models::Gpt(cfg, zero::Deferred{device});  // one block at a time
//   auto engine = zero::initialize(model.ptr(), ds_cfg, group, model->initial_values());
//
// LibTorch has no meta-device context and its layers allocate in their constructors, so a
// deferred parameter keeps its tensor object (what the module's members and autograd hold) and
// shape, and points at one shared element (NaN) instead of its bytes: a model built so can be
// constructed block by block (defer each child right after building it), and nothing reads
// its values before initialize replaces them. Never call .to() on a deferred model: it would
// expand every placeholder into a full tensor; move buffers with defer_parameters' device.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace torch::nn {
class Module;
}

namespace zero {

// What a model constructor takes to build itself deferred, on `device` (where initialize will
// put the parameters; buffers go there at once).
struct Deferred {
  c10::Device device = c10::Device(c10::kCPU);
};

// Every parameter of `module` (recursively) that is not deferred yet becomes a placeholder on
// `device` with its shape and dtype, freeing its bytes (unless someone else holds them); its
// buffers move to `device`.
void defer_parameters(torch::nn::Module& module, const c10::Device& device);
// Whether `t` is such a placeholder.
bool is_deferred(const at::Tensor& t);

// Elements [begin, begin + out.numel()) of a parameter, row-major over its shape, to be written
// into `out` (1-D, contiguous, fp32, on the CPU).
struct ParamPiece {
  int64_t begin = 0;
  at::Tensor out;
};

// The values of a deferred model's parameters. zero::initialize calls it once per deferred
// parameter, in named_parameters() order (a tied parameter once, under its first name), on every
// rank, with the pieces that rank keeps - possibly none: a source that draws from a generator
// must still advance it. Every rank must be given the same values (a seeded generator, a file):
// with a source nothing is broadcast. Writes fp32, so that masters start from the unrounded
// values as they do from a materialised model.
using InitialValues = std::function<void(const std::string& name, at::IntArrayRef shape,
                                         const std::vector<ParamPiece>& pieces)>;

}  // namespace zero
