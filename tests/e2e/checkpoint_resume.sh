#!/usr/bin/env bash
# Checkpoints through real processes. A 2-rank run stopped at step K and resumed on 2 ranks ends
# bitwise where an uninterrupted run ends; resumed on 1 and on 4 ranks (resharded) it ends
# within a tight tolerance; zero-consolidate writes a safetensors file holding exactly the
# model's parameters; keep_last prunes; a damaged shard or another model stops every rank with
# an error naming the file.
set -uo pipefail
train=$1
src=$2
consolidate=$(dirname "$train")/../tools/zero-consolidate
if [ ! -x "$consolidate" ]; then
  echo "FAIL: $consolidate is missing: build the zero-consolidate target (ninja -C build)"
  echo "0 passed, 1 failed"
  exit 1
fi
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
port=$((33500 + RANDOM % 2000))
K=4
N=8
source "$(dirname "${BASH_SOURCE[0]}")/lib/check.sh"
common=(--config "$src/configs/zero2.yaml" --set trainer.model=tiny --set trainer.seq_len=32
        --set train_batch_size=8 --set steps_per_print=100)
# launch NAME RANKS ARGS...: zero-train on RANKS processes (1: no torchrun); log in $out/NAME.log
launch() {
  local name=$1 ranks=$2
  shift 2
  local micro=$((8 / ranks))
  if [ "$ranks" = 1 ]; then
    timeout 300 "$train" "${common[@]}" --set train_micro_batch_size_per_gpu=$micro \
      --summary-json "$out/$name.json" "$@" > "$out/$name.log" 2>&1
  else
    timeout 300 torchrun --no-python --standalone --nproc-per-node "$ranks" \
      --master-port $((port++)) "$train" "${common[@]}" \
      --set train_micro_batch_size_per_gpu=$micro --summary-json "$out/$name.json" "$@" \
      > "$out/$name.log" 2>&1
  fi
}
run() {  # like launch, but a failure is fatal: later checks depend on its output
  launch "$@" || { echo "FAIL $1 (exit $?)"; cat "$out/$1.log"; echo "0 passed, 1 failed"; exit 1; }
}

run ref 2 --set trainer.steps=$N --set trainer.save_dir="$out/ref_ck" \
  --set trainer.save_interval=2 --set trainer.keep_last=2
run part1 2 --set trainer.steps=$K --set trainer.save_dir="$out/ck" --set trainer.save_interval=$K
run resume2 2 --set trainer.steps=$N --set trainer.save_dir="$out/ck" --set trainer.resume=true
run resume1 1 --set trainer.steps=$N --set trainer.save_dir="$out/ck" --set trainer.resume=step$K
run resume4 4 --set trainer.steps=$N --set trainer.save_dir="$out/ck" --set trainer.resume=auto

compare() {  # compare NAME exact|close: final state of NAME against the uninterrupted run
  python3 - "$out" "$1" "$2" <<'PY'
import json, sys
out, name, mode = sys.argv[1:]
ref = json.load(open(f"{out}/ref.json"))
s = json.load(open(f"{out}/{name}.json"))
dl = abs(s["final_loss"] - ref["final_loss"])
dn = abs(s["param_norm"] - ref["param_norm"]) / ref["param_norm"]
dc = abs(s["param_checksum"] - ref["param_checksum"])
print(f"  {name}: final loss diff {dl:.3e}, param norm rel diff {dn:.3e}, checksum diff {dc:.3e}")
if mode == "exact":
    ok = s["param_checksum"] == ref["param_checksum"] and s["final_loss"] == ref["final_loss"]
else:
    ok = dl < 1e-4 and dn < 1e-5 and dc < 1e-2
sys.exit(0 if ok and s["steps"] == 8 - 4 else 1)
PY
}
check "resume on 2 ranks is bitwise the uninterrupted run" compare resume2 exact
check "resume resharded 2 -> 1 rank matches" compare resume1 close
check "resume resharded 2 -> 4 ranks matches" compare resume4 close
check "the resumed run logged the load" grep -q "checkpoint: loaded .*/step$K" "$out/resume2.log"
check "keep_last=2 kept step6 and step8 only" \
  test "$(cd "$out/ref_ck" && ls -d step* | tr '\n' ' ')" = "step6 step8 "
check "latest names the newest" test "$(cat "$out/ref_ck/latest")" = "step8"

