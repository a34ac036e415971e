#!/usr/bin/env bash
# The main demo: install and build (scripts/setup.sh), then train the example GPT with ZeRO-2
# on 2 ranks under torchrun and print the per-rank memory report. Extra arguments go to
# zero-train, e.g. --set zero_optimization.stage=1 or --set trainer.steps=50.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
mkdir -p out
nproc_per_node=${ZERO_DEMO_RANKS:-2}
torchrun --no-python --standalone --nproc-per-node "$nproc_per_node" \
  build/examples/zero-train --config configs/zero2.yaml --summary-json out/demo-summary.json "$@"
echo "demo: summary written to out/demo-summary.json"
