// What the pipeline runtime keeps of the point-to-point operations it posted and has not yet
// waited on (runtime.hpp): a send's Work with the tensor it reads, and a receive posted ahead of
// its instruction. Private to the runtime's files: complete wherever they are created or dropped.
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>

#include "comm/group.hpp"
#include "zero/pipeline/runtime/runtime.hpp"

namespace zero::pipeline {

// A posted send: the Work and the tensor it reads, alive until the Work was waited on.
struct PipelineRuntime::Pending {
  comm::Work work;
  at::Tensor buffer;
  std::optional<Instruction> ins;
};

// A receive posted ahead of its instruction: the buffer it fills and its Work.
struct PipelineRuntime::Posted {
  comm::Work work;
  at::Tensor buffer;
};

}  // namespace zero::pipeline
