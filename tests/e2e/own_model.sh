#!/usr/bin/env bash
# The getting-started page's own-model program (examples/own_model.cpp, public API only) on 2
# ranks with bf16, ZeRO-2 and 2 accumulation steps: trained 8 steps at once, and 4 steps then
# resumed from its checkpoint to 8; the resumed run's last 4 losses equal the uninterrupted
# run's to the printed digit, and the loss falls. Then its tensor-parallel form
# (own_model_tp.cpp) at tp 2 x dp 2 against tp 1 x dp 2.
set -euo pipefail
own=$(dirname "$1")/zero-own-model
src=$2
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
port=$((29500 + RANDOM % 2000))
run() {  # run NAME --set ...: 2 ranks, the losses rank 0 printed in $out/NAME.log
  local name=$1; shift
  torchrun --no-python --standalone --nproc-per-node 2 --master-port $((port++)) "$own" \
    --config "$src/configs/zero2.yaml" --set bf16.enabled=true --set gradient_accumulation_steps=2 \
    --set train_micro_batch_size_per_gpu=8 --set train_batch_size=32 --set optimizer.params.lr=0.01 \
    --set scheduler.params.warmup_num_steps=1 "$@" > "$out/$name.log" 2>&1 ||
    { cat "$out/$name.log"; exit 1; }
}
run whole --set app.steps=8
run first --set app.steps=4 --set app.save_dir="$out/ckpt"
run resumed --set app.steps=8 --set app.save_dir="$out/ckpt"
grep '^step' "$out/whole.log" > "$out/whole.txt"
cat "$out/first.log" "$out/resumed.log" | grep '^step' > "$out/split.txt"
cat "$out/split.txt"
test "$(wc -l < "$out/whole.txt")" -eq 8 || { echo "FAIL: 8 steps expected"; cat "$out/whole.log"; exit 1; }
ls "$out/ckpt" | grep -qx step8 || { echo "FAIL: no step8 checkpoint"; ls "$out/ckpt"; exit 1; }
diff "$out/whole.txt" "$out/split.txt" || { echo "FAIL: the resumed run's losses differ"; exit 1; }
python3 - "$out/whole.txt" <<'PY'
import sys
losses = [float(l.split()[3]) for l in open(sys.argv[1])]
assert losses[-1] < 0.5 * losses[0], f"the loss must fall: {losses}"
print(f"loss {losses[0]:.4f} -> {losses[-1]:.4f}; resume exact")
PY
# The tensor-parallel form (examples/own_model_tp.cpp): T 2 x D 2 on 4 ranks trains as T 1 x D 2
# on 2 (the same full initial weights from each layer's seed, the same rows per dp rank).
own_dir=$(dirname "$own")
tp_run() {  # tp_run NAME NPROC --set ...
  local name=$1 n=$2; shift 2
  torchrun --no-python --standalone --nproc-per-node "$n" --master-port $((port++)) \
    "$own_dir/zero-own-model-tp" --config "$src/configs/zero1.yaml" \
    --set train_micro_batch_size_per_gpu=8 --set optimizer.params.lr=0.01 --set app.steps=6 \
    "$@" > "$out/$name.log" 2>&1 || { cat "$out/$name.log"; exit 1; }
}
tp_run tp1 2
tp_run tp2 4 --set tensor_parallel.autotp_size=2
python3 - "$out/tp1.log" "$out/tp2.log" <<'PY'
import sys
def losses(p):
    return [float(l.split()[3]) for l in open(p) if l.startswith("step ")]
a, b = losses(sys.argv[1]), losses(sys.argv[2])
assert len(a) == 6 and len(b) == 6, (a, b)
worst = max(abs(x - y) / abs(x) for x, y in zip(a, b))
print(f"tp 2 x dp 2 vs tp 1 x dp 2: max rel diff {worst:.1e} over 6 steps")
assert worst < 1e-5, (a, b)
print("2 passed, 0 failed")
PY
