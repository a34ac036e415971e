// Backend factories. Each lives in its own file; CMake compiles nccl.cpp or no_nccl.cpp, so no
// caller needs an #ifdef.
#pragma once

#include <c10/util/intrusive_ptr.h>

#include <string>

#include "comm/group.hpp"

namespace zero::comm {

// `interface_hint`: the address peers reach us on ("127.0.0.1" when every rank is local).
c10::intrusive_ptr<c10d::Backend> make_gloo(const c10::intrusive_ptr<c10d::Store>& store, int rank,
                                            int size, const GroupOptions& opts,
                                            const std::string& interface_hint);
c10::intrusive_ptr<c10d::Backend> make_nccl(const c10::intrusive_ptr<c10d::Store>& store, int rank,
                                            int size, const GroupOptions& opts);
// Whether this build can make NCCL groups (a CUDA build of torch).
bool nccl_available();

}  // namespace zero::comm
