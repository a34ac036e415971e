// What the host optimizers' kernels share (internal to optim/): the compute-dtype copy's kinds,
// the unscale, and the roundings that keep them bit-identical to ATen's fused CPU kernels.
#pragma once

#include <c10/util/Half.h>

#include <cstdint>
#include <cstring>
#include <type_traits>

// x86-64 with GCC or Clang: one clone of each kernel per instruction set, picked at load time,
// so the default build (no -march) still runs the loops 8 or 16 floats wide where the CPU can.
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__)) && !defined(__CUDACC__) && \
    !defined(__NVCC__)
#define ZERO_SIMD_CLONES \
  __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define ZERO_SIMD_CLONES
#endif

namespace zero::optim::host {

// float -> bf16 bits, round to nearest even as c10::BFloat16 (and Tensor::to) does; branch-free
// so the loop stays vectorized. NaN keeps a quiet NaN.
inline uint16_t to_bf16_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  const uint32_t rounded = (u + (((u >> 16) & 1u) + 0x7FFFu)) >> 16;
  return f != f ? uint16_t{0x7FC0} : static_cast<uint16_t>(rounded);
}

// The dtype of the copy of the new weights a kernel writes beside the fp32 master (none, or the
// compute dtype the device trains in).
enum class Out { kNone, kFloat, kBFloat16, kHalf };

template <Out kOut>
inline void store(void* out, int64_t i, float v) {
  if constexpr (kOut == Out::kFloat) {
    static_cast<float*>(out)[i] = v;
  } else if constexpr (kOut == Out::kBFloat16) {
    static_cast<uint16_t*>(out)[i] = to_bf16_bits(v);
  } else if constexpr (kOut == Out::kHalf) {
    static_cast<c10::Half*>(out)[i] = c10::Half(v);
  }
}

// Calls f(kind-tagged kernel) for `kind`: one instantiation per output dtype.
template <typename F>
void with_out(Out kind, F&& f) {
  switch (kind) {
    case Out::kNone:
      return f(std::integral_constant<Out, Out::kNone>{});
    case Out::kFloat:
      return f(std::integral_constant<Out, Out::kFloat>{});
    case Out::kBFloat16:
      return f(std::integral_constant<Out, Out::kBFloat16>{});
    case Out::kHalf:
      return f(std::integral_constant<Out, Out::kHalf>{});
  }
}

// grad / scale, the way ATen's fused kernels unscale. When the scale is a power of two its
// reciprocal is exact and x * (1 / scale) is the same exact value as x / scale, so it rounds to
// the same float: the multiply then gives identical bits for a quarter of a division's cost on
// the vector units (the step is compute-bound once the host has bandwidth to spare). The engine's
// scale is a power of two whenever clipping does not bite: the world size over the predivide
// factor, times an fp16 loss scale.
template <bool kDivide>
inline float unscale(float g, float scale, float inverse) {
  if constexpr (kDivide) {
    return g / scale;
  } else {
    return g * inverse;
  }
}

bool has_exact_inverse(float x);

// The kernels round as the engine's optimizer without offload does, ATen's fused CPU AdamW and
// SGD, so that an offloaded run is the non-offloaded one bit for bit (tests/test_cpu_optim.cpp,
// tests/test_optimizer_offload.cpp). ATen compiles each kernel once per instruction set and the
// compiler contracts what it may: in the torch 2.13 wheel's AVX2 and AVX-512 builds, besides the
// explicit fused multiply-adds (AdamW's lerp, SGD's decay, momentum and Nesterov terms), AdamW's
// beta2 v + (1 - beta2) g g is one fma((1 - beta2) g, g, beta2 v) and SGD's p - lr d one
// fma(d, -lr, p); the baseline build rounds every product (its fmadd is a multiply and an add).
// kFused is the AVX builds' rounding of whole vectors, kRounded the baseline's; which one this
// process's ATen does is found once per kernel by stepping both on a probe (its CPU capability is
// picked at load time, or by ATEN_CPU_CAPABILITY). ATen's remainder loop (a slice's last
// elements past whole vectors) is compiled otherwise again; the optimizers run it through ATen's
// kernel itself (HostOptimizerBase::apply_remainder).
//
// Why bit for bit and not within an ulp: in bf16, one master an fp32 ulp off that lies at a bf16
// rounding boundary makes another bf16 weight, and the runs then train on other weights (1e-5 ..
// 4e-4 of the parameters' magnitude apart four steps later: issue 21's rare OffloadBf16 failure).
enum class Rounding { kFused, kRounded };

}  // namespace zero::optim::host
