#!/usr/bin/env bash
# Compile-and-link check of the CUDA variant, on a machine without a GPU: a CUDA build of torch
# (torch==2.14.1 with CUDA 13, ~5.5 GB in its own venv) plus the machine's nvcc/CUDA headers let
# CMake build the NCCL process group (comm/nccl.cpp), the CUDA device queries
# (device/cuda/memory.cpp), page-locked host memory (device/cuda/page_lock.cpp) and the copy
# stream (device/device_copy.cpp, device-generic, so
# the CPU build compiles it too and the tests' fake accelerator runs it). The CPU tests then
# run on that build too; the CUDA-gated ones skip.
set -euo pipefail
export PYTHONWARNINGS=ignore  # the CUDA wheel warns about a missing numpy on import
cd "$(dirname "$0")/.."
venv=$(realpath -m "${ZERO_CUDA_VENV:-.venv-cuda}")  # CMake needs an absolute interpreter path
if ! "$venv/bin/python" -c 'import torch,sys; sys.exit(0 if torch.version.cuda else 1)' 2> /dev/null; then
  echo "cuda-check: creating $venv with torch==${ZERO_CUDA_TORCH:-2.14.1} (CUDA build)"
  python3 -m venv "$venv"
  "$venv/bin/python" -m pip install -q "torch==${ZERO_CUDA_TORCH:-2.14.1}"
fi
"$venv/bin/python" -c 'import torch; print("cuda-check: torch", torch.__version__, "CUDA", torch.version.cuda)'
build=${ZERO_CUDA_BUILD_DIR:-build-cuda}
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DPython3_EXECUTABLE="$venv/bin/python" | grep -E "zero:|CUDAToolkit"
ninja -C "$build" -j "${ZERO_JOBS:-2}"
# The evidence: the device-specific objects exist, and the binaries link the CUDA runtime,
# torch_cuda and NCCL.
for obj in comm/CMakeFiles/zero_comm.dir/nccl.cpp.o device/CMakeFiles/zero_device.dir/cuda/memory.cpp.o \
  device/CMakeFiles/zero_device.dir/cuda/page_lock.cpp.o device/CMakeFiles/zero_device.dir/device_copy.cpp.o; do
  test -s "$build/$obj" || { echo "cuda-check: $obj missing" >&2; exit 1; }
  echo "cuda-check: compiled $obj ($(stat -c %s "$build/$obj") bytes)"
done
export LD_LIBRARY_PATH="$("$venv/bin/python" -c 'import torch,os;print(os.path.dirname(torch.__file__))')/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
ldd "$build/examples/zero-train" | grep -E "torch_cuda|c10_cuda|cudart|nccl" | sed 's/^/cuda-check: zero-train links /'
ctest --test-dir "$build" -E 'e2e' -j "${ZERO_TEST_JOBS:-2}" --output-on-failure
echo "cuda-check: the CUDA variant compiled, linked and passed its CPU tests (CUDA-gated tests skip: no GPU)"
