#!/usr/bin/env bash
# torchrun --no-python run.sh, run.sh a shell script that starts the trainer (not with exec): a
# wrapper between the launcher and each rank, as cluster scripts have. torchrun killed (kill -9)
# mid-run: the ranks' parent (the wrapper) lives on, so a check of the parent pid alone never
# notices, and the ranks trained on unsupervised (a short run to its end, exiting 0: 4 runs of
# 4). They must find the elastic agent up the process tree, notice its death, stop together
# after a last checkpoint and exit non-zero with an error naming the launcher.
set -uo pipefail
train=$1
src=$2
source "$(dirname "${BASH_SOURCE[0]}")/lib/check.sh"
use_scratch
port=$(free_port 30000)
cat > "$out/run.sh" << 'SH'
#!/usr/bin/env bash
# Starts the trainer as a child (no exec) and records its exit status.
"$ZERO_TRAIN" "$@"
echo $? > "$ZERO_RC_DIR/rc.$RANK"
SH
chmod +x "$out/run.sh"
export ZERO_TRAIN=$train ZERO_RC_DIR=$out
steps=100000
torchrun --no-python --nproc-per-node 2 --master-addr 127.0.0.1 --master-port "$port" \
  --redirects 3 --log-dir "$out/logs" "$out/run.sh" --config "$src/configs/zero2.yaml" \
  --set trainer.model=tiny --set trainer.seq_len=32 --set train_micro_batch_size_per_gpu=2 \
  --set steps_per_print=100000 --set comm_timeout_s=30 --set trainer.steps=$steps \
  --set trainer.save_dir="$out/ckpt" --set trainer.save_interval=100000 \
  > "$out/run.out" 2> "$out/run.err" &
launcher=$!
pids+=($launcher)
rank0_out() { cat "$out"/logs/*/attempt_0/0/stdout.log 2> /dev/null; }
waited=0
until [ "$(rank0_out | grep -c '^step ')" -ge 1 ] || [ $waited -ge 1200 ]; do
  sleep 0.1
  waited=$((waited + 1))
done
sleep 2
check "training started under torchrun through a wrapper" test $waited -lt 1200
mapfile -t wrappers < <(pgrep -P $launcher -f run.sh)
check "torchrun started 2 wrappers" test ${#wrappers[@]} -eq 2
ranks=()
for w in "${wrappers[@]}"; do ranks+=($(pgrep -P "$w" -f zero-train)); done
check "each wrapper started a rank" test ${#ranks[@]} -eq 2
pids+=("${wrappers[@]}" "${ranks[@]}")
{
  kill -9 $launcher
  wait $launcher
} 2> /dev/null
killed_at=$SECONDS
for pid in "${ranks[@]}"; do
  while kill -0 "$pid" 2> /dev/null && [ $SECONDS -lt $((killed_at + 30)) ]; do sleep 0.1; done
  check "rank pid $pid stops within 30 s of the launcher's death" \
    bash -c "! kill -0 $pid 2> /dev/null"
done
echo "  ranks stopped $((SECONDS - killed_at)) s after torchrun was killed"
# The wrappers write the status once their rank has exited.
for _ in $(seq 50); do
  [ -e "$out/rc.0" ] && [ -e "$out/rc.1" ] && break
  sleep 0.1
done
errs=$(cat "$out"/logs/*/attempt_0/*/stderr.log 2> /dev/null)
echo "$errs" | grep -m2 "error" | cut -c1-300 | sed 's/^/    /'
for r in 0 1; do
  check "rank $r exits non-zero" bash -c "test -s '$out/rc.$r' && test \"\$(cat '$out/rc.$r')\" != 0"
  check "rank $r says the launcher (torchrun, pid $launcher) exited" \
    grep -Eq "zero-train rank $r: error: the launcher \(pid $launcher\) exited during training; stopping at step [0-9]+ after saving $out/ckpt/step[0-9]+" \
    <<< "$errs"
done
check "the ranks agree on the step" \
  test "$(grep -oE 'stopping at step [0-9]+' <<< "$errs" | sort -u | wc -l)" -eq 1
summary
