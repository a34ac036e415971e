#!/usr/bin/env bash
# Hugging Face interop with tied word embeddings (tie_word_embeddings: true, lm_head shares the
# embedding and is absent from the files): a tiny random tied LlamaForCausalLM from transformers
# loads into zero with equal logits (<= 1e-4, fp32); 2 ranks train it with ZeRO-2; the
# --format hf export keeps the tie (config key set, no lm_head tensor) and transformers' logits
# of the export equal zero's of the trained checkpoint. Skipped (exit 77) without transformers.
set -euo pipefail
source "$2/tests/e2e/lib/hf.sh" "$@"  # train, src, logits, ..., out; skips without transformers
port=$((39500 + RANDOM % 2000))

hf_helper make "$out/base" "$out/tokens.txt" tied
check "transformers saved no lm_head for the tied model" \
  bash -c "! grep -q lm_head '$out/base/model.safetensors.index.json'"

"$logits" --model "hf:$out/base" --tokens "$out/tokens.txt" --out "$out/zero_base.safetensors"
check "loaded tied weights: zero's logits equal transformers'" \
  hf_helper compare "$out/base" "$out/tokens.txt" "$out/zero_base.safetensors"

hf_train_export 4
check "the export says tie_word_embeddings: true" \
  grep -q '"tie_word_embeddings": *true' "$out/export/config.json"
check "the export holds no lm_head tensor" \
  bash -c "! grep -q lm_head '$out/export/model.safetensors.index.json'"
check "training changed the model" \
  hf_helper differ "$out/zero_base.safetensors" "$out/zero_trained.safetensors" 1e-3
check "exported tied weights: transformers' logits equal zero's of the trained checkpoint" \
  hf_helper compare "$out/export" "$out/tokens.txt" "$out/zero_trained.safetensors"
summary
