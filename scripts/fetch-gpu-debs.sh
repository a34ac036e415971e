#!/usr/bin/env bash
# Downloads (here, where apt works) the Debian packages scripts/gpu-check.sh unpacks on a GPU
# machine that has no package registry: yaml-cpp, Boost.Program_options, GoogleTest and the
# gloo headers c10d's ProcessGroupGloo.hpp includes. About 11 MB, into gpu-debs/ (git-ignored;
# pass it to the device run as a carried path).
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p gpu-debs
cd gpu-debs
apt-get download libyaml-cpp-dev libyaml-cpp0.7 libboost-program-options-dev \
  libboost-program-options1.74-dev libboost-program-options1.74.0 libboost1.74-dev \
  libgtest-dev libgmock-dev libgloo-dev 2> /dev/null
ls -la
