#!/usr/bin/env bash
# A short CPU run of zero-train on 2 ranks: the loss falls clearly below its start on the
# synthetic corpus and on a text file (this repository's README as bytes), and the metrics
# JSONL has one well-formed record per step.
set -euo pipefail
train=$1
src=$2
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
port=$((31500 + RANDOM % 2000))
run() {
  local name=$1
  shift
  torchrun --no-python --standalone --nproc-per-node 2 --master-port $((port++)) "$train" \
    --config "$src/configs/zero2.yaml" --set steps_per_print=20 \
    --set "trainer.metrics_file=$out/$name.jsonl" --summary-json "$out/$name.json" "$@" \
    > "$out/$name.log" 2>&1 || { cat "$out/$name.log"; exit 1; }
}
run synthetic --set trainer.steps=60 --set scheduler.params.total_num_steps=60
run text --set trainer.steps=40 --set scheduler.params.total_num_steps=40 \
  --set "trainer.data=text:$src/README.md" --set trainer.seq_len=64

python3 - "$out" <<'PY'
import json, sys
out = sys.argv[1]
ok = True
for name, steps, ratio in (("synthetic", 60, 0.5), ("text", 40, 0.75)):
    s = json.load(open(f"{out}/{name}.json"))
    recs = [json.loads(l) for l in open(f"{out}/{name}.jsonl")]
    good = (s["final_loss"] < ratio * s["first_loss"] and len(recs) == steps
            and [r["step"] for r in recs] == list(range(1, steps + 1))
            and all(r["step_s"] > 0 and r["tokens_per_s"] > 0 for r in recs))
    print(f"{name}: loss {s['first_loss']:.3f} -> {s['final_loss']:.3f} (must be < {ratio} x start), "
          f"{len(recs)} metrics lines: {'ok' if good else 'FAIL'}")
    ok &= good
print("1 passed, 0 failed" if ok else "0 passed, 1 failed")
sys.exit(0 if ok else 1)
PY
