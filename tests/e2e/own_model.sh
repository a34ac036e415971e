#!/usr/bin/env bash
# The getting-started page's own-model program (examples/own_model.cpp, public API only) on 2
# ranks with bf16, ZeRO-2 and 2 accumulation steps: trained 8 steps at once, and 4 steps then
# resumed from its checkpoint to 8; the resumed run's last 4 losses equal the uninterrupted
# run's to the printed digit, and the loss falls.
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
print(f"loss {losses[0]:.4f} -> {losses[-1]:.4f}; resume exact; 1 passed, 0 failed")
PY
