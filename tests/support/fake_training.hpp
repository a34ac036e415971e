// TinyNet training on the fake accelerator (support/fake_device.hpp), shared by the
// test_fake_device_*.cpp files: 2 ranks, rank r on fake:r as rank r of a GPU job on GPU r, the
// config they train with, and steps that move each batch to the device as a real loader would.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "comm/group.hpp"
#include "support/tiny_net.hpp"
#include "zero/engine.hpp"

namespace zero::testing {

inline constexpr int kSteps = 4;
inline constexpr int64_t kRows = 48;
inline constexpr int kWorld = 2;

// Rank r trains on fake:r, as rank r of a GPU job on GPU r.
c10::Device rank_device(const comm::Group& g);

// A TinyNet on the rank's fake device; the engine must keep every parameter there.
std::shared_ptr<TinyNetImpl> net_on(uint64_t seed, c10::Device d);

// How a test's training runs the forward pass: plainly, or through zero::checkpoint.
using Forward = std::function<at::Tensor(TinyNetImpl&, const at::Tensor&)>;
at::Tensor plain(TinyNetImpl& net, const at::Tensor& x);

// One optimizer step per global batch (steps [from, to)); the data moves to the device as a
// real loader's would.
void train_steps(Engine& e, TinyNetImpl& net, int rank, int from, int to,
                 const Forward& forward = plain);

// The fake-device tests' config: ZeRO `stage`, micro batch kRows / kWorld, clipping at 0.3;
// SGD with momentum and weight decay; optimizer offload (one host thread) if `offload`.
Config training_config(int stage, const std::string& optimizer, bool offload = false);

}  // namespace zero::testing
