#!/usr/bin/env bash
# Hugging Face interop for the model shapes beyond plain LLaMA, against transformers itself:
# each RoPE type transformers ships for LLaMA (llama3 with a tied head as in Llama 3.2, linear,
# dynamic, yarn), LLaMA's attention_bias, Qwen2 (q/k/v biases) untied and tied, and Mistral
# (sliding_window null, and one of max_position_embeddings, which masks nothing). For each:
# the model transformers saved loads into zero with logits equal to transformers' bit for bit
# (fp32); 2 ranks fine-tune it with ZeRO-2; zero-consolidate --format hf exports the result and
# transformers' logits of the export equal zero's of the trained checkpoint (<= 1e-4; Mistral's
# bit for bit, and zero reloads its export bit for bit). A rope type the GPT cannot express
# (longrope), Qwen2's sliding window and a Mistral window shorter than the positions fail naming
# the key.
# Skipped (exit 77) when the transformers package is absent.
set -euo pipefail
source "$2/tests/e2e/lib/hf.sh" "$@"  # train, src, logits, ..., out; skips without transformers
port=$((35500 + RANDOM % 2000))
variants=(llama32 linear dynamic yarn llama-bias qwen2 qwen2-tied mistral mistral-window)

hf_helper make-variants "$out"
loaded=() trained=()
for v in "${variants[@]}"; do
  "$logits" --model "hf:$out/$v" --tokens "$out/tokens.txt" --out "$out/$v.zero.safetensors"
  loaded+=("$out/$v" "$out/$v.zero.safetensors")
done
check "loaded weights: zero's logits equal transformers' bit for bit (${variants[*]})" \
  hf_helper compare-all "$out/tokens.txt" 0 "${loaded[@]}"

for v in "${variants[@]}"; do
  hf_train_export 3 "$v"
  trained+=("$out/$v.export" "$out/$v.trained.safetensors")
done
check "the llama32 export keeps the llama3 rope and the tie" \
  grep -q '"rope_type": "llama3".*"original_max_position_embeddings": 64' \
  "$out/llama32.export/config.json"
check "the qwen2 export is a Qwen2ForCausalLM" \
  grep -q Qwen2ForCausalLM "$out/qwen2.export/config.json"
for v in mistral mistral-window; do
  check "the $v export is a MistralForCausalLM" \
    grep -q '"architectures": \["MistralForCausalLM"\]' "$out/$v.export/config.json"
done
check "the mistral export keeps sliding_window null, mistral-window's 128" \
  python3 -c 'import json, sys
a, b = (json.load(open(f"{d}/config.json"))["sliding_window"] for d in sys.argv[1:])
sys.exit(0 if (a, b) == (None, 128) else 1)' "$out/mistral.export" "$out/mistral-window.export"
check "mistral: transformers' logits of the export equal zero's of the trained checkpoint bit for bit" \
  hf_helper compare-all "$out/tokens.txt" 0 "$out/mistral.export" \
  "$out/mistral.trained.safetensors" "$out/mistral-window.export" \
  "$out/mistral-window.trained.safetensors"
"$logits" --model "hf:$out/mistral.export" --tokens "$out/tokens.txt" \
  --out "$out/mistral.reloaded.safetensors"
check "mistral: zero reloads its export bit for bit (logits of the reload = of the checkpoint)" \
  python3 -c 'import sys
from safetensors.torch import load_file
a, b = (load_file(p)["logits"] for p in sys.argv[1:])
sys.exit(0 if a.shape == b.shape and bool((a == b).all()) else 1)' \
  "$out/mistral.reloaded.safetensors" "$out/mistral.trained.safetensors"
check "training changed the model" \
  hf_helper differ "$out/qwen2.zero.safetensors" "$out/qwen2.trained.safetensors" 1e-3
check "exported weights: transformers' logits equal zero's of the trained checkpoints" \
  hf_helper compare-all "$out/tokens.txt" 1e-4 "${trained[@]}"

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
hf_helper set-key rope_parameters \
  '{"rope_type": "longrope", "rope_theta": 10000.0, "short_factor": [1], "long_factor": [1]}' \
  "$out/longrope"
check "longrope names rope_parameters.rope_type" \
  fails_naming "rope_parameters.rope_type is 'longrope'" "$out/longrope"
cp -r "$out/qwen2" "$out/sliding"
hf_helper set-key use_sliding_window true "$out/sliding"
check "Qwen2's sliding window names use_sliding_window" \
  fails_naming "use_sliding_window" "$out/sliding"
cp -r "$out/mistral" "$out/mistral-short"
hf_helper set-key sliding_window 32 "$out/mistral-short"
check "a Mistral window shorter than the positions names sliding_window" \
  fails_naming "sliding_window is 32, below max_position_embeddings 128" "$out/mistral-short"
python3 - "$out/mistral-short/config.json" <<'PY'
import json, sys
cfg = json.load(open(sys.argv[1]))
del cfg["sliding_window"]
cfg["max_position_embeddings"] = 8192
json.dump(cfg, open(sys.argv[1], "w"))
PY
check "an absent sliding_window is MistralConfig's 4096: refused by name below 8192 positions" \
  fails_naming "sliding_window is 4096 (MistralConfig's default), below max_position_embeddings 8192" \
  "$out/mistral-short"
summary
