#!/usr/bin/env bash
# Installs what zero needs on a fresh Debian machine and builds it into build/.
# Idempotent: a second run only rebuilds what changed (ccache keeps even a clean build quick).
# Arguments are ninja targets to build instead of everything (scripts/demo.sh builds only what
# it runs); without them every target is built, tests included (scripts/test.sh).
set -euo pipefail
cd "$(dirname "$0")/.."

debs=(cmake ninja-build ccache g++ libyaml-cpp-dev libboost-program-options-dev libgtest-dev
      libgmock-dev libgloo-dev libprotobuf-dev protobuf-compiler)
missing=()
for p in "${debs[@]}"; do dpkg -s "$p" > /dev/null 2>&1 || missing+=("$p"); done
if ((${#missing[@]})); then
  sudo=""
  [[ $(id -u) -eq 0 ]] || sudo="sudo"
  echo "setup: apt-get install ${missing[*]}"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" > /dev/null
fi

# LibTorch comes from the torch wheel. ZERO_TORCH=skip keeps whatever torch is installed
# (a CUDA build, say); otherwise the pinned CPU build is installed when torch is absent.
if ! python3 -c 'import torch' 2> /dev/null; then
  echo "setup: pip install torch==${ZERO_TORCH_VERSION:-2.13.0}"
  python3 -m pip install -q "torch==${ZERO_TORCH_VERSION:-2.13.0}"
fi

# has PACKAGE: the package is installed. Looked up, not imported: importing megatron.core takes
# 8-14 s and transformers 1-3 s, on every run of this script (.ci/run runs it twice), and pip
# would leave an installed package that fails to import as it is anyway.
has() {
  python3 -c 'import importlib.util, sys; sys.exit(importlib.util.find_spec(sys.argv[1]) is None)' \
    "$1" 2> /dev/null
}

# transformers (pure Python; it uses the torch above) for the Hugging Face round-trip test,
# tests/e2e/hf_llama_roundtrip.sh, which skips itself without it.
# A partial build (the demo's) does not run that test.
if (($# == 0)) && ! has transformers; then
  echo "setup: pip install transformers"
  python3 -m pip install -q transformers || echo "setup: transformers not installed; the HF test will skip"
fi
# tensorboard (its event reader, for tests/e2e/monitors.sh) and megatron-core (its
# IndexedDatasetBuilder, for tests/e2e/megatron_data.sh; --no-deps: only the dataset module is
# used, and its declared dependencies would pull another torch). Each test skips without it.
if ! has tensorboard; then
  echo "setup: pip install tensorboard"
  python3 -m pip install -q tensorboard || echo "setup: tensorboard not installed; the monitor test will skip"
fi
if ! has megatron.core; then
  echo "setup: pip install megatron-core"
  python3 -m pip install -q --no-deps megatron-core ||
    echo "setup: megatron-core not installed; the Megatron data test will skip"
fi

. scripts/ccache-env.sh
build=${ZERO_BUILD_DIR:-build}
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=${ZERO_BUILD_TYPE:-RelWithDebInfo} \
  "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=$(scripts/relwithdebinfo-flags.sh)" \
  "-DZERO_TESTS_OPT=${ZERO_TESTS_OPT:-}" > /dev/null
# Two jobs at most: each torch translation unit needs ~1.5 GB of RAM to compile.
ninja -C "$build" -j "${ZERO_JOBS:-2}" "$@"
