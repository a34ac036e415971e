#!/usr/bin/env bash
# trainer.data: megatron:PREFIX against megatron-core itself: its IndexedDatasetBuilder writes a
# dataset (uint16, then int32 ids), zero's reader returns every token of every document as
# megatron-core's IndexedDataset reads them, and 2 ranks training on megatron:PREFIX see the very
# tokens they see on the same stream as a plain bin: file (equal losses at every step, which
# covers the sampler, prefetch and a resume halfway). Skipped (exit 77) without megatron-core.
set -euo pipefail
train=$1
src=$2
bin=$(dirname "$train")
source "$src/tests/e2e/lib/check.sh"
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
port=$((37500 + RANDOM % 2000))

rc=0
python3 "$src/tests/e2e/megatron_data.py" "$out" uint16 int32 2> /dev/null || rc=$?
if [ $rc -eq 77 ]; then
  echo "SKIP: the megatron-core package is not installed (pip install --no-deps megatron-core)"
  exit 77
fi
[ $rc -eq 0 ] || { echo "FAIL: megatron_data.py exited with $rc"; exit 1; }
for dtype in uint16 int32; do
  check "zero reads every token megatron-core wrote ($dtype)" \
    env ZERO_MEGATRON_PREFIX="$out/$dtype/corpus" ZERO_MEGATRON_TOKENS="$out/$dtype/documents.txt" \
    "$bin/../tests/test_megatron_data" --gtest_filter='MegatronCore.*'
done

run() {  # run NAME DATA [--set ...]: 2 ranks, 8 steps, the losses to $out/NAME.jsonl
  local name=$1 data=$2
  shift 2
  torchrun --no-python --standalone --nproc-per-node 2 --master-port $((port++)) "$train" \
    --config "$src/configs/zero2.yaml" --set trainer.model=tiny --set trainer.seq_len=32 \
    --set trainer.steps=8 --set scheduler.params.total_num_steps=8 \
    --set scheduler.params.warmup_num_steps=1 --set "trainer.data=$data" \
    --set "trainer.metrics_file=$out/$name.jsonl" "$@" > "$out/$name.log" 2>&1 ||
    { cat "$out/$name.log"; return 1; }
}
same_losses() {
  python3 - "$@" << 'PY'
import json, sys
a, b = ([json.loads(l)["loss"] for l in open(p)] for p in sys.argv[1:3])
print(f"losses {a[:3]}... vs {b[:3]}...")
sys.exit(0 if a == b and len(a) == 8 else 1)
PY
}
run megatron "megatron:$out/int32/corpus"
grep -m1 "Megatron indexed dataset" "$out/megatron.log"
run flat "bin:$out/int32/flat.bin"
check "training on megatron: equals training on the same tokens as bin: (every step's loss)" \
  same_losses "$out/megatron.jsonl" "$out/flat.jsonl"
run half "megatron:$out/int32/corpus" --set trainer.steps=4 --set "trainer.save_dir=$out/ckpt" \
  --set trainer.save_interval=4
run resumed "megatron:$out/int32/corpus" --set "trainer.save_dir=$out/ckpt" \
  --set trainer.resume=auto
check "a run resumed at step 4 continues with the batches of the uninterrupted one" \
  python3 -c "
import json, sys
a = [json.loads(l) for l in open('$out/megatron.jsonl')]
b = [json.loads(l) for l in open('$out/resumed.jsonl')]
print([r['loss'] for r in a[4:]], [r['loss'] for r in b])
sys.exit(0 if [r['loss'] for r in a[4:]] == [r['loss'] for r in b] else 1)"
summary
