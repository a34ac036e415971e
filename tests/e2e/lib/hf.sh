# Sourced by the Hugging Face e2e scripts with their arguments (TRAIN_BINARY SOURCE_DIR): sets
# train, src, logits, consolidate, helper and a temporary $out (removed on exit), sources
# check.sh, defines hf_helper (below: the helper's commands, run in one Python process), and
# skips the test (exit 77) when the transformers package is absent.
# `hf_train_export STEPS [NAME]` (needs $port too) fine-tunes $out/NAME (default base) on 2 ranks
# with ZeRO-2 for STEPS steps, exports the checkpoint with --format hf into $out/export (NAME
# given: $out/NAME.export) and writes zero's logits of the trained checkpoint to
# $out/zero_trained.safetensors (NAME given: $out/NAME.trained.safetensors).
train=$1
src=$2
bin=$(dirname "$train")
logits=$bin/zero-logits
consolidate=$bin/../tools/zero-consolidate
helper=$src/tests/e2e/hf_llama.py
# find_spec looks the package up without importing it (an import costs a second or more, once per
# test; the helper's first command imports it anyway).
if ! python3 -c 'import importlib.util, sys; sys.exit(importlib.util.find_spec("transformers") is None)'; then
  echo "SKIP: the transformers package is not installed (pip install transformers)"
  exit 77
fi
source "$src/tests/e2e/lib/check.sh"
out=$(mktemp -d)
trap '[ -n "${hf_server:-}" ] && kill "$hf_server" 2> /dev/null; rm -rf "$out"' EXIT

# `hf_helper CMD ARGS...` does what `python3 $helper CMD ARGS...` does, in one Python process per
# test (`hf_llama.py serve`, started by the first call): a fresh process paid ~6 s of CPU
# importing torch and transformers' model classes, 3 to 5 times per test. One call per line,
# arguments tab-separated; the answer is the command's exit code. Every wait is bounded: a server
# that has exited, or takes over 600 s, fails the call.
hf_helper() {
  if [ -z "${hf_server:-}" ]; then
    mkfifo "$out/.hf_calls" "$out/.hf_codes"
    # Started before this shell opens the FIFOs, so the server holds no write end of its own
    # input and sees it end when this shell exits.
    python3 "$helper" serve "$out/.hf_calls" "$out/.hf_codes" &
    hf_server=$!
    exec {hf_calls}<> "$out/.hf_calls" {hf_codes}<> "$out/.hf_codes"
  fi
  local IFS=$'\t' code waited=0
  printf '%s\n' "$*" >&"$hf_calls"
  until read -r -t 1 -u "$hf_codes" code; do
    if ! kill -0 "$hf_server" 2> /dev/null || ((++waited >= 600)); then
      echo "hf_llama.py serve: no answer to '$1' (the server exited, or took over 600 s)"
      return 1
    fi
  done
  return "$code"
}

hf_train_export() {
  local steps=$1 name=${2:-base} export_dir=$out/export trained_logits=$out/zero_trained.safetensors
  if [ $# -gt 1 ]; then
    export_dir=$out/$name.export
    trained_logits=$out/$name.trained.safetensors
  fi
  rm -rf "$out/ckpt"
  torchrun --no-python --standalone --nproc-per-node 2 --master-port "$port" "$train" \
    --config "$src/configs/zero2.yaml" --set "trainer.init_from=hf:$out/$name" \
    --set trainer.steps="$steps" --set trainer.seq_len=48 \
    --set scheduler.params.total_num_steps="$steps" --set scheduler.params.warmup_num_steps=1 \
    --set "trainer.save_dir=$out/ckpt" --set trainer.save_interval="$steps" \
    > "$out/train.log" 2>&1 || { cat "$out/train.log"; return 1; }
  tail -n 2 "$out/train.log"
  "$consolidate" --checkpoint "$out/ckpt" --format hf --model "hf:$out/$name" --out "$export_dir" \
    --max-shard-size 100KB
  "$logits" --model "hf:$out/$name" --checkpoint "$out/ckpt" --tokens "$out/tokens.txt" \
    --out "$trained_logits"
}