# Consolidation: full, unpadded parameters by name; the sum matches the run's checksum.
safetensors_ok() {  # FILE DTYPE BYTES_PER_ELEMENT
  python3 - "$1" "$2" "$3" "$out/part1.json" <<'PY'
import json, struct, sys, array
path, dtype, elem, summary = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
s = json.load(open(summary))
data = open(path, "rb").read()
(n,) = struct.unpack("<Q", data[:8])
header = json.loads(data[8:8 + n])
body = data[8 + n:]
meta = header.pop("__metadata__")
numel = 0
total = 0.0
end = 0
for name, t in header.items():
    count = 1
    for d in t["shape"]:
        count *= d
    b, e = t["data_offsets"]
    assert t["dtype"] == dtype and e - b == count * elem, (name, t)
    numel += count
    end = max(end, e)
    if dtype == "F32":
        total += sum(array.array("f", body[b:e]))
assert numel == s["num_params"], (numel, s["num_params"])
assert end == len(body) == numel * elem, "padding or stray bytes in the data section"
assert meta["zero.tag"] == "step4", meta
if dtype == "F32":
    rel = abs(total - s["param_checksum"]) / max(1.0, abs(s["param_checksum"]))
    print(f"  {len(header)} tensors, {numel} elements, sum {total:.6f} vs checksum {s['param_checksum']:.6f}")
    assert rel < 1e-4, rel
PY
}
check "zero-consolidate fp32" "$consolidate" --checkpoint "$out/ck" --tag step$K \
  --out "$out/model.safetensors"
check "safetensors fp32 holds exactly the model" safetensors_ok "$out/model.safetensors" F32 4
check "zero-consolidate bf16 (latest)" "$consolidate" --checkpoint "$out/ck" --dtype bf16 \
  --out "$out/model_bf16.safetensors"
# No resumed run saved, so `latest` still names step4.
check "safetensors bf16 holds exactly the model" safetensors_ok "$out/model_bf16.safetensors" BF16 2

# Failures stop every rank with the file named and change no file. Launched by hand (no
# torchrun, which kills the other ranks once one exits), so each rank's own error shows.
by_hand() {  # by_hand NAME RANKS ARGS...: rank r logs to $out/NAME.r.log; fails if any rank did
  local name=$1 ranks=$2 p=$((port++)) rc=0 pids=()
  shift 2
  for ((r = 0; r < ranks; r++)); do
    RANK=$r LOCAL_RANK=$r WORLD_SIZE=$ranks MASTER_ADDR=127.0.0.1 MASTER_PORT=$p \
      timeout 120 "$train" "${common[@]}" --set train_micro_batch_size_per_gpu=$((8 / ranks)) \
      --set comm_timeout_s=30 "$@" > "$out/$name.$r.log" 2>&1 &
    pids+=($!)
  done
  for pid in "${pids[@]}"; do wait "$pid" || rc=1; done
  return $rc
}
every_rank_says() {  # NAME RANKS TEXT: every rank exited with an error containing TEXT
  for ((r = 0; r < $2; r++)); do
    grep -q "zero-train rank $r: error: .*$3" "$out/$1.$r.log" || { cat "$out/$1.$r.log"; return 1; }
  done
}
digest() { (cd "$1" && find . -type f | sort | xargs sha256sum); }
cp -r "$out/ck" "$out/bad"
shard="$out/bad/step$K/shard_rank1_of_2.bin"
# A byte of the data near the end: only the rank that checksums file 1 sees it.
printf '\x55' | dd of="$shard" bs=1 seek=$(($(stat -c %s "$shard") - 10)) conv=notrunc 2>/dev/null
digest "$out/bad" > "$out/bad.before"
digest "$out/ck" > "$out/ck.before"
by_hand corrupt 2 --set trainer.steps=$N --set trainer.save_dir="$out/bad" --set trainer.resume=true
rc=$?
check "a corrupted shard fails the run" test $rc -ne 0
check "every rank names the corrupted file" every_rank_says corrupt 2 \
  "shard_rank1_of_2.bin: corrupted: the data checksum"
by_hand other 2 --set trainer.steps=$N --set trainer.save_dir="$out/ck" --set trainer.resume=true \
  --set trainer.model=small
rc=$?
check "another model fails the run" test $rc -ne 0
check "every rank says it is a different model" every_rank_says other 2 "different model"
rm -rf "$out/bad/step$K/shard_rank0_of_2.bin"
by_hand missing 2 --set trainer.steps=$N --set trainer.save_dir="$out/bad" --set trainer.resume=true
rc=$?
check "a missing shard fails the run" test $rc -ne 0
check "every rank names the missing file" every_rank_says missing 2 "shard_rank0_of_2.bin: missing"
check "refused loads changed no file" \
  bash -c "diff <(grep -v shard_rank0 '$out/bad.before') <(cd '$out/bad' && find . -type f | sort | xargs sha256sum) >/dev/null && diff '$out/ck.before' <(cd '$out/ck' && find . -type f | sort | xargs sha256sum) >/dev/null"

summary
