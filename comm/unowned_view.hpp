// A temporary handed to a gloo collective as a view that does not own its memory, so that the
// memory goes when the caller and the backend are both done with it. c10d keeps a finished gloo
// work's tensors after wait() returned: the worker thread drops its reference only once it has
// relocked its queue, and a barrier holds weak references to the work queued before it, which
// (intrusive_ptr) keep that work's tensors allocated until the barrier itself goes. Measured
// here: on some runs under load a bucket's 1 MiB fp32 start-up staging was still allocated after
// initialize, until the next collective ran. The caller passes the owner to Work::hold, which
// keeps it until the backend completed the operation (on every path: success, error, a Work
// dropped without wait()).
#pragma once

#include <ATen/core/Tensor.h>

namespace zero::comm {

// `t`'s memory without a reference to it, for a contiguous host tensor; any other tensor is
// returned as it is (NCCL orders frees by streams, and a staged device's group copies to the
// host anyway).
at::Tensor unowned_view(const at::Tensor& t);

}  // namespace zero::comm
