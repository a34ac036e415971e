#!/usr/bin/env bash
# Installs zero from BUILD_DIR into a temporary prefix, builds tests/consumer against it with
# find_package(zero), and runs its two programs on 2 ranks with torchrun.
set -euo pipefail
build=$1
src=$2
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
cmake --install "$build" --prefix "$out/prefix" > "$out/install.log" || { cat "$out/install.log"; exit 1; }
launcher=()
command -v ccache > /dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
cmake -S "$src/tests/consumer" -B "$out/build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_PREFIX_PATH="$out/prefix" "${launcher[@]}" > "$out/configure.log" 2>&1 ||
  { cat "$out/configure.log"; exit 1; }
ninja -C "$out/build" > "$out/build.log" 2>&1 || { cat "$out/build.log"; exit 1; }
port=$((35500 + RANDOM % 2000))
torchrun --no-python --standalone --nproc-per-node 2 --master-port $port "$out/build/consumer"
torchrun --no-python --standalone --nproc-per-node 2 --master-port $((port + 1)) "$out/build/consumer_gpt"
