#!/usr/bin/env bash
# The main demo: install and build (scripts/setup.sh), train the example GPT with ZeRO-2 on 2
# ranks under torchrun (progress lines and each rank's measured vs predicted memory), then the
# memory planner: the same model's per-rank memory for stages 0/1/2 as a chart
# (out/memory-small.svg), and what fits LLaMA-7B on 8 x 80 GB (out/memory-llama-7b.svg).
# Extra arguments go to zero-train, e.g. --set zero_optimization.stage=1 --set bf16.enabled=true
set -euo pipefail
cd "$(dirname "$0")/.."
# Only the two programs the demo runs (the test suite's targets are scripts/test.sh's).
scripts/setup.sh zero-train zero-memory
mkdir -p out
ranks=${ZERO_DEMO_RANKS:-2}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
torchrun --no-python --standalone --nproc-per-node "$ranks" build/examples/zero-train \
  --config configs/zero2.yaml --set trainer.metrics_file=out/demo-metrics.jsonl \
  --summary-json out/demo-summary.json "$@" 2>&1 | grep -v "^W[0-9]* .*torch/distributed/run.py"
echo
build/tools/zero-memory --model small --gpus "$ranks" --micro-batch 8 --seq-len 64 \
  --dtype fp32 --bucket-size 5e5 --device-memory 1GB --svg out/memory-small.svg > /dev/null
build/tools/zero-memory --model llama-7b --gpus 8 --micro-batch 1 --seq-len 2048 \
  --device-memory 80GB --svg out/memory-llama-7b.svg | sed -n '/^recommendation/,$p'
echo
echo "demo: out/demo-summary.json, out/demo-metrics.jsonl, out/memory-small.svg, out/memory-llama-7b.svg"
