// Backend factories. Each lives in its own file; CMake compiles nccl.cpp or no_nccl.cpp, so no
// caller needs an #ifdef.
#pragma once

#include <c10/util/intrusive_ptr.h>

#include <chrono>
#include <cstdint>

#include <string>

#include "comm/group.hpp"

namespace zero::comm {

// `interface_hint`: the address peers reach us on ("127.0.0.1" when every rank is local).
c10::intrusive_ptr<c10d::Backend> make_gloo(const c10::intrusive_ptr<c10d::Store>& store, int rank,
                                            int size, const GroupOptions& opts,
                                            const std::string& interface_hint);
// `device`: the GPU to bind the group to; -1: this rank's (LOCAL_RANK's, see nccl.cpp).
// `parent` (a subgroup: C10dGroup::split): its communicator comes from ncclCommSplit of the
// parent's with `color`, as torch's new_group does for a device-bound parent, instead of a new
// bootstrap through the store (review 06f M3). NCCL still gives the child buffers of its own
// (splitShare is off, as torch leaves it): the device memory per communicator stays (review
// 2026-12-07a L2). null: a communicator of its own.
c10::intrusive_ptr<c10d::Backend> make_nccl(const c10::intrusive_ptr<c10d::Store>& store, int rank,
                                            int size, const GroupOptions& opts, int device = -1,
                                            const c10::intrusive_ptr<c10d::Backend>& parent = {},
                                            int color = -1);
// ncclCommSplit is a collective of the parent's ranks: a rank that gets no communicator from a
// split (its color is negative, or its group is itself alone) still takes part, without a
// color. No-op for a backend that does not split (gloo).
void nccl_split_without_color(c10d::Backend& parent);
// How many communicators were split from the NCCL group's own so far (ProcessGroupNCCL::
// getCommSplitCounter), and whether it has one to split (isInitialized): what C10dGroup::split
// checks before and after a split (review 2026-12-07a L3). 0 / false for any other backend.
uint64_t nccl_split_counter(c10d::Backend& backend);
bool nccl_has_communicator(c10d::Backend& backend);
// The GPU an NCCL group is bound to; -1 for any other backend.
int nccl_bound_device(const c10d::Backend& backend);
// Whether this build can make NCCL groups (a CUDA build of torch).
bool nccl_available();
// Makes this thread's current CUDA device the one the NCCL group is bound to (LOCAL_RANK's):
// from_env builds the group on a helper thread, and the current device is per thread.
void nccl_use_bound_device(const c10d::Backend& backend);
// Ends an NCCL group explicitly: shutdown() after a clean run, abort() after a failure (a
// collective that never finishes would keep shutdown's flush waiting). Never throws.
void nccl_close(c10d::Backend& backend, bool failed);
// The timeout of the store a gloo backend keeps (for tests); 0 for any other backend.
std::chrono::milliseconds gloo_store_timeout(const c10d::Backend& backend);

// Waiting on a collective differs per backend, and that difference is the point of overlap:
// - gloo runs collectives on its own host threads, so the only way to use the result is to
//   block this thread until it is there; the wait is bounded by `timeout` (comm_timeout_s).
// - NCCL runs them on a CUDA stream; the wait makes the caller's current stream wait on the
//   collective's end event and returns at once, so the host keeps queuing kernels (backward
//   goes on filling buckets). The bound is the process group's own watchdog, which was given
//   comm_timeout_s as ProcessGroupNCCL::Options::timeout and aborts a stalled collective.
// Both rethrow a backend failure the caller turns into zero::CommError.
void gloo_wait(c10d::Work& work, std::chrono::milliseconds timeout);
void nccl_wait(c10d::Work& work);

}  // namespace zero::comm
