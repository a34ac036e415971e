#!/usr/bin/env bash
# Real processes through torchrun: stages 0, 1 and 2 on 2 ranks, and stage 0 on 1 process with
# the same global batch, must end with the same parameters (fp32, tight tolerance).
set -euo pipefail
train=$1
src=$2
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
common=(--config "$src/configs/zero2.yaml" --set trainer.model=tiny --set trainer.steps=6
        --set trainer.seq_len=32 --set train_batch_size=8 --set steps_per_print=100)
port=$((29500 + RANDOM % 2000))

"$train" "${common[@]}" --set zero_optimization.stage=0 --set train_micro_batch_size_per_gpu=8 \
  --summary-json "$out/ref.json" > "$out/ref.log"
for stage in 0 1 2; do
  torchrun --no-python --standalone --nproc-per-node 2 --master-port $((port + stage)) "$train" \
    "${common[@]}" --set zero_optimization.stage=$stage --set train_micro_batch_size_per_gpu=4 \
    --summary-json "$out/s$stage.json" > "$out/s$stage.log" 2>&1 || { cat "$out/s$stage.log"; exit 1; }
done

python3 - "$out" <<'PY'
import json, sys, math
out = sys.argv[1]
ref = json.load(open(f"{out}/ref.json"))
assert ref["world_size"] == 1, ref
ok = True
for stage in (0, 1, 2):
    s = json.load(open(f"{out}/s{stage}.json"))
    assert s["world_size"] == 2 and s["stage"] == stage, s
    rel = abs(s["param_norm"] - ref["param_norm"]) / ref["param_norm"]
    csum = abs(s["param_checksum"] - ref["param_checksum"])
    dloss = abs(s["final_loss"] - ref["final_loss"])
    print(f"stage {stage}: norm rel diff {rel:.2e}, checksum diff {csum:.2e}, final loss diff {dloss:.2e}")
    ok &= rel < 1e-5 and csum < 1e-2 and dloss < 1e-4
    assert len(s["memory"]) == 2
    assert s["final_loss"] < s["first_loss"], "the loss must fall"
print("1 passed, 0 failed" if ok else "0 passed, 1 failed")
sys.exit(0 if ok else 1)
PY
