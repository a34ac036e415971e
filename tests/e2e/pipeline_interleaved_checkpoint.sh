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
# Last, the 3D layout: P = 2 x v = 2 x T = 2 with sequence parallelism (4 processes) saves at step
# 3 into save_dir/stage<s>/tp<r>/; resumed under 1F1B at P = 2 x T = 1, steps 4-6 give its losses
# within 1e-6.
set -euo pipefail
train=$1
src=$2
source "$src/tests/e2e/lib/check.sh"
source "$src/tests/e2e/lib/resume.sh"
use_scratch
port=$(free_port 16000)
common=(--config "$src/configs/zero2.yaml" --set trainer.model=tiny --set trainer.seq_len=32
        --set train_batch_size=8 --set train_micro_batch_size_per_gpu=2 --set steps_per_print=1
        --set zero_optimization.stage=1 --set gradient_clipping=0.05 --set optimizer.type=AdamW
        --set gradient_accumulation_steps=4 --set scheduler.params.total_num_steps=6
        --set scheduler.params.warmup_num_steps=2)
interleaved=(--set pipeline.stages=2 --set pipeline.schedule=interleaved
             --set pipeline.virtual_stages=2)
check "P = 2 x v = 2 trains 6 steps, saving at step 3" launch full 2 "${interleaved[@]}" \
  --set trainer.steps=6 --set "trainer.save_dir=$out/a" --set trainer.save_interval=3
check "each stage recorded its chunks" \
  grep -q '"virtual_stages": 2' "$out/a/stage1/step3/pipeline.json"
check "... and each stage saved its own shards" \
  test -f "$out/a/stage0/step3/shard_rank0_of_1.bin" -a -f "$out/a/stage1/step3/shard_rank0_of_1.bin"
for d in b c d; do cp -r "$out/a" "$out/$d"; done
check "the save resumes at P = 2 x v = 2 (steps 4-6)" launch same 2 "${interleaved[@]}" \
  --set trainer.steps=6 --set "trainer.save_dir=$out/b" --set trainer.resume=step3
check "... with the uninterrupted run's losses exactly" compare_losses full same 0 4 6
check "the save resumes under 1F1B at P = 2 (steps 4-6)" launch p2 2 --set pipeline.stages=2 \
  --set trainer.steps=6 --set "trainer.save_dir=$out/c" --set trainer.resume=step3
check "... the log says it resharded" grep -q \
  "resharded the save of pipeline.stages 2 x pipeline.virtual_stages 2 (bounds 0,1,2,3,4) to pipeline.stages 2$" \
  "$out/p2.log"
check "... with the uninterrupted run's losses" compare_losses full p2 1e-6 4 6
check "the save resumes at P = 1 (steps 4-6)" launch p1 1 --set trainer.steps=6 \
  --set "trainer.save_dir=$out/d" --set trainer.resume=step3
check "... with the uninterrupted run's losses" compare_losses full p1 1e-6 4 6

check "1F1B at P = 2 trains 6 steps, saving at step 3" launch f1b 2 --set pipeline.stages=2 \
  --set trainer.steps=6 --set "trainer.save_dir=$out/e" --set trainer.save_interval=3
check "the 1F1B save resumes interleaved (steps 4-6)" launch f1b_i 2 "${interleaved[@]}" \
  --set trainer.steps=6 --set "trainer.save_dir=$out/e" --set trainer.resume=step3
check "... the log says it resharded" grep -q \
  "to pipeline.stages 2 x pipeline.virtual_stages 2$" "$out/f1b_i.log"
check "... with the uninterrupted 1F1B run's losses" compare_losses f1b f1b_i 1e-6 4 6

consolidate=$(dirname "$train")/../tools/zero-consolidate
consolidated_equal() {
  "$consolidate" --checkpoint "$out/a" --tag step3 --out "$out/i.safetensors" > "$out/ci.log" &&
    grep -q "a pipelined save of 2 stages .*parameters under the example GPT's names" \
      "$out/ci.log" &&
    "$consolidate" --checkpoint "$out/e" --tag step3 --out "$out/f.safetensors" > /dev/null &&
    same_weights f i 1e-5
}
check "zero-consolidate puts the interleaved save together as the 1F1B run's weights" \
  consolidated_equal
check "zero-consolidate --format hf exports the interleaved save" \
  "$consolidate" --checkpoint "$out/a" --tag step3 --format hf --model tiny --out "$out/hf"
check "... as a LlamaForCausalLM directory" test -f "$out/hf/config.json"

check "P = 2 x v = 2 x T = 2 with sequence parallelism trains 6 steps, saving at step 3" \
  launch tp 4 "${interleaved[@]}" --set tensor_parallel.autotp_size=2 \
  --set tensor_parallel.sequence_parallel=true --set trainer.steps=6 \
  --set "trainer.save_dir=$out/t" --set trainer.save_interval=3
check "... each stage's tensor-parallel ranks saved apart" \
  test -f "$out/t/stage1/tp1/step3/pipeline.json" -a -f "$out/t/stage0/tp0/step3/manifest.json"
check "the interleaved P2 x T2 save resumes under 1F1B at P = 2 x T = 1 (steps 4-6)" \
  launch tp_p2 2 --set pipeline.stages=2 --set trainer.steps=6 --set "trainer.save_dir=$out/t" \
  --set trainer.resume=step3
check "... with the uninterrupted run's losses" compare_losses tp tp_p2 1e-6 4 6
summary
