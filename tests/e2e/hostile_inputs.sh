#!/usr/bin/env bash
# Inputs that used to mislead, and the public configs that used to fail:
#  - LLaMA-Factory's ZeRO-0/2/2-offload configs, unchanged, train 3 steps on 2 ranks; their
#    top-level comms_config / monitor_config are named in one warning, the offload is in the
#    start-up line;
#  - ranks launched with different WORLD_SIZEs are told they disagree (not to check the network);
#  - binary garbage in `latest` is shown escaped by zero-train and zero-consolidate;
#  - a YAML nested 5000 deep says so;
#  - resuming an fp32 checkpoint with bf16 on warns, naming both;
#  - every error has one prefix (no "error: zero:").
# Ranks are started by hand (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT) on 127.0.0.1.
set -uo pipefail
train=$1
src=$2
consolidate=$(dirname "$train")/../tools/zero-consolidate
source "$(dirname "${BASH_SOURCE[0]}")/lib/check.sh"
use_scratch
tiny=(--set trainer.model=tiny --set trainer.seq_len=32)
export OMP_NUM_THREADS=1

# launch NAME PORT RANK:WORLD_SIZE... -- ARGS: ranks in the background, pids in $launched.
launch() {
  local name=$1 port=$2
  shift 2
  local specs=()
  while [ "$1" != "--" ]; do specs+=("$1"); shift; done
  shift
  launched=()
  for spec in "${specs[@]}"; do
    local r=${spec%:*} w=${spec#*:}
    env RANK=$r LOCAL_RANK=$r WORLD_SIZE=$w MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
      "$train" "$@" > "$out/$name.$r.out" 2> "$out/$name.$r.err" &
    launched+=($!)
    pids+=($!)
  done
}

# 1. LLaMA-Factory's configs.
for cfg in ds_z0_config ds_z2_config ds_z2_offload_config; do
  file=$src/tests/data/ds_corpus/llamafactory_$cfg.json
  launch "$cfg" "$(free_port 26000)" 0:2 1:2 -- --config "$file" "${tiny[@]}" --set trainer.steps=3
  rcs=()
  for pid in "${launched[@]}"; do wait "$pid"; rcs+=($?); done
  check "$cfg: both ranks train 3 steps and exit 0" test "${rcs[*]}" = "0 0"
  check "$cfg: rank 0 finishes" grep -q "^done: loss" "$out/$cfg.0.out"
  at1=$(grep -n '"comms_config"' "$file" | cut -d: -f1)
  at2=$(grep -n '"monitor_config"' "$file" | cut -d: -f1)
  check "$cfg: one warning names comms_config and monitor_config" \
    test "$(grep -cF "ignoring 'comms_config' ($file:$at1), 'monitor_config' ($file:$at2): DeepSpeed does not read these keys either" "$out/$cfg.0.err")" -eq 1
  [ $cfg = ds_z2_offload_config ] && check "$cfg: the start-up line says the optimizer is offloaded" \
    grep -q "ZeRO stage 2 (optimizer offloaded to CPU), fp32" "$out/$cfg.0.out"
  grep -m1 "ignoring" "$out/$cfg.0.err" | cut -c1-300 | sed 's/^/    /'
done

# 2. WORLD_SIZE 2 next to WORLD_SIZE 3: both ranks say so, long before comm_timeout_s.
port=$(free_port 26000)
start=$SECONDS
launch ws "$port" 0:2 1:3 -- --config "$src/configs/zero2.yaml" "${tiny[@]}" --set trainer.steps=2 \
  --set comm_timeout_s=60
rcs=()
for pid in "${launched[@]}"; do wait "$pid"; rcs+=($?); done
echo "  world-size mismatch: both ranks ended after $((SECONDS - start)) s"
check "WORLD_SIZE mismatch: both ranks exit non-zero" test "${rcs[0]}" -ne 0 -a "${rcs[1]}" -ne 0
check "WORLD_SIZE mismatch: within 30 s (comm_timeout_s = 60)" test $((SECONDS - start)) -lt 30
check "WORLD_SIZE mismatch: rank 0 says the ranks disagree" grep -q \
  "zero-train rank 0: error: rank 0 of 2: rank 1 was launched with WORLD_SIZE=3, this rank (rank 0) with WORLD_SIZE=2: the ranks disagree on the world size" \
  "$out/ws.0.err"
check "WORLD_SIZE mismatch: rank 1 says the ranks disagree" grep -q \
  "zero-train rank 1: error: rank 1 of 3: rank 0 was launched with WORLD_SIZE=2, this rank (rank 1) with WORLD_SIZE=3" \
  "$out/ws.1.err"
grep -hm1 "error" "$out"/ws.*.err | cut -c1-300 | sed 's/^/    /'

# 3. Binary garbage in `latest`: escaped, with the byte count, by both programs.
mkdir -p "$out/garbage"
printf '\x00\x01\xfestep2' > "$out/garbage/latest"
"$train" --config "$src/configs/zero2.yaml" "${tiny[@]}" --set trainer.steps=2 \
  --set trainer.save_dir="$out/garbage" --set trainer.resume=true > "$out/g.out" 2> "$out/g.err"
want="$out/garbage/latest: does not hold a checkpoint tag but 8 bytes of other data (\"\\x00\\x01\\xfestep2\")"
check "garbage latest: zero-train shows the bytes escaped" grep -qF "$want" "$out/g.err"
check "garbage latest: zero-train's error line" grep -q "^zero-train: error: load_checkpoint" "$out/g.err"
"$consolidate" --checkpoint "$out/garbage" --out "$out/m.safetensors" > /dev/null 2> "$out/c.err"
check "garbage latest: zero-consolidate shows the bytes escaped" \
  grep -qF "zero-consolidate: error: $want" "$out/c.err"
sed 's/^/    /' "$out/c.err" | cut -c1-300

# 4. A YAML nested 5000 deep.
python3 -c 'print("a: " + "[" * 5000 + "]" * 5000)' > "$out/deep.yaml"
"$train" --config "$out/deep.yaml" > /dev/null 2> "$out/deep.err"
check "deep YAML: says it is nested past yaml-cpp's limit" grep -q \
  "zero-train: error: $out/deep.yaml:1:[0-9]*: the document nests deeper than yaml-cpp's limit of [0-9]* levels" \
  "$out/deep.err"
check "errors carry one prefix" test "$(cat "$out"/*.err | grep -c 'error: zero:')" -eq 0
sed 's/^/    /' "$out/deep.err" | cut -c1-300

# 5. An fp32 checkpoint resumed with bf16 on: allowed, with a warning naming both.
"$train" --config "$src/configs/zero2.yaml" "${tiny[@]}" --set trainer.steps=2 \
  --set trainer.save_dir="$out/fp32" --set trainer.save_interval=2 > /dev/null 2>&1
"$train" --config "$src/configs/zero2.yaml" "${tiny[@]}" --set trainer.steps=3 \
  --set trainer.save_dir="$out/fp32" --set trainer.resume=auto --set bf16.enabled=true \
  > "$out/bf16.out" 2> "$out/bf16.err"
check "fp32 -> bf16 resume: trains on" grep -q "^done: loss" "$out/bf16.out"
check "fp32 -> bf16 resume: warns naming both dtypes" grep -q \
  "zero: warning: $out/fp32/step2 was saved by a run computing in fp32; this run computes in bf16" \
  "$out/bf16.err"
grep -m1 "was saved" "$out/bf16.err" | cut -c1-300 | sed 's/^/    /'

summary
