#!/usr/bin/env bash
# ab_checksum.sh BASE [HEAD]: zero-train built at git revision BASE and at HEAD (a revision; by
# default the working tree's build/) must train bit for bit alike. Runs a small matrix of stages
# 0/1/2 x fp32/bf16/fp16 x accumulation x clipping x optimizer offload x quantized gradients x
# torch_adam, 2 ranks through torchrun, 3 steps of the tiny GPT each, and compares every logged
# loss and the summary's first/final loss, param_checksum and param_norm exactly (17
# significant digits), and the checkpoint each run saves after its last step byte for byte
# (every file: manifest, shards, error-feedback residuals). For a refactoring that must not
# change a single value.
#
# A revision is exported with `git archive` beside the repository ($AB_DIR, default
# <repo>/../.ab-checksum/<sha>; kept, so a second comparison builds nothing), where ccache's
# base_dir still matches its paths, and built there (/work/bin/zbuild when present, else
# ninja), target zero-train only. To compare uncommitted work without freezing the tree, pass
# a commit of it: c=$(git commit-tree $(git write-tree) -p HEAD -m wip) after `git add`.
# Exit status: 0 when every run matches.
set -euo pipefail
base=${1:?usage: ab_checksum.sh BASE [HEAD]}
head_rev=${2:-}
root=$(git rev-parse --show-toplevel)
ab_dir=${AB_DIR:-$(dirname "$root")/.ab-checksum}
build() {  # build DIR TARGET...
  # Built and up to date: nothing to wait for (zbuild queues on a lock shared by every build).
  if [[ -x $1/examples/zero-train ]] &&
     ! ninja -C "$1" -n "${@:2}" 2>/dev/null | grep -qE "Building|Linking"; then
    return 0
  fi
  if [[ -x /work/bin/zbuild ]]; then /work/bin/zbuild "$@"; else ninja -C "$@"; fi
}
export_and_build() {  # export_and_build REV: prints the built zero-train's path
  local sha src
  sha=$(git -C "$root" rev-parse --verify "$1^{commit}")
  src=$ab_dir/$sha
  if [[ ! -e $src/.extracted ]]; then
    mkdir -p "$src"
    git -C "$root" archive "$sha" | tar -x -C "$src"
    touch "$src/.extracted"
  fi
  if [[ ! -e $src/build/build.ninja ]]; then
    cmake -S "$src" -B "$src/build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo > /dev/null
  fi
  build "$src/build" zero-train > "$src/build.log" 2>&1 || { tail -30 "$src/build.log" >&2; exit 1; }
  echo "$src/build/examples/zero-train"
}
base_sha=$(git -C "$root" rev-parse --short "$base^{commit}")
base_train=$(export_and_build "$base")
if [[ -n $head_rev ]]; then
  head_name=$(git -C "$root" rev-parse --short "$head_rev^{commit}")
  head_train=$(export_and_build "$head_rev")
else
  head_name="working tree"
  build "$root/build" zero-train > "$root/build/ab-head.log" 2>&1 || { tail -30 "$root/build/ab-head.log"; exit 1; }
  head_train=$root/build/examples/zero-train
fi

# One run per line: a name, then --set overrides on top of configs/zero2.yaml.
runs=()
for stage in 0 1 2; do
  runs+=("s${stage}_fp32 zero_optimization.stage=$stage")
  runs+=("s${stage}_bf16 zero_optimization.stage=$stage bf16.enabled=true")
  runs+=("s${stage}_fp16 zero_optimization.stage=$stage fp16.enabled=true")
  runs+=("s${stage}_fp32_torch_adam zero_optimization.stage=$stage optimizer.params.torch_adam=true")
done
runs+=("s0_fp32_noclip zero_optimization.stage=0 gradient_clipping=0")
runs+=("s2_fp32_noclip zero_optimization.stage=2 gradient_clipping=0")
for stage in 0 1 2; do
  runs+=("s${stage}_fp32_accum2 zero_optimization.stage=$stage gradient_accumulation_steps=2 train_micro_batch_size_per_gpu=2")
