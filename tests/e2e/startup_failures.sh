#!/usr/bin/env bash
# Start-up never waits past comm_timeout_s: a foreign program on MASTER_PORT, a rank that never
# arrives, no rank 0 at all, a rank that arrives and dies, and a launcher that dies during
# start-up each end every rank with a one-line error saying what it waited for and what to
# check, within comm_timeout_s plus a margin.
# Ranks are started by hand (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT) on 127.0.0.1 only.
set -uo pipefail
train=$1
src=$2
timeout_s=8
margin_s=6
source "$(dirname "${BASH_SOURCE[0]}")/lib/check.sh"
use_scratch

# rank NAME RANK WORLD PORT [ENV...]: one zero-train rank in the background; its pid is appended
# to pids.
rank() {
  local name=$1 r=$2 world=$3 port=$4
  shift 4
  env "$@" RANK=$r LOCAL_RANK=$r WORLD_SIZE=$world MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
    "$train" --config "$src/configs/zero2.yaml" --set trainer.model=tiny --set trainer.seq_len=32 \
    --set trainer.steps=2 --set train_micro_batch_size_per_gpu=2 \
    --set comm_timeout_s=$timeout_s > "$out/$name.$r.out" 2> "$out/$name.$r.err" &
  pids+=($!)
}

# expect_exit NAME RANK PID STARTED LIMIT PATTEREN: the rank ends non-zero within LIMIT seconds of
# STARTED with one error line matching PATTERN and no C++ backtrace.
expect_exit() {
  local name=$1 r=$2 pid=$3 started=$4 limit=$5 pattern=$6
  local deadline=$((started + limit))
  while kill -0 "$pid" 2> /dev/null && [ $SECONDS -lt $deadline ]; do sleep 0.1; done
  if kill -0 "$pid" 2> /dev/null; then
    check "$name: rank $r ends within ${limit}s" false
    kill -9 "$pid"
    wait "$pid" 2> /dev/null
    return
  fi
  wait "$pid" 2> /dev/null
  local rc=$?  # 127: not this shell's child (started by a launcher): its status is unknown
  echo "  $name: rank $r exited with $rc after $((SECONDS - started)) s"
  check "$name: rank $r ends within ${limit}s" true
  [ $rc -ne 127 ] && check "$name: rank $r exits non-zero" test $rc -ne 0
  check "$name: rank $r says what it waited for and what to check" \
    grep -Eq "zero-train rank $r: error: .*$pattern" "$out/$name.$r.err"
  check "$name: rank $r prints no C++ backtrace" \
    test "$(grep -c 'frame #\|Exception raised from' "$out/$name.$r.err")" -eq 0
  grep -m1 "error" "$out/$name.$r.err" | cut -c1-400 | sed 's/^/    /'
}


# 1. Another program holds MASTER_PORT: it accepts connections and never answers. Rank 0 cannot
# serve the store there; rank 1 (and every rank under torchrun's agent store) waits for a
# handshake that never comes.
port=$(free_port)
python3 -c '
import socket, sys, time
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", int(sys.argv[1]))); s.listen(16)
held = []
end = time.time() + 120
while time.time() < end:
    s.settimeout(1)
    try: held.append(s.accept()[0])
    except socket.timeout: pass
' "$port" &
pids+=($!)
sleep 1
start=$SECONDS
rank foreign 0 2 "$port"
rank foreign 1 2 "$port"
rank agent 0 2 "$port" TORCHELASTIC_USE_AGENT_STORE=True
expect_exit foreign 0 "${pids[1]}" $start $((timeout_s + margin_s)) \
  "MASTER_PORT=$port is already in use by another program"
expect_exit foreign 1 "${pids[2]}" $start $((timeout_s + margin_s)) \
  "connecting to the rendezvous store at MASTER_ADDR=127.0.0.1 MASTER_PORT=$port did not finish within comm_timeout_s = $timeout_s s: .*never answered like a rendezvous store: another program probably holds port $port"
