#!/usr/bin/env bash
# Checkpoints under the interleaved schedule (issue 34), through real processes (torchrun,
# gloo): the tiny preset (4 layers, one per chunk) at P = 2 x v = 2 trains 6 steps, saving at
# step 3 (save_dir/stage<s>/, each stage's 2 chunks in its one engine's shards, pipeline.json
# recording virtual_stages 2 and the 4 chunks' bounds). Its step-3 save resumed at the same
# layout gives the uninterrupted run's losses for steps 4-6 as printed (7 significant digits,
# no difference allowed); resumed under 1F1B at P = 2 and at P = 1 within 1e-6 relative (the same
# arithmetic, the norm summed over other stages; a chunk read from the wrong stage or AdamW
# states left at zero move the loss by 1e-3 or more). A 1F1B P = 2 save resumed interleaved
# likewise. zero-consolidate puts the interleaved save together under the example GPT's names,
# equal to the 1F1B run's step-3 save within 1e-5, and exports it as Hugging Face LLaMA.
set -euo pipefail
train=$1
src=$2
source "$src/tests/e2e/lib/check.sh"
use_scratch
port=$(free_port 16000)
common=(--config "$src/configs/zero2.yaml" --set trainer.model=tiny --set trainer.seq_len=32
        --set train_batch_size=8 --set train_micro_batch_size_per_gpu=2 --set steps_per_print=1
        --set zero_optimization.stage=1 --set gradient_clipping=0.05 --set optimizer.type=AdamW
        --set gradient_accumulation_steps=4 --set scheduler.params.total_num_steps=6
        --set scheduler.params.warmup_num_steps=2)
interleaved=(--set pipeline.stages=2 --set pipeline.schedule=interleaved
             --set pipeline.virtual_stages=2)
# launch NAME PROCESSES ARGS...: zero-train on that many processes (1: no torchrun)
launch() {
  local name=$1 n=$2
  shift 2
  if [ "$n" = 1 ]; then
    timeout 300 "$train" "${common[@]}" --set "trainer.metrics_file=$out/$name.jsonl" "$@" \
      > "$out/$name.log" 2>&1
  else
    timeout 300 torchrun --no-python --standalone --nproc-per-node "$n" \
      --master-port $((port++)) "$train" "${common[@]}" \
      --set "trainer.metrics_file=$out/$name.jsonl" "$@" > "$out/$name.log" 2>&1
  fi || { cat "$out/$name.log"; return 1; }
}
# compare FULL RESUMED TOLERANCE: steps 4-6 of RESUMED against FULL's, as logged
compare() {
  python3 - "$out" "$@" <<'PY'
import json, sys
out, full, res, tol = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
a = {json.loads(l)["step"]: json.loads(l)["loss"] for l in open(f"{out}/{full}.jsonl")}
b = {json.loads(l)["step"]: json.loads(l)["loss"] for l in open(f"{out}/{res}.jsonl")}
assert sorted(b) == [4, 5, 6], sorted(b)
worst = 0.0
for s in sorted(b):
    rel = abs(a[s] - b[s]) / abs(a[s])
    worst = max(worst, rel)
    print(f"step {s}: {full} {a[s]:.7f}  {res} {b[s]:.7f}  rel diff {rel:.1e}")
print(f"max rel diff {worst:.1e} (tolerance {tol:g})")
sys.exit(0 if worst <= tol else 1)
PY
}

check "P = 2 x v = 2 trains 6 steps, saving at step 3" launch full 2 "${interleaved[@]}" \
  --set trainer.steps=6 --set "trainer.save_dir=$out/a" --set trainer.save_interval=3
check "each stage recorded its chunks" \
  grep -q '"virtual_stages": 2' "$out/a/stage1/step3/pipeline.json"
check "... and each stage saved its own shards" \
  test -f "$out/a/stage0/step3/shard_rank0_of_1.bin" -a -f "$out/a/stage1/step3/shard_rank0_of_1.bin"
for d in b c d; do cp -r "$out/a" "$out/$d"; done
check "the save resumes at P = 2 x v = 2 (steps 4-6)" launch same 2 "${interleaved[@]}" \
  --set trainer.steps=6 --set "trainer.save_dir=$out/b" --set trainer.resume=step3
check "... with the uninterrupted run's losses exactly" compare full same 0
check "the save resumes under 1F1B at P = 2 (steps 4-6)" launch p2 2 --set pipeline.stages=2 \
  --set trainer.steps=6 --set "trainer.save_dir=$out/c" --set trainer.resume=step3
check "... the log says it resharded" grep -q \
  "resharded the save of pipeline.stages 2 x pipeline.virtual_stages 2 (bounds 0,1,2,3,4) to pipeline.stages 2$" \
  "$out/p2.log"
check "... with the uninterrupted run's losses" compare full p2 1e-6
check "the save resumes at P = 1 (steps 4-6)" launch p1 1 --set trainer.steps=6 \
  --set "trainer.save_dir=$out/d" --set trainer.resume=step3
check "... with the uninterrupted run's losses" compare full p1 1e-6

check "1F1B at P = 2 trains 6 steps, saving at step 3" launch f1b 2 --set pipeline.stages=2 \
  --set trainer.steps=6 --set "trainer.save_dir=$out/e" --set trainer.save_interval=3
check "the 1F1B save resumes interleaved (steps 4-6)" launch f1b_i 2 "${interleaved[@]}" \
  --set trainer.steps=6 --set "trainer.save_dir=$out/e" --set trainer.resume=step3
check "... the log says it resharded" grep -q \
  "to pipeline.stages 2 x pipeline.virtual_stages 2$" "$out/f1b_i.log"
check "... with the uninterrupted 1F1B run's losses" compare f1b f1b_i 1e-6

consolidate=$(dirname "$train")/../tools/zero-consolidate
consolidated_equal() {
  "$consolidate" --checkpoint "$out/a" --tag step3 --out "$out/i.safetensors" > "$out/ci.log" &&
    grep -q "a pipelined save of 2 stages .*parameters under the example GPT's names" \
      "$out/ci.log" &&
    "$consolidate" --checkpoint "$out/e" --tag step3 --out "$out/f.safetensors" > /dev/null &&
    python3 - "$out" <<'PY'
import sys
from safetensors.torch import load_file
out = sys.argv[1]
a, b = load_file(f"{out}/f.safetensors"), load_file(f"{out}/i.safetensors")
assert set(a) == set(b), sorted(set(a) ^ set(b))
worst = max(float((a[k] - b[k]).abs().max() / a[k].abs().max().clamp_min(1e-12)) for k in a)
print(f"{len(a)} tensors; interleaved vs 1F1B step-3 weights: max rel diff {worst:.1e} (tolerance 1e-5)")
sys.exit(0 if worst < 1e-5 else 1)
PY
}
check "zero-consolidate puts the interleaved save together as the 1F1B run's weights" \
  consolidated_equal
check "zero-consolidate --format hf exports the interleaved save" \
  "$consolidate" --checkpoint "$out/a" --tag step3 --format hf --model tiny --out "$out/hf"
check "... as a LlamaForCausalLM directory" test -f "$out/hf/config.json"
summary
