#!/usr/bin/env bash
# A public DeepSpeed ZeRO-3 JSON trains unchanged through zero-train, on an HF LLaMA: Hugging
# Face's documented stage-3 config (tests/data/ds_corpus/hf_zero3_auto.json: "stage": 3, every
# stage3_* key, "auto" values, offload devices "none") on a tiny random LlamaForCausalLM saved by
# transformers (trainer.init_from hf:), 2 ranks, fp32 ("bf16": "auto" is false on the CPU). The
# only --set keys are zero-train's own (model, steps, sequence length, printing). Against the
# same file at stage 2: per-step losses, final loss, parameter norm and checksum within 1e-6
# relative, with the blocks sharded at stage 3 (the memory report's parameter bytes per rank
# drop to the root unit's: "auto" persistence threshold 10 x hidden keeps only the norms whole).
# Skipped (exit 77) without transformers.
set -euo pipefail
source "$2/tests/e2e/lib/hf.sh" "$@"  # train, src, ..., out; skips without transformers
port=$(free_port 18000)
file=$src/tests/data/ds_corpus/hf_zero3_auto.json

hf_helper make "$out/base" "$out/tokens.txt"
run() {  # run NAME SETS...
  local name=$1
  shift
  port=$((port + 1))
  torchrun --no-python --standalone --nproc-per-node 2 --master-port $port "$train" \
    --config "$file" --set "trainer.init_from=hf:$out/base" --set trainer.steps=4 \
    --set trainer.seq_len=32 --set steps_per_print=1 "$@" --summary-json "$out/$name.json" \
    > "$out/$name.log" 2>&1 || { tail -n 20 "$out/$name.log"; return 1; }
}
check "the DeepSpeed stage-3 JSON trains unchanged (stage 3, HF LLaMA, 2 ranks)" run s3
check "the same JSON at stage 2" run s2 --set zero_optimization.stage=2
check "the stage3_* keys take effect at stage 3 (no warning), dropped with one at stage 2" bash -c "
  ! grep -q \"'zero_optimization.stage3_prefetch_bucket_size' \\(is accepted\\|has no effect\\)\" \
    '$out/s3.log' &&
  grep -q \"'zero_optimization.stage3_prefetch_bucket_size' has no effect here\" '$out/s2.log'"
check "stage 3 equals stage 2 (fp32, 1e-6 relative), blocks sharded" python3 - "$out" <<'PY'
import json, re, sys
out = sys.argv[1]
s2 = json.load(open(f"{out}/s2.json"))
s3 = json.load(open(f"{out}/s3.json"))
assert (s2["stage"], s3["stage"], s3["world_size"], s3["bf16"]) == (2, 3, 2, False), s3
ok = True
for k in ("first_loss", "final_loss", "param_norm", "param_checksum"):
    rel = abs(s3[k] - s2[k]) / max(abs(s2[k]), 1e-12)
    print(f"    {k}: stage 2 {s2[k]!r}, stage 3 {s3[k]!r}, rel diff {rel:.1e}")
    ok &= rel < 1e-6
pat = r"step +\d+/\d+ +loss ([-0-9.e+]+)"
l2 = re.findall(pat, open(f"{out}/s2.log").read())
l3 = re.findall(pat, open(f"{out}/s3.log").read())
assert len(l2) == 4 and len(l3) == 4, (l2, l3)
ok &= all(abs(float(a) - float(b)) <= 1e-6 * abs(float(a)) for a, b in zip(l2, l3))
p2 = [m["measured"]["params"] for m in s2["memory"]]
p3 = [m["measured"]["params"] for m in s3["memory"]]
print(f"    parameter bytes per rank: stage 2 {p2}, stage 3 {p3}")
ok &= all(b < a / 2 for a, b in zip(p2, p3))
sys.exit(0 if ok else 1)
PY
summary
