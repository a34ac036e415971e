#!/usr/bin/env bash
# torchrun killed (kill -9) mid-run: its ranks must not train on unsupervised. They notice the
# launcher is gone, agree on a step, save a last checkpoint (saving is configured) and stop with
# an error that says so, within seconds, although steps_per_print is far beyond the run (the
# ranks check between print steps too). The checkpoint they leave is complete: `latest` names
# it and a resumed run continues from it.
set -uo pipefail
train=$1
src=$2
source "$(dirname "${BASH_SOURCE[0]}")/lib/check.sh"
use_scratch
port=$(free_port 24000)
common=(--config "$src/configs/zero2.yaml" --set trainer.model=tiny --set trainer.seq_len=32
        --set train_micro_batch_size_per_gpu=2 --set steps_per_print=100000 --set comm_timeout_s=30
        --set trainer.save_dir="$out/ckpt" --set trainer.save_interval=1000)

torchrun --no-python --nproc-per-node 2 --master-addr 127.0.0.1 --master-port $port \
  --redirects 3 --log-dir "$out/logs" "$train" "${common[@]}" --set trainer.steps=100000 \
  > "$out/run.out" 2> "$out/run.err" &
launcher=$!
pids+=($launcher)
waited=0
# --redirects: each rank writes its own files under the log directory, which outlive torchrun.
rank0_out() { cat "$out"/logs/*/attempt_0/0/stdout.log 2> /dev/null; }
# Step 1 is always printed; then a few seconds of training.
until [ "$(rank0_out | grep -c '^step ')" -ge 1 ] || [ $waited -ge 1200 ]; do
  sleep 0.1
  waited=$((waited + 1))
done
sleep 3
check "training started under torchrun" test $waited -lt 1200
mapfile -t ranks < <(pgrep -P $launcher -f zero-train)
check "torchrun started 2 ranks" test ${#ranks[@]} -eq 2
pids+=("${ranks[@]}")
{
  kill -9 $launcher
  wait $launcher
} 2> /dev/null
killed_at=$SECONDS
for pid in "${ranks[@]}"; do
  while kill -0 "$pid" 2> /dev/null && [ $SECONDS -lt $((killed_at + 20)) ]; do sleep 0.1; done
  check "rank pid $pid stops within 20 s of the launcher's death" \
    bash -c "! kill -0 $pid 2> /dev/null"
done
echo "  ranks stopped $((SECONDS - killed_at)) s after torchrun was killed"
errs=$(cat "$out"/logs/*/attempt_0/*/stderr.log 2> /dev/null)
echo "$errs" | grep -m2 "error" | cut -c1-300 | sed 's/^/    /'
for r in 0 1; do
  check "rank $r says the launcher exited and where it saved" \
    grep -Eq "zero-train rank $r: error: the launcher \(pid $launcher\) exited during training; stopping at step [0-9]+ after saving $out/ckpt/step[0-9]+" \
    <<< "$errs"
done
step=$(grep -oE 'stopping at step [0-9]+' <<< "$errs" | head -1 | grep -oE '[0-9]+$')
check "the ranks agree on the step" \
  test "$(grep -oE 'stopping at step [0-9]+' <<< "$errs" | sort -u | wc -l)" -eq 1
check "latest names the last checkpoint" test "$(cat "$out/ckpt/latest" 2> /dev/null)" = "step$step"

# It resumes from there.
timeout 300 torchrun --no-python --standalone --nproc-per-node 2 --master-port $((port + 1)) \
  "$train" "${common[@]}" --set trainer.steps=$((step + 2)) --set trainer.resume=auto \
  > "$out/resume.out" 2>&1
check "a resumed run continues from step$step" grep -q "loaded $out/ckpt/step$step" "$out/resume.out"

# A lone rank under torchrun (a world of one needs no process group) is supervised too.
torchrun --no-python --nproc-per-node 1 --master-addr 127.0.0.1 --master-port $(free_port 24000) \
  --redirects 3 --log-dir "$out/logs1" "$train" "${common[@]}" --set trainer.steps=100000 \
  --set trainer.save_dir="$out/ckpt1" > "$out/run1.out" 2> "$out/run1.err" &
launcher=$!
pids+=($launcher)
waited=0
until grep -q '^step ' "$out"/logs1/*/attempt_0/0/stdout.log 2> /dev/null || [ $waited -ge 1200 ]; do
  sleep 0.1
  waited=$((waited + 1))
done
sleep 2
mapfile -t ranks < <(pgrep -P $launcher -f zero-train)
check "torchrun started 1 rank" test ${#ranks[@]} -eq 1
pids+=("${ranks[@]}")
{
  kill -9 $launcher
  wait $launcher
} 2> /dev/null
killed_at=$SECONDS
while kill -0 "${ranks[0]}" 2> /dev/null && [ $SECONDS -lt $((killed_at + 30)) ]; do sleep 0.1; done
check "the lone rank stops within comm_timeout_s (30 s) of the launcher's death" \
  bash -c "! kill -0 ${ranks[0]} 2> /dev/null"
echo "  the lone rank stopped $((SECONDS - killed_at)) s after torchrun was killed"
check "the lone rank says the launcher exited" grep -Eq \
  "zero-train rank 0: error: the launcher \(pid $launcher\) exited during training; stopping at step [0-9]+ after saving" \
  "$out"/logs1/*/attempt_0/0/stderr.log

summary
