#!/usr/bin/env bash
# Compile-and-link check of the CUDA variant, on a machine without a GPU: a CUDA build of torch
# (torch==2.14.1 with CUDA 13, ~5.5 GB in its own venv) plus the machine's nvcc/CUDA headers let
# CMake build the NCCL process group (comm/nccl.cpp), the CUDA device queries
# (device/cuda/memory.cpp), page-locked host memory (device/cuda/page_lock.cpp) and the copy
# stream (device/device_copy.cpp, device-generic, so the CPU build compiles it too and the tests'
# fake accelerator runs it).
# It builds the libraries and the programs (zero-train, the tools; not the benchmarks), not the test
# tree: the CPU tests already ran on the CPU build (scripts/test.sh), and the CUDA-gated tests
# only mean something on a GPU (scripts/gpu-check.sh builds and runs them there). What it runs
# instead: zero-train from this build, a few CPU steps, to show the CUDA-linked binary starts and
# trains.
# --venv-only: create the venv and stop; --build-only: create it and build, and stop (.ci/run
# does the first during the CPU build, the second during the CPU tests).
set -euo pipefail
export PYTHONWARNINGS=ignore  # the CUDA wheel warns about a missing numpy on import
cd "$(dirname "$0")/.."
. scripts/ccache-env.sh
torch_version=${ZERO_CUDA_TORCH:-2.14.1}
# Outside the source tree so a fresh clone on the same machine reuses it (5.5 GB, minutes to
# install); CMake needs an absolute interpreter path.
venv=$(realpath -m "${ZERO_CUDA_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/zero/venv-cuda-$torch_version}")
if ! "$venv/bin/python" -c 'import torch,sys; sys.exit(0 if torch.version.cuda else 1)' 2> /dev/null; then
  echo "cuda-check: creating $venv with torch==$torch_version (CUDA build)"
  python3 -m venv "$venv"
  "$venv/bin/python" -m pip install -q "torch==$torch_version"
fi
[[ ${1:-} == --venv-only ]] && exit 0
"$venv/bin/python" -c 'import torch; print("cuda-check: torch", torch.__version__, "CUDA", torch.version.cuda)'
build=${ZERO_CUDA_BUILD_DIR:-build-cuda}
# -O0: this build is checked for compiling and linking and trains three CPU steps; unoptimised
# code takes a quarter less compile time (zero/engine/engine.cpp 12.2 -> 9.5 s, models/gpt.cpp
# 11.6 -> 8.4 s of CPU). The benchmarks are left out (the CPU build compiled them; gpu-check.sh
# builds them optimised where they can run).
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DZERO_BUILD_TESTS=OFF \
  "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=${ZERO_CUDA_CHECK_FLAGS:--O0 -DNDEBUG}" -DZERO_BUILD_BENCH=OFF \
  -DZERO_INSTALL=OFF -DPython3_EXECUTABLE="$venv/bin/python" | grep -E "zero:|CUDAToolkit"
ninja -C "$build" -j "${ZERO_JOBS:-2}"
[[ ${1:-} == --build-only ]] && exit 0
# The evidence: the device-specific objects exist, and the binaries link the CUDA runtime,
# torch_cuda and NCCL.
for obj in comm/CMakeFiles/zero_comm.dir/nccl.cpp.o device/CMakeFiles/zero_device.dir/cuda/memory.cpp.o \
  device/CMakeFiles/zero_device.dir/cuda/page_lock.cpp.o device/CMakeFiles/zero_device.dir/device_copy.cpp.o; do
  test -s "$build/$obj" || { echo "cuda-check: $obj missing" >&2; exit 1; }
  echo "cuda-check: compiled $obj ($(stat -c %s "$build/$obj") bytes)"
done
export LD_LIBRARY_PATH="$("$venv/bin/python" -c 'import torch,os;print(os.path.dirname(torch.__file__))')/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
ldd "$build/examples/zero-train" | grep -E "torch_cuda|c10_cuda|cudart|nccl" | sed 's/^/cuda-check: zero-train links /'
run=$(mktemp -d)
trap 'rm -rf "$run"' EXIT
OMP_NUM_THREADS=1 "$build/examples/zero-train" --config configs/zero2.yaml --set trainer.steps=3 \
  --set trainer.device=cpu --summary-json "$run/summary.json" > "$run/log" 2>&1 ||
  { cat "$run/log" >&2; echo "cuda-check: zero-train (CUDA build) failed on the CPU" >&2; exit 1; }
tail -n 3 "$run/log" | sed 's/^/cuda-check: zero-train: /'
test -s "$run/summary.json" || { echo "cuda-check: zero-train wrote no summary" >&2; exit 1; }
echo "cuda-check: the CUDA variant compiled and linked, and its zero-train trained on the CPU (no GPU here)"
