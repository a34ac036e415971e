#!/usr/bin/env bash
# DeepSpeed's monitors from its config keys: 2 ranks train with tensorboard and csv_monitor on;
# TensorBoard's own reader (tensorboard.backend.event_processing) finds the event file under
# output_path/job_name and reads every step's scalars at DeepSpeed's x (samples seen), with the
# losses of the metrics JSONL; the CSV files have DeepSpeed's layout and the same values; wandb
# loads with the "not available in C++" warning. Skipped (exit 77) without the tensorboard
# package.
set -euo pipefail
train=$1
src=$2
if ! python3 -c 'import tensorboard' 2> /dev/null; then
  echo "SKIP: the tensorboard package is not installed (pip install tensorboard)"
  exit 77
fi
source "$src/tests/e2e/lib/check.sh"
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
port=$((38500 + RANDOM % 2000))

cat > "$out/monitors.json" << JSON
{"tensorboard": {"enabled": true, "output_path": "$out/tb", "job_name": "zero_run"},
 "csv_monitor": {"enabled": true, "output_path": "$out/csv", "job_name": "zero_run"},
 "wandb": {"enabled": true, "project": "p"}}
JSON
python3 - "$src/configs/zero2.yaml" "$out/monitors.json" "$out/run.yaml" << 'PY'
import json, sys
base = open(sys.argv[1]).read()
extra = json.load(open(sys.argv[2]))
with open(sys.argv[3], "w") as f:  # YAML is a superset of JSON: append the monitor keys
    f.write(base + "\n" + "\n".join(f"{k}: {json.dumps(v)}" for k, v in extra.items()) + "\n")
PY
torchrun --no-python --standalone --nproc-per-node 2 --master-port "$port" "$train" \
  --config "$out/run.yaml" --set trainer.model=tiny --set trainer.steps=12 \
  --set scheduler.params.total_num_steps=12 --set steps_per_print=5 \
  --set "trainer.metrics_file=$out/metrics.jsonl" > "$out/train.log" 2>&1 ||
  { cat "$out/train.log"; exit 1; }
grep "monitors:\|wandb" "$out/train.log" | head -4
check "wandb warns that it is not available in C++" \
  grep -q "wandb is not available in C++; use tensorboard" "$out/train.log"
check "the start-up line names the event file" grep -q "monitors: tensorboard $out/tb/zero_run/events.out.tfevents" "$out/train.log"

check "TensorBoard's reader reads every step at DeepSpeed's samples axis" python3 - "$out" << 'PY'
import csv, glob, json, sys
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
out = sys.argv[1]
metrics = [json.loads(l) for l in open(f"{out}/metrics.jsonl")]
batch = 16  # zero2.yaml: micro 8 x 2 ranks
acc = EventAccumulator(f"{out}/tb/zero_run")
acc.Reload()
tags = acc.Tags()["scalars"]
need = ["Train/Samples/train_loss", "Train/Samples/lr", "Train/Samples/loss_scale",
        "Train/Samples/grad_norm", "Train/Samples/tokens_per_s", "Train/Samples/memory_bytes",
        "Train/Samples/elapsed_time_ms_forward", "Train/Samples/elapsed_time_ms_backward",
        "Train/Samples/elapsed_time_ms_step"]
missing = [t for t in need if t not in tags]
loss = acc.Scalars("Train/Samples/train_loss")
steps = [e.step for e in loss]
ok = not missing and steps == [batch * m["step"] for m in metrics] and len(steps) == 12
ok &= all(abs(e.value - m["loss"]) <= 1e-5 * max(1, abs(m["loss"])) for e, m in zip(loss, metrics))
lr = [e.value for e in acc.Scalars("Train/Samples/lr")]
ok &= all(abs(a - m["lr"]) <= 1e-6 * m["lr"] + 1e-12 for a, m in zip(lr, metrics))
rows = list(csv.reader(open(f"{out}/csv/zero_run/Train_Samples_train_loss.csv")))
ok &= rows[0] == ["step", "train_loss"] and len(rows) == 13
ok &= all(int(r[0]) == batch * m["step"] and abs(float(r[1]) - m["loss"]) < 1e-6
          for r, m in zip(rows[1:], metrics))
print(f"{len(tags)} scalar tags, missing {missing}; steps {steps[:3]}...; "
      f"losses {[round(e.value, 4) for e in loss[:3]]}...; csv rows {len(rows)}")
sys.exit(0 if ok else 1)
PY
summary
