#!/usr/bin/env bash
# A tensor-parallel checkpoint loads under another tensor-parallel size, without a converter,
# through real processes: the tiny preset saved at step 3 by tp 2 (2 processes, each rank its
# blocks in save_dir/tp<r>) resumes as tp 1 (1 process reads both ranks' blocks), and one saved by
# tp 1 resumes as tp 2 (each rank reads its slice of the whole tensors); AdamW, so the optimizer
# states must be resharded too. Steps 4-6 of each resharded run must equal the uninterrupted run
# that saved the checkpoint within 1e-5 relative (the tolerance of tests/e2e/tensor_parallel.sh:
# tp 1 and tp 2 compute the same fp32 arithmetic in another order; a block read from the wrong
# place or optimizer states left at zero move the loss by 1e-3 or more at step 4). Then
# zero-consolidate puts a tp 2 save together into one safetensors file equal to the tp 1 save of
# the tp 1 run's at the same step, up to rounding.
set -euo pipefail
train=$1
src=$2
source "$src/tests/e2e/lib/check.sh"
source "$src/tests/e2e/lib/resume.sh"
use_scratch
consolidate=$(dirname "$train")/../tools/zero-consolidate
port=$((37500 + RANDOM % 2000))
common=(--config "$src/configs/zero2.yaml" --set trainer.model=tiny --set trainer.steps=6
        --set trainer.seq_len=32 --set train_batch_size=4 --set train_micro_batch_size_per_gpu=4
        --set steps_per_print=1 --set gradient_clipping=0 --set scheduler.params.total_num_steps=6
        --set scheduler.params.warmup_num_steps=2 --set optimizer.type=AdamW)
tp2=(--set tensor_parallel.autotp_size=2)
check "tp 2 trains 6 steps, saving at step 3" launch tp2 2 "${tp2[@]}" \
  --set "trainer.save_dir=$out/a" --set trainer.save_interval=3
check "tp 1 trains 6 steps, saving at step 3" launch tp1 1 --set "trainer.save_dir=$out/b" \
  --set trainer.save_interval=3
check "tp 2 wrote its blocks per rank" test -f "$out/a/tp1/step3/manifest.json"
check "the tp 2 manifest records tp 1's block of a split weight" \
  grep -q '"global_shape": \[[0-9]*, [0-9]*\], "offset": \[[0-9]*, [1-9]' "$out/a/tp1/step3/manifest.json"
cp -r "$out/a" "$out/a_for_tp1"
cp -r "$out/b" "$out/b_for_tp2"
check "tp 2's step-3 save resumes as tp 1" launch tp2_to_tp1 1 \
  --set "trainer.save_dir=$out/a_for_tp1" --set trainer.resume=step3
check "tp 1's step-3 save resumes as tp 2" launch tp1_to_tp2 2 "${tp2[@]}" \
  --set "trainer.save_dir=$out/b_for_tp2" --set trainer.resume=step3
check "the logs say the saves were resharded" grep -q "resharded the save of autotp_size 2 to autotp_size 1" "$out/tp2_to_tp1.log"
check "... both ways" grep -q "resharded the save of autotp_size 1 to autotp_size 2" "$out/tp1_to_tp2.log"
check "tp 2 -> tp 1: the losses of the uninterrupted tp 2 run" \
  compare_losses tp2 tp2_to_tp1 1e-5 4 6
check "tp 1 -> tp 2: the losses of the uninterrupted tp 1 run" \
  compare_losses tp1 tp1_to_tp2 1e-5 4 6

# Consolidation: zero-consolidate finds save_dir/tp0, tp1 and puts the blocks together.
consolidated_equal() {
  "$consolidate" --checkpoint "$out/a" --tag step3 --out "$out/tp2.safetensors" > "$out/c.log" &&
    "$consolidate" --checkpoint "$out/a" --tag step3 --state exp_avg_sq \
      --out "$out/tp2_v.safetensors" >> "$out/c.log" &&
    grep -q "2 tensor-parallel ranks' saves" "$out/c.log" &&
    python3 - "$out" <<'PY'
import sys, torch
from safetensors.torch import load_file
out = sys.argv[1]
tp2 = load_file(f"{out}/tp2.safetensors")
v = load_file(f"{out}/tp2_v.safetensors")
# The blocks put together: the embedding whole (vocab-split), a row-parallel weight whole.
emb = tp2["embed.weight"]
assert emb.dim() == 2 and emb.shape[0] > emb.shape[1], emb.shape
assert tp2["blocks.0.wo.weight"].shape == (emb.shape[1], emb.shape[1])
assert set(v) == set(tp2), "exp_avg_sq consolidates with the same names"
assert all(float(t.min()) >= 0 for t in v.values()), "exp_avg_sq is a square"
print(len(tp2), "tensors, embed", tuple(emb.shape))
PY
}
check "zero-consolidate puts tp 2's blocks together (master and exp_avg_sq)" consolidated_equal
# The tp 2 run's step-3 weights, consolidated, against the tp 1 run's of the same start, steps
# and batches: the same names and shapes, the values equal up to the arithmetic order.
shapes_equal() {
  "$consolidate" --checkpoint "$out/b" --tag step3 --out "$out/tp1.safetensors" > /dev/null &&
    same_weights tp1 tp2 1e-5
}
check "tp 2's consolidated step 3 has tp 1's shapes and values" shapes_equal
summary
