#!/usr/bin/env bash
# Checkpoint save and load throughput of the ~100M-parameter GPT (trainer.model=gpt-100m) on
# 2 ranks, ZeRO stage 2: each rank writes its shard (fp32 master + AdamW's two states, with a
# CRC32 of every byte and an fsync), then a resumed run reads it back on 2 ranks and,
# resharded, on 1. Prints a table; not a test.
#
#   bash bench/checkpoint_bench.sh [BUILD_DIR] [MODEL]
#
# Loads right after the save mostly hit the page cache: they measure the format's overhead
# (index, checksums, copies), not the disk.
set -euo pipefail
src=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$src/build}
model=${2:-gpt-100m}
train=$build/examples/zero-train
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
port=$((37500 + RANDOM % 2000))
common=(--config "$src/configs/zero2.yaml" --set trainer.model="$model" --set trainer.seq_len=16
        --set train_batch_size=2 --set steps_per_print=1 --set trainer.save_dir="$out/ck")

launch() {  # NAME RANKS ARGS...
  local name=$1 ranks=$2
  shift 2
  if [ "$ranks" = 1 ]; then
    "$train" "${common[@]}" --set train_micro_batch_size_per_gpu=2 "$@" > "$out/$name.log" 2>&1
  else
    torchrun --no-python --standalone --nproc-per-node "$ranks" --master-port $((port++)) \
      "$train" "${common[@]}" --set train_micro_batch_size_per_gpu=1 "$@" \
      > "$out/$name.log" 2>&1
  fi || { cat "$out/$name.log"; exit 1; }
}

launch save 2 --set trainer.steps=1 --set trainer.save_interval=1
launch load2 2 --set trainer.steps=1 --set trainer.resume=true
launch load1 1 --set trainer.steps=1 --set trainer.resume=true

python3 - "$out" "$model" <<'PY'
import re, sys
out, model = sys.argv[1:]
pat = re.compile(r"checkpoint: (saved|loaded) \S+ in ([\d.]+) s: ([\d.]+) MB per rank, ([\d.]+) MB/s per rank")
print(f"checkpoint throughput, {model}, ZeRO stage 2 (fp32 master + AdamW states)")
print(f"{'operation':<26}{'ranks':>6}{'MB/rank':>10}{'seconds':>10}{'MB/s/rank':>12}")
for name, label, ranks in (("save", "save", 2), ("load2", "load (same world)", 2),
                           ("load1", "load (resharded 2 -> 1)", 1)):
    m = pat.search(open(f"{out}/{name}.log").read())
    if not m:
        sys.exit(f"no checkpoint line in {name}.log")
    _, sec, mb, rate = m.groups()
    print(f"{label:<26}{ranks:>6}{float(mb):>10.1f}{float(sec):>10.3f}{float(rate):>12.1f}")
PY
