// A staged group (comm/c10d_group.cpp: gloo moving another device's tensors than the host's)
// copies each tensor to the host to send it, a transport detail: NCCL moves the same tensor device
// to device. A device that counts the host's reads of it (the tests' fake accelerator) asks
// whether the copy it is making is one of these.
#pragma once

namespace zero::comm {

// True while this thread copies a tensor to the host for a staged group's operation.
bool staging_copy();

}  // namespace zero::comm
