#!/usr/bin/env bash
# Soak: 2 ranks train the tiny GPT for STEPS steps (default 3000) with a checkpoint every 250 steps
# (keep_last 2), and each rank's resident memory (VmRSS from /proc, not the engine's own
# bookkeeping) must stay flat after warm-up: the median RSS of the last tenth of the run may
# exceed the median over steps 20-30% by at most LIMIT_MB (default 8) per rank. A leak of 4 KB
# per step, or of 1 MB per checkpoint, fails it. Kept out of ctest (minutes of CPU time):
#
#   scripts/soak.sh [build/examples/zero-train] [STEPS]
set -uo pipefail
cd "$(dirname "$0")/.."
train=${1:-build/examples/zero-train}
steps=${2:-3000}
limit_mb=${LIMIT_MB:-8}
source tests/e2e/lib/check.sh
use_scratch
port=$((39000 + RANDOM % 1000))
for r in 0 1; do
  RANK=$r LOCAL_RANK=$r WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
    "$train" --config configs/zero2.yaml --set trainer.model=tiny --set trainer.seq_len=32 \
    --set train_micro_batch_size_per_gpu=2 --set steps_per_print=50 --set comm_timeout_s=60 \
    --set trainer.steps="$steps" --set trainer.save_dir="$out/ckpt" \
    --set trainer.save_interval=250 --set trainer.keep_last=2 \
    --set trainer.metrics_file="$out/metrics.$r.jsonl" > "$out/rank$r.log" 2>&1 &
  pids+=($!)
done
# One sample per second: step (from rank 0's metrics file) and both ranks' RSS in kB.
start=$SECONDS
while kill -0 "${pids[0]}" 2> /dev/null || kill -0 "${pids[1]}" 2> /dev/null; do
  step=$(tail -n1 "$out/metrics.0.jsonl" 2> /dev/null | grep -oE '"step": [0-9]+' | grep -oE '[0-9]+')
  rss0=$(awk '/^VmRSS/ {print $2}' /proc/${pids[0]}/status 2> /dev/null)
  rss1=$(awk '/^VmRSS/ {print $2}' /proc/${pids[1]}/status 2> /dev/null)
  [ -n "$step" ] && [ -n "$rss0" ] && [ -n "$rss1" ] && echo "$step $rss0 $rss1" >> "$out/rss.txt"
  [ $((SECONDS - start)) -gt 3600 ] && { echo "soak: over an hour, stopping"; break; }
  sleep 1
done
ok=0
for i in 0 1; do
  wait "${pids[$i]}" || { echo "soak: rank $i failed:"; tail -5 "$out/rank$i.log"; ok=1; }
done
pids=()
python3 - "$out/rss.txt" "$steps" "$limit_mb" << 'EOF' || ok=1
import statistics, sys
rows = [tuple(map(int, l.split())) for l in open(sys.argv[1])]
steps, limit = int(sys.argv[2]), float(sys.argv[3])
failed = False
for r in (1, 2):
    warm = [row[r] for row in rows if 0.2 * steps <= row[0] < 0.3 * steps]
    late = [row[r] for row in rows if row[0] >= 0.9 * steps]
    if not warm or not late:
        sys.exit("soak: too few samples (%d)" % len(rows))
    w, l = statistics.median(warm) / 1024, statistics.median(late) / 1024
    peak = max(row[r] for row in rows) / 1024
    grow = l - w
    print("soak: rank %d RSS %.1f MB after warm-up, %.1f MB at the end (%+.1f MB), peak %.1f MB, "
          "%d samples over %d steps" % (r - 1, w, l, grow, peak, len(rows), steps))
    failed |= grow > limit
if failed:
    sys.exit("soak: FAIL: RSS grew more than %.0f MB after warm-up" % limit)
print("soak: PASS: RSS flat within %.0f MB" % limit)
EOF
grep -h "checkpoint: saved" "$out/rank0.log" | tail -1
exit $ok
