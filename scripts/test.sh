#!/usr/bin/env bash
# The whole test suite: set up and build (scripts/setup.sh), then every unit, multi-rank and
# end-to-end test through ctest. .ci/run calls exactly this.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
# Tests spawn their own rank threads; two ctest jobs match the two cores CI has.
ctest --test-dir "${ZERO_BUILD_DIR:-build}" --output-on-failure -j "${ZERO_TEST_JOBS:-2}" "$@"
