#!/usr/bin/env bash
# Hugging Face interop against transformers itself: a tiny random LlamaForCausalLM saved by
# transformers (sharded safetensors + index) loads into zero with logits equal to transformers'
# (bit for bit, fp32); 2 ranks fine-tune it with ZeRO-2 from those weights; zero-consolidate
# --format hf exports the result, transformers loads the export and its logits equal zero's for
# the trained checkpoint. Configs the GPT cannot express, missing tensors and wrong shapes fail
# with the key or tensor named. Skipped (exit 77) when the transformers package is absent.
set -euo pipefail
source "$2/tests/e2e/lib/hf.sh" "$@"  # train, src, logits, ..., out; skips without transformers
port=$((33500 + RANDOM % 2000))

hf_helper make "$out/base" "$out/tokens.txt"
ls "$out/base"
check "transformers saved sharded safetensors with an index" \
  test -f "$out/base/model.safetensors.index.json"

"$logits" --model "hf:$out/base" --tokens "$out/tokens.txt" --out "$out/zero_base.safetensors"
# Bit for bit: the GPT computes RoPE, RMSNorm and attention op for op as transformers' Llama
# does (fp32), so loaded weights give the very same logits, not merely close ones.
check "loaded weights: zero's logits equal transformers' bit for bit" \
  hf_helper compare "$out/base" "$out/tokens.txt" "$out/zero_base.safetensors" 0

hf_train_export 6
ls "$out/export"
check "the export is sharded with an index" test -f "$out/export/model.safetensors.index.json"
check "training changed the model" \
  hf_helper differ "$out/zero_base.safetensors" "$out/zero_trained.safetensors" 1e-3
check "exported weights: transformers' logits equal zero's of the trained checkpoint" \
  hf_helper compare "$out/export" "$out/tokens.txt" "$out/zero_trained.safetensors"

# Bad input: each must fail and name what is wrong.
fails_naming() {
  local want=$1 dir=$2
  local msg
  if msg=$("$logits" --model "hf:$dir" --tokens "$out/tokens.txt" --out "$out/x.safetensors" 2>&1); then
    echo "unexpected success"
    return 1
  fi
  grep -qF -- "$want" <<< "$msg" || { echo "error does not name '$want': $msg"; return 1; }
}
bad() {  # bad NAME HELPER-ARGS...: a copy of the base model, edited by the helper
  local name=$1
  shift
  cp -r "$out/base" "$out/$name"
  hf_helper "$@" "$out/$name"
}
bad arch set-key model_type '"gpt_neox"'
check "another architecture names model_type" fails_naming "model_type" "$out/arch"
bad bias set-key mlp_bias true
check "MLP biases name mlp_bias" fails_naming "mlp_bias" "$out/bias"
# attention_bias is expressible now (hf_variants.sh): the files then lack the bias tensors.
bad attn_bias set-key attention_bias true
check "attention_bias without bias tensors names the missing tensor" \
  fails_naming "missing tensor 'model.layers.0.self_attn.q_proj.bias'" "$out/attn_bias"
bad ffn set-key intermediate_size 128
check "a shape mismatch names the tensor" \
  fails_naming "tensor 'model.layers.0.mlp.gate_proj.weight' has shape" "$out/ffn"
bad missing drop-tensor model.layers.1.mlp.up_proj.weight
check "a missing tensor is named" \
  fails_naming "missing tensor 'model.layers.1.mlp.up_proj.weight'" "$out/missing"
summary
