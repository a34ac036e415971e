#!/usr/bin/env bash
# A rank that dies mid-training (kill -9) must not hang the others: each survivor exits non-zero
# within comm_timeout_s plus a margin, with an error naming its rank and the collective that
# failed, and naming the rank that is gone. Ranks are started by hand (RANK, WORLD_SIZE,
# MASTER_ADDR, MASTER_PORT), not through torchrun, whose agent would kill the survivors itself
# and so hide whether our timeout works.
set -uo pipefail
train=$1
src=$2
timeout_s=10
margin_s=30
source "$(dirname "${BASH_SOURCE[0]}")/lib/check.sh"
use_scratch

# scenario VICTIM SIGNAL: 3 ranks train; once rank 0 has logged a few steps, VICTIM gets SIGNAL:
# KILL (it dies, its sockets close) or STOP (it hangs with sockets open: only the collective
# timeout can end the survivors' wait).
scenario() {
  local victim=$1 sig=$2 port=$(free_port 22000)
  local tag="${sig,,}$victim"
  pids=()
  for r in 0 1 2; do
    # No `timeout` wrapper: kill -9 must hit zero-train itself. The deadlines below (and
    # cleanup on exit) bound every wait instead.
    RANK=$r LOCAL_RANK=$r WORLD_SIZE=3 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
      "$train" --config "$src/configs/zero2.yaml" --set trainer.model=tiny \
      --set trainer.seq_len=32 --set trainer.steps=100000 --set steps_per_print=1 \
      --set train_micro_batch_size_per_gpu=2 --set comm_timeout_s=$timeout_s \
      > "$out/$tag.$r.out" 2> "$out/$tag.$r.err" &
    pids+=($!)
  done
  local waited=0
  until [ "$(grep -c '^step' "$out/$tag.0.out" 2>/dev/null)" -ge 3 ] || [ $waited -ge 600 ]; do
    sleep 0.1
    waited=$((waited + 1))
  done
  check "$tag: training started" test $waited -lt 600
  kill -s "$sig" "${pids[$victim]}"
  local killed_at=$SECONDS
  local deadline=$((killed_at + timeout_s + margin_s))
  for r in 0 1 2; do
    [ "$r" = "$victim" ] && continue
    while kill -0 "${pids[$r]}" 2>/dev/null && [ $SECONDS -lt $deadline ]; do sleep 0.2; done
    if kill -0 "${pids[$r]}" 2>/dev/null; then
      check "$tag: rank $r exits within ${timeout_s}s + ${margin_s}s" false
      kill -9 "${pids[$r]}"
      wait "${pids[$r]}" 2>/dev/null
      continue
    fi
    wait "${pids[$r]}"
    local rc=$?
    echo "  $tag: rank $r exited with $rc after $((SECONDS - killed_at)) s"
    check "$tag: rank $r exits within ${timeout_s}s + ${margin_s}s" true
    check "$tag: rank $r exits non-zero" test $rc -ne 0
    check "$tag: rank $r names itself and the collective" \
      grep -Eq "zero-train rank $r: error: rank $r of 3: .*(all_reduce|reduce_scatter|all_gather|broadcast|barrier).* failed" \
      "$out/$tag.$r.err"
    # Gloo knows the peer only by address: the heartbeats in the store name the rank.
    check "$tag: rank $r names rank $victim as gone" \
      grep -Eq "zero-train rank $r: error: .*rank $victim is (stopped or )?gone" "$out/$tag.$r.err"
    grep -m1 "error" "$out/$tag.$r.err" | cut -c1-400 | sed 's/^/    /'
  done
  kill -9 "${pids[$victim]}" 2>/dev/null
  wait "${pids[$victim]}" 2>/dev/null  # reap it quietly
  pids=()
}

scenario 1 KILL  # a worker dies
scenario 0 KILL  # the rank that serves the rendezvous store dies
scenario 2 STOP  # a worker stalls: the survivors' collectives time out after comm_timeout_s

summary
