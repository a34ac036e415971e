// NCCL: the CUDA backend, compiled only when torch has CUDA (see comm/CMakeLists.txt).
#include <c10/cuda/CUDAFunctions.h>
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>

#include <iostream>
#include <string>

#include "comm/backend.hpp"
#include "comm/launcher_env.hpp"

namespace zero::comm {

// The communication stream: ProcessGroupNCCL runs every collective on its own per-device NCCL
// stream, and before launching records an event on the caller's current (compute) stream and
// makes the NCCL stream wait on it, so a bucket's reduce-scatter starts only after the kernels
// that filled the bucket, with no host synchronisation. nccl_wait() below makes the compute
// stream wait on the collective's end event in turn. That is the stream/event protocol ZeRO
// overlap needs, so the engine adds no stream of its own; the bucket buffers stay alive in the
// engine's pipeline until their work is waited on, which is what record_stream would otherwise
// ensure.
//
// Bounding the wait: c10d's WorkNCCL::wait(timeout) with a timeout busy-waits the *host* (1 ms
// sleeps until the GPU finished), which would stall backward mid-pass every time a bucket
// buffer is reused. So the timeout goes into Options::timeout instead: the process group's
// watchdog thread checks every collective against it and, on expiry, aborts the communicator
// and ends the process (TORCH_NCCL_ASYNC_ERROR_HANDLING's default), so a dead peer still ends
// the run with c10d's message naming the collective, never a hang.
namespace {

// This rank's GPU, as torchrun, DeepSpeed and torch's examples pick it: LOCAL_RANK (Open MPI's
// and Slurm's local rank too); the only GPU when the launcher gave each rank one
// (CUDA_VISIBLE_DEVICES per rank). Without launcher variables (ranks as threads over one
// store) the rank itself.
c10::DeviceIndex local_device(int rank, int size) {
  const int count = c10::cuda::device_count();
  TORCH_CHECK(count > 0,
              "zero: the NCCL backend needs a GPU, but CUDA sees none on this machine (check "
              "CUDA_VISIBLE_DEVICES and the driver)");
  if (count == 1) return 0;
  const LaunchInfo info = read_launch_env();
  const int local = info.world_size == size ? info.local_rank : rank;
  TORCH_CHECK(local < count, "zero: LOCAL_RANK=", local, " but this machine shows ", count,
              " GPUs: start at most one rank per GPU (torchrun --nproc-per-node ", count,
              "), or give each rank its own GPU with CUDA_VISIBLE_DEVICES");
  return static_cast<c10::DeviceIndex>(local);
}

}  // namespace

c10::intrusive_ptr<c10d::Backend> make_nccl(const c10::intrusive_ptr<c10d::Store>& store, int rank,
                                            int size, const GroupOptions& opts, int device_index,
                                            const c10::intrusive_ptr<c10d::Backend>& parent,
                                            int color) {
  if (const std::string w = drop_nccl_blocking_wait(); !w.empty() && rank == 0) {
    std::cerr << w << "\n";
  }
  // The group is bound to this rank's GPU, as torch.distributed.init_process_group(device_id=)
  // does: c10d then knows the device before the first collective (barriers, communicator
  // splits), and this thread's current device is that GPU, not GPU 0.
  const c10::Device device(c10::kCUDA, device_index >= 0
                                           ? static_cast<c10::DeviceIndex>(device_index)
                                           : local_device(rank, size));
  c10::cuda::set_device(device.index());
  auto o = c10d::ProcessGroupNCCL::Options::create();
  o->timeout = opts.timeout;
  // c10d splits the parent's communicator when the child's is first made (this group's
  // connect()), if the parent has one on this device; otherwise it bootstraps a new one.
  if (auto from = c10::dynamic_intrusive_pointer_cast<c10d::ProcessGroupNCCL>(parent);
      from && color >= 0) {
    o->split_from = from;
    o->split_color = color;
  }
  auto pg = c10::make_intrusive<c10d::ProcessGroupNCCL>(store, rank, size, o);
  pg->setBoundDeviceId(device);
  return pg;
}

void nccl_split_without_color(c10d::Backend& parent) {
  auto* pg = dynamic_cast<c10d::ProcessGroupNCCL*>(&parent);
  if (!pg) return;
  if (const auto device = pg->getBoundDeviceId()) pg->performNocolorSplit(*device);
}

uint64_t nccl_split_counter(c10d::Backend& backend) {
  auto* pg = dynamic_cast<c10d::ProcessGroupNCCL*>(&backend);
  return pg ? pg->getCommSplitCounter() : 0;
}

bool nccl_has_communicator(c10d::Backend& backend) {
  auto* pg = dynamic_cast<c10d::ProcessGroupNCCL*>(&backend);
  return pg && pg->isInitialized();
}

int nccl_bound_device(const c10d::Backend& backend) {
  const auto device = backend.getBoundDeviceId();
  return device ? device->index() : -1;
}

void nccl_use_bound_device(const c10d::Backend& backend) {
  if (const auto device = backend.getBoundDeviceId()) c10::cuda::set_device(device->index());
}

void nccl_close(c10d::Backend& backend, bool failed) {
  // ProcessGroupNCCL's destructor shuts down by itself, but with a warning that the group was
  // not destroyed, and possibly during static destruction after CUDA is gone. shutdown()
  // flushes and then destroys the communicators: right after a clean run. After a failure a
  // collective may never finish, and flushing would wait on it: abort() tears the
  // communicators down at once.
  try {
    if (failed) {
      backend.abort();
    } else {
      backend.shutdown();
    }
  } catch (const std::exception& e) {
    std::cerr << "zero: closing the NCCL process group: " << e.what() << "\n";
  }
}

// No timeout argument: WorkNCCL::wait() then only orders the current stream after the
// collective (synchronize()) and returns; it rethrows an error the watchdog already recorded.
void nccl_wait(c10d::Work& work) { work.wait(); }

bool nccl_available() { return true; }

}  // namespace zero::comm