expect_exit agent 0 "${pids[3]}" $start $((timeout_s + margin_s)) \
  "never answered like a rendezvous store"
{
  kill -9 "${pids[0]}"
  wait "${pids[0]}"
} 2> /dev/null
pids=()

# 2. Rank 2 of 3 is never launched: ranks 0 and 1 name it.
port=$(free_port)
start=$SECONDS
rank absent 0 3 "$port"
rank absent 1 3 "$port"
for r in 0 1; do
  expect_exit absent $r "${pids[$r]}" $start $((timeout_s + margin_s)) \
    "waiting for every rank to reach the rendezvous .*rank 2 never arrived: check that it was launched"
done
pids=()

# 3. Nothing listens at MASTER_ADDR:MASTER_PORT (rank 0 never started).
port=$(free_port)
start=$SECONDS
rank norank0 1 2 "$port"
expect_exit norank0 1 "${pids[0]}" $start $((timeout_s + margin_s)) \
  "connecting to the rendezvous store at MASTER_ADDR=127.0.0.1 MASTER_PORT=$port did not finish within comm_timeout_s = $timeout_s s: nothing accepts connections at 127.0.0.1:$port: check that rank 0 was launched"
pids=()

# 4. Rank 2 arrives at the rendezvous and dies before it connects the process group (a stand-in
# that only sets its arrival key): ranks 0 and 1 name it from its heartbeat.
port=$(free_port)
python3 -c '
import sys, datetime
from torch.distributed import TCPStore
print("ready", flush=True)
s = TCPStore("127.0.0.1", int(sys.argv[1]), is_master=False, timeout=datetime.timedelta(seconds=60))
s.set("zero/0/alive/2", "0")
s.append("zero/0/arrivals", "2,")
' "$port" > "$out/fake.out" 2>&1 &
pids+=($!)
for _ in $(seq 600); do grep -q ready "$out/fake.out" && break; sleep 0.1; done
start=$SECONDS
rank died 0 3 "$port"
rank died 1 3 "$port"
for r in 0 1; do
  expect_exit died $r "${pids[$((r + 1))]}" $start $((timeout_s + margin_s)) \
    "(connecting the process group|setting up the process group).*rank 2 is gone \(no heartbeat"
done
pids=()

# 5. The launcher dies during start-up (ranks 0 and 1 of 3 wait for rank 2): with a long
# comm_timeout_s they still stop within seconds, saying the launcher is gone.
port=$(free_port)
timeout_s=120
bash -c '
  for r in 0 1; do
    RANK=$r LOCAL_RANK=$r WORLD_SIZE=3 MASTER_ADDR=127.0.0.1 MASTER_PORT='"$port"' \
      "$1" --config "$2/configs/zero2.yaml" --set trainer.model=tiny --set trainer.seq_len=32 \
      --set comm_timeout_s=120 > "$3/launcher.$r.out" 2> "$3/launcher.$r.err" &
    echo $! >> "$3/launcher.pids"
  done
  wait' _ "$train" "$src" "$out" &
launcher=$!
pids+=($launcher)
for _ in $(seq 50); do [ "$(wc -l 2> /dev/null < "$out/launcher.pids")" = 2 ] && break; sleep 0.1; done
mapfile -t ranks < "$out/launcher.pids"
pids+=("${ranks[@]}")
# Both ranks are waiting for rank 2 once they hold their store connections (two each).
for _ in $(seq 600); do
  [ "$(ss -Htn state established "( dport = :$port )" | wc -l)" -ge 4 ] && break
  sleep 0.1
done
sleep 0.5
{
  kill -9 $launcher
  wait $launcher
} 2> /dev/null
start=$SECONDS
for r in 0 1; do
  expect_exit launcher $r "${ranks[$r]}" $start 5 \
    "the launcher \(pid $launcher\) exited while this rank was waiting for every rank"
done
pids=()

summary
