#!/usr/bin/env bash
# The keys of public DeepSpeed configs that zero-train used to refuse (issue 36), in one HF-shaped
# JSON (tests/data/ds_corpus/hf_zero2_compile_autocast.json), unchanged, on 2 ranks:
#  - a top-level compile block: a warning that it has no effect on a C++ model;
#  - scheduler.params.total_num_steps "auto": filled with trainer.steps, said at start-up, and the
#    lr of every step is DeepSpeed's WarmupDecayLR with that horizon (its formula, below);
#  - fp16.auto_cast: true: said at start-up (token ids are integers: nothing to cast);
#  - the batch sizes "auto": resolved and said.
set -uo pipefail
train=$1
src=$2
source "$(dirname "${BASH_SOURCE[0]}")/lib/check.sh"
use_scratch
export OMP_NUM_THREADS=1
file=$src/tests/data/ds_corpus/hf_zero2_compile_autocast.json
steps=6
port=$(free_port 28000)
for r in 0 1; do
  env RANK=$r LOCAL_RANK=$r WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
    "$train" --config "$file" --set trainer.model=tiny --set trainer.seq_len=32 \
    --set trainer.steps=$steps --set steps_per_print=1 --set trainer.device=cpu \
    --set "trainer.metrics_file=$out/m.jsonl" --summary-json "$out/s.json" \
    > "$out/r$r.out" 2> "$out/r$r.err" &
  pids+=($!)
done
rcs=()
for pid in "${pids[@]}"; do wait "$pid"; rcs+=($?); done
check "both ranks train $steps steps and exit 0" test "${rcs[*]}" = "0 0"
[ "${rcs[*]}" = "0 0" ] || { cat "$out/r0.err" "$out/r0.out" | tail -30; }
err=$out/r0.err
check "compile: one warning that it has no effect" \
  test "$(grep -c "'compile' has no effect here and is ignored: it configures torch.compile" "$err")" -eq 1
check "total_num_steps: filled with trainer.steps and said" \
  grep -q "'scheduler.params.total_num_steps' is \"auto\": using $steps (trainer.steps, the run's optimizer steps" "$err"
check "fp16.auto_cast: said what it casts" \
  grep -q "'fp16.auto_cast': floating-point inputs .* integer inputs (token ids) stay as they are" "$err"
check "batch sizes: the auto resolution is said" \
  grep -q "\"auto\" resolved for 2 ranks: train_batch_size 2, train_micro_batch_size_per_gpu 1, gradient_accumulation_steps 1" "$err"
check "the start-up line says fp16" grep -q "fp16" "$out/r0.out"
check "rank 1 prints no warnings (rank 0 speaks for all)" test ! -s "$out/r1.err"
grep "warning" "$err" | cut -c1-200 | sed 's/^/    /'

# DeepSpeed 0.19's WarmupDecayLR (lr_schedules.py), written out: its engine steps the scheduler
# after each optimizer step, so after step s the next step's lr is get_lr() at
# last_batch_iteration s - 1, min + (max - min) * gamma(s - 1): what the metrics record at step s.
check "the lr of every step is WarmupDecayLR with total_num_steps $steps" python3 - "$out/m.jsonl" $steps <<'PY'
import json, math, sys
recs = [json.loads(l) for l in open(sys.argv[1])]
total, warm, lo, hi = int(sys.argv[2]), 2, 0.0, 1e-3
def gamma(k):
    if k < warm:
        return math.log(k + 1) / math.log(warm)
    return max(0.0, (total - k) / max(1.0, total - warm))
want = [lo + (hi - lo) * gamma(s - 1) for s in range(1, total + 1)]
got = [r["lr"] for r in recs]
print("    lr:", ["%.3e" % g for g in got], "want", ["%.3e" % w for w in want])
ok = len(got) == total and all(abs(g - w) <= 1e-9 + 1e-5 * w for g, w in zip(got, want))
ok &= all(math.isfinite(r["loss"]) for r in recs)
sys.exit(0 if ok else 1)
PY
summary
