#!/usr/bin/env bash
# Hugging Face interop for the model shapes beyond plain LLaMA, against transformers itself:
# each RoPE type transformers ships for LLaMA (llama3 with a tied head as in Llama 3.2, linear,
# dynamic, yarn), LLaMA's attention_bias, and Qwen2 (q/k/v biases) untied and tied. For each:
# the model transformers saved loads into zero with logits equal to transformers' bit for bit
# (fp32); 2 ranks fine-tune it with ZeRO-2; zero-consolidate --format hf exports the result and
# transformers' logits of the export equal zero's of the trained checkpoint (<= 1e-4). A rope
# type the GPT cannot express (longrope) and Qwen2's sliding window fail naming the key.
# Skipped (exit 77) when the transformers package is absent.
set -euo pipefail
source "$2/tests/e2e/lib/hf.sh" "$@"  # train, src, logits, ..., out; skips without transformers
port=$((35500 + RANDOM % 2000))
variants=(llama32 linear dynamic yarn llama-bias qwen2 qwen2-tied)

python3 "$helper" make-variants "$out"
loaded=() trained=()
for v in "${variants[@]}"; do
  "$logits" --model "hf:$out/$v" --tokens "$out/tokens.txt" --out "$out/$v.zero.safetensors"
  loaded+=("$out/$v" "$out/$v.zero.safetensors")
done
check "loaded weights: zero's logits equal transformers' bit for bit (${variants[*]})" \
  python3 "$helper" compare-all "$out/tokens.txt" 0 "${loaded[@]}"

for v in "${variants[@]}"; do
  hf_train_export 3 "$v"
  trained+=("$out/$v.export" "$out/$v.trained.safetensors")
done
check "the llama32 export keeps the llama3 rope and the tie" \
  grep -q '"rope_type": "llama3".*"original_max_position_embeddings": 64' \
  "$out/llama32.export/config.json"
check "the qwen2 export is a Qwen2ForCausalLM" \
  grep -q Qwen2ForCausalLM "$out/qwen2.export/config.json"
check "training changed the model" \
  python3 "$helper" differ "$out/qwen2.zero.safetensors" "$out/qwen2.trained.safetensors" 1e-3
check "exported weights: transformers' logits equal zero's of the trained checkpoints" \
  python3 "$helper" compare-all "$out/tokens.txt" 1e-4 "${trained[@]}"

fails_naming() {
  local want=$1 dir=$2
  local msg
  if msg=$("$logits" --model "hf:$dir" --tokens "$out/tokens.txt" --out "$out/x.safetensors" 2>&1); then
    echo "unexpected success"
    return 1
  fi
  grep -qF -- "$want" <<< "$msg" || { echo "error does not name '$want': $msg"; return 1; }
}
cp -r "$out/llama32" "$out/longrope"
python3 "$helper" set-key rope_parameters \
  '{"rope_type": "longrope", "rope_theta": 10000.0, "short_factor": [1], "long_factor": [1]}' \
  "$out/longrope"
check "longrope names rope_parameters.rope_type" \
  fails_naming "rope_parameters.rope_type is 'longrope'" "$out/longrope"
cp -r "$out/qwen2" "$out/sliding"
python3 "$helper" set-key use_sliding_window true "$out/sliding"
check "Qwen2's sliding window names use_sliding_window" \
  fails_naming "use_sliding_window" "$out/sliding"
summary
