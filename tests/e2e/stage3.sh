#!/usr/bin/env bash
# ZeRO stage 3 through zero-train and torchrun (2 ranks, the example GPT, each block a unit):
# the same losses, parameter norm and checksum as stage 2 on the same config (fp32, within
# 1e-6 relative), and a memory report with no parameter bytes held whole per rank (every
# module a unit: their shards are the fp32 master); the same with optimizer offload, and at tp 2 x dp 2.
# Stage-3 checkpoints: stage3_checkpoint.sh.
set -euo pipefail
train=$1
src=$2
source "$src/tests/e2e/lib/check.sh"
use_scratch
port=$(free_port 26000)
common=(--config "$src/configs/zero2.yaml" --set trainer.model=tiny --set trainer.steps=4
        --set trainer.seq_len=32 --set train_micro_batch_size_per_gpu=4 --set steps_per_print=1
        --set gradient_accumulation_steps=2 --set zero_optimization.reduce_bucket_size=3000
        --set zero_optimization.stage3_param_persistence_threshold=0)
run() {  # run NAME SETS...
  local name=$1
  shift
  port=$((port + 1))
  torchrun --no-python --standalone --nproc-per-node 2 --master-port $port "$train" \
    "${common[@]}" "$@" --summary-json "$out/$name.json" > "$out/$name.log" 2>&1
}
check "stage 2 trains" run s2 --set zero_optimization.stage=2
check "stage 3 trains" run s3 --set zero_optimization.stage=3
check "stage 3 matches stage 2" python3 - "$out" <<'PY'
import json, re, sys
out = sys.argv[1]
s2 = json.load(open(f"{out}/s2.json"))
s3 = json.load(open(f"{out}/s3.json"))
assert s3["stage"] == 3 and s2["stage"] == 2 and s3["world_size"] == 2, (s2["stage"], s3["stage"])
ok = True
for k in ("first_loss", "final_loss", "param_norm", "param_checksum"):
    rel = abs(s3[k] - s2[k]) / max(abs(s2[k]), 1e-12)
    print(f"{k}: stage 2 {s2[k]!r}, stage 3 {s3[k]!r}, rel diff {rel:.1e}")
    ok &= rel < 1e-6
l2 = re.findall(r"loss[ =:]*([-0-9.e+]+)", open(f"{out}/s2.log").read())
l3 = re.findall(r"loss[ =:]*([-0-9.e+]+)", open(f"{out}/s3.log").read())
assert l2 and len(l2) == len(l3), (l2, l3)
for a, b in zip(l2, l3):
    ok &= abs(float(a) - float(b)) <= 1e-6 * abs(float(a))
# Per rank, the parameters held whole between steps: stage 2 every one, stage 3 none (the
# embedding, blocks, final norm are units, persistence threshold 0: no root unit).
p2 = [m["measured"]["params"] for m in s2["memory"]]
p3 = [m["measured"]["params"] for m in s3["memory"]]
print(f"params bytes per rank: stage 2 {p2}, stage 3 {p3}")
ok &= all(a > 0 and b == 0 for a, b in zip(p2, p3))
sys.exit(0 if ok else 1)
PY

# What holds at stage 2 holds at stage 3: optimizer offload (2 ranks), tensor parallelism
# (tp 2 x dp 2, 4 ranks, clipping: the summary's norm and checksum gathered over dp and tp).
run4() {  # run4 NAME SETS...: as run, on 4 ranks
  local name=$1
  shift
  port=$((port + 1))
  torchrun --no-python --standalone --nproc-per-node 4 --master-port $port "$train" \
    "${common[@]}" "$@" --summary-json "$out/$name.json" > "$out/$name.log" 2>&1
}
same() {  # same A B: the summaries' losses, norm and checksum within 1e-6 relative
  python3 - "$out/$1.json" "$out/$2.json" <<'PY'
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:3])
bad = [k for k in ("first_loss", "final_loss", "param_norm", "param_checksum")
       if abs(a[k] - b[k]) > 1e-6 * max(abs(a[k]), 1e-12)]
print({k: (a[k], b[k]) for k in ("final_loss", "param_norm", "param_checksum")})
sys.exit(1 if bad else 0)
PY
}
offload=(--set zero_optimization.offload_optimizer.device=cpu)
check "stage 2 with optimizer offload trains" run off2 --set zero_optimization.stage=2 "${offload[@]}"
check "stage 3 with optimizer offload trains" run off3 --set zero_optimization.stage=3 "${offload[@]}"
check "stage 3 with optimizer offload matches stage 2's" same off2 off3
tp=(--set tensor_parallel.autotp_size=2 --set gradient_clipping=0.5)
check "stage 2 at tp 2 x dp 2 trains" run4 tp2 --set zero_optimization.stage=2 "${tp[@]}"
check "stage 3 at tp 2 x dp 2 trains" run4 tp3 --set zero_optimization.stage=3 "${tp[@]}"
check "stage 3 at tp 2 x dp 2 matches stage 2" same tp2 tp3
summary
