# Sourced by the Hugging Face e2e scripts (after check.sh, with train, src, out, port, logits and
# consolidate set): `hf_train_export STEPS` fine-tunes $out/base on 2 ranks with ZeRO-2 for STEPS
# steps, exports the checkpoint with --format hf into $out/export and writes zero's logits of the
# trained checkpoint to $out/zero_trained.safetensors.
hf_train_export() {
  local steps=$1
  torchrun --no-python --standalone --nproc-per-node 2 --master-port "$port" "$train" \
    --config "$src/configs/zero2.yaml" --set "trainer.init_from=hf:$out/base" \
    --set trainer.steps="$steps" --set trainer.seq_len=48 \
    --set scheduler.params.total_num_steps="$steps" --set scheduler.params.warmup_num_steps=1 \
    --set "trainer.save_dir=$out/ckpt" --set trainer.save_interval="$steps" \
    > "$out/train.log" 2>&1 || { cat "$out/train.log"; return 1; }
  tail -n 2 "$out/train.log"
  "$consolidate" --checkpoint "$out/ckpt" --format hf --model "hf:$out/base" --out "$out/export" \
    --max-shard-size 100KB
  "$logits" --model "hf:$out/base" --checkpoint "$out/ckpt" --tokens "$out/tokens.txt" \
    --out "$out/zero_trained.safetensors"
}
