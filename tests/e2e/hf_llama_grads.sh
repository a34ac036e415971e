#!/usr/bin/env bash
# The example GPT's arithmetic against transformers' LlamaForCausalLM, backward included: one
# forward/backward on the same weights and tokens (bench/ds_parity.py --grads), fp32 and bf16,
# logits and every gradient element equal bit for bit. DeepSpeed parity (bench/ds_parity.py,
# not run in CI) rests on it: a reordering that changes how autograd sums a gradient (3a1350a
# passed q, k, v as call arguments, evaluated right to left) moved the llama bf16 rows 3.4e-3
# from DeepSpeed. Skipped (exit 77) without the transformers package.
set -euo pipefail
source "$2/tests/e2e/lib/hf.sh" "$@"  # train, src, out; skips without transformers
parity_bin=$bin/../bench/ds-parity-zero
test -x "$parity_bin" || { echo "FAIL: $parity_bin is not built"; exit 1; }
python3 "$src/bench/ds_parity.py" --grads --zero-bin "$parity_bin" --out "$out" 2> /dev/null \
  | tee "$out/grads.txt"
for dtype in fp32 bf16; do
  check "$dtype: logits equal transformers' bit for bit" \
    grep -q "^$dtype: logits max abs diff 0.0e+00;" "$out/grads.txt"
  check "$dtype: every gradient element equals transformers'" \
    grep -q "^$dtype: .* 0 of [0-9]* elements differ" "$out/grads.txt"
done
summary