done
runs+=("s1_bf16_accum2 zero_optimization.stage=1 bf16.enabled=true gradient_accumulation_steps=2 train_micro_batch_size_per_gpu=2")
runs+=("s2_bf16_accum2_bf16acc zero_optimization.stage=2 bf16.enabled=true gradient_accumulation_steps=2 train_micro_batch_size_per_gpu=2 data_types.grad_accum_dtype=bf16")
for stage in 1 2; do
  runs+=("s${stage}_fp32_offload zero_optimization.stage=$stage zero_optimization.offload_optimizer.device=cpu")
  runs+=("s${stage}_bf16_offload_accum2 zero_optimization.stage=$stage bf16.enabled=true zero_optimization.offload_optimizer.device=cpu gradient_accumulation_steps=2 train_micro_batch_size_per_gpu=2")
  runs+=("s${stage}_fp32_quantized zero_optimization.stage=$stage zero_optimization.zero_quantized_gradients=true")
done
runs+=("s2_bf16_quantized_accum2 zero_optimization.stage=2 bf16.enabled=true zero_optimization.zero_quantized_gradients=true gradient_accumulation_steps=2 train_micro_batch_size_per_gpu=2")
runs+=("s2_fp32_allreduce zero_optimization.stage=2 zero_optimization.reduce_scatter=false")
runs+=("s1_fp32_no_overlap zero_optimization.stage=1 zero_optimization.overlap_comm=false")

out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
port=$((20000 + RANDOM % 20000))
common=(--config "$root/configs/zero2.yaml" --set trainer.model=tiny --set trainer.steps=3
        --set trainer.seq_len=16 --set train_micro_batch_size_per_gpu=4 --set steps_per_print=1
        --set zero_optimization.reduce_bucket_size=2000)
# The figures a run must reproduce: every loss line of rank 0's log and the summary's values.
figures() {  # figures LOG JSON
  grep -o 'loss[ =:]*[-0-9.e+naif]*' "$1" || true
  python3 -c '
import json, sys
s = json.load(open(sys.argv[1]))
for k in ("first_loss", "final_loss", "param_checksum", "param_norm", "skipped_steps"):
    print(k, repr(s[k]))' "$2"
}
fail=0
for run in "${runs[@]}"; do
  read -r name sets <<< "$run"
  args=("${common[@]}")
  for s in $sets; do args+=(--set "$s"); done
  for side in base head; do
    train=$base_train
    [[ $side == head ]] && train=$head_train
    port=$((port + 1))
    # One save path for both sides: the manifest records the configuration, save_dir included.
    rm -rf "$out/ckpt"
    if ! torchrun --no-python --standalone --nproc-per-node 2 --master-port $port "$train" \
        "${args[@]}" --set trainer.save_dir="$out/ckpt" --set trainer.save_interval=3 \
        --summary-json "$out/$name.$side.json" > "$out/$name.$side.log" 2>&1; then
      echo "$name: $side run failed"; tail -5 "$out/$name.$side.log"; fail=1; continue 2
    fi
    mv "$out/ckpt" "$out/$name.$side.ckpt"
    figures "$out/$name.$side.log" "$out/$name.$side.json" > "$out/$name.$side.fig"
  done
  files=$(cd "$out/$name.head.ckpt" && find . -type f | wc -l)
  if ! cmp -s "$out/$name.base.fig" "$out/$name.head.fig"; then
    echo "$name: DIFFERS"; diff "$out/$name.base.fig" "$out/$name.head.fig" | head -10; fail=1
  elif ! diff -r "$out/$name.base.ckpt" "$out/$name.head.ckpt" > "$out/$name.ckpt.diff"; then
    echo "$name: values identical, checkpoint DIFFERS"; head -5 "$out/$name.ckpt.diff"; fail=1
  else
    echo "$name: identical ($(grep param_checksum "$out/$name.head.fig"); checkpoint: $files files)"
  fi
done
echo "ab_checksum $base_sha..$head_name: ${#runs[@]} runs, $([[ $fail == 0 ]] && echo all identical || echo DIFFERENCES)"
exit $fail
