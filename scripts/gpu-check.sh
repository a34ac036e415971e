#!/usr/bin/env bash
# The GPU check, for a machine with one NVIDIA GPU, a CUDA build of torch (2.11 / CUDA 13),
# nvcc, CMake and ninja, and no package registry. Within ~10 minutes it
#   1. unpacks the Debian packages from scripts/fetch-gpu-debs.sh into a local prefix,
#   2. builds zero against that torch (so the NCCL group, device_cuda.cpp, device_copy.cpp and
#      every CUDA-gated test compile and link),
#   3. runs the CUDA-gated tests (they skip without a GPU; here they must pass), among them the
#      check that backward()/step() return to the host before the device finishes (no host
#      sync: collectives are waited on by the stream, tests/test_cuda.cpp), and with 2+ GPUs
#      2-process NCCL runs of the trainer through torchrun (stages 1 and 2, a 2-stage pipeline
#      on 1F1B and interleaved, tensor parallelism without and with sequence parallelism; the
#      last three compared with their references' losses in nccl-compare.log) and each
#      communication overlap on and off (bench/overlap_ab.sh: step times, on/off ratios),
#   4. benchmarks the example GPT at ~1.3 B parameters, bf16, sequence 2048, world size 1:
#      ZeRO stage 0 and 2, each with and without activation checkpointing, next to the same
#      model in PyTorch eager Python on the same GPU in the same run,
#   4b. runs LLaMA-3.2-3B's shapes on one GPU in bf16 with the default buckets and checkpointing,
#      with and without optimizer offload (a flat buffer over 2^31 elements, per-phase peaks),
#   5. records the planner's predicted step time (tools/zero-memory's time model) next to it,
# and writes logs, JSON and a markdown table under $OUT (default out/gpu-check).
#
#   scripts/fetch-gpu-debs.sh                      # here, once
#   OUT=/tmp/out scripts/gpu-check.sh              # there (carry gpu-debs/)
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
out=${OUT:-$root/out/gpu-check}
mkdir -p "$out"
start=$(date +%s)
stamp() { echo "gpu-check: $(( $(date +%s) - start ))s: $*" | tee -a "$out/progress.log"; }

# 1. Dependencies from the carried .deb files.
prefix=/tmp/zero-deps
if [[ ! -d $prefix/usr ]]; then
  ls gpu-debs/*.deb > /dev/null || { echo "gpu-check: no gpu-debs/*.deb; run scripts/fetch-gpu-debs.sh here and carry gpu-debs" >&2; exit 2; }
  for deb in gpu-debs/*.deb; do dpkg-deb -x "$deb" "$prefix"; done
fi
export LD_LIBRARY_PATH=$prefix/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$out/gpu.txt"
python3 -c 'import torch;print("torch", torch.__version__, "cuda", torch.version.cuda, torch.cuda.get_device_name(0))' | tee -a "$out/gpu.txt"
stamp "deps unpacked"

# 2. Build. Release: the benchmark should measure optimised code.
cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DZERO_CTEST_PER_CASE=ON \
  -DCMAKE_PREFIX_PATH="$prefix/usr" -DPython3_EXECUTABLE="$(command -v python3)" \
  2>&1 | tee "$out/configure.log" | tail -3
# GPU_CHECK_QUICK=1 (a short device lease): only what steps 3-4 run, no eager baseline, no
# checkpointing variants, no CPU unit tests on this build.
quick=${GPU_CHECK_QUICK:-0}
targets=()
((quick)) && targets=(zero-train zero-memory test_cuda test_offload)
ninja -C build-gpu -k 0 -j "$(nproc)" "${targets[@]}" 2>&1 | tee "$out/build.log" | tail -3
stamp "built"

# 3. CUDA-gated tests (names contain Cuda), then the rest of the unit tests on this CUDA build.
# A failing test is reported and the benchmarks still run (their figures are the other half of
# the evidence).
for t in test_cuda test_offload; do
  build-gpu/tests/$t --gtest_filter='*Cuda*' 2>&1 | tee -a "$out/ctest-cuda.log" | tail -4 \
    || echo "gpu-check: $t failed (see ctest-cuda.log)" | tee -a "$out/progress.log"
done
if ((!quick)); then
  ctest --test-dir build-gpu -E 'Cuda|e2e' -j 8 --output-on-failure --timeout 120 2>&1 \
    | tee "$out/ctest-rest.log" | tail -5 || true
fi
build-gpu/tests/test_cuda --gtest_filter='*ReturnBeforeTheDeviceFinishes*' 2>&1 \
  | tee "$out/no-host-sync.log" | tail -3 || echo "gpu-check: no-host-sync test failed"
stamp "tests done"

# 3b. NCCL: two processes, one GPU each (two ranks may not share a device), a small GPT.
ngpu=$(nvidia-smi -L | wc -l)
if (( ngpu >= 2 )); then
  for stage in 1 2; do
    name="nccl-2proc-s$stage"
    python3 -m torch.distributed.run --standalone --nproc-per-node 2 --no-python \
      build-gpu/examples/zero-train --config configs/zero2.yaml --set trainer.device=cuda \
      --set trainer.model=gpt-25m --set trainer.steps=20 --set scheduler.params.total_num_steps=20 \
      --set scheduler.params.warmup_num_steps=2 --set bf16.enabled=true \
      --set zero_optimization.stage=$stage --set steps_per_print=5 \
      --summary-json "$out/$name.json" > "$out/$name.log" 2>&1 \
      || { tail -20 "$out/$name.log"; echo "gpu-check: $name failed"; }
    stamp "$name"
  done
  # The pipeline runtime over NCCL (issue 21): 2 stages x 1 replica, 1F1B over 4 micro-batches,
  # activations and gradients on the GPUs, gradients on the second (earlier-stage) group. A
  # pipeline run writes no --summary-json yet: the losses go to the metrics file.
  pp_common=(--config configs/zero2.yaml --set trainer.device=cuda --set trainer.model=gpt-25m
             --set trainer.steps=10 --set scheduler.params.total_num_steps=10
             --set scheduler.params.warmup_num_steps=2 --set bf16.enabled=true
             --set zero_optimization.stage=1 --set pipeline.stages=2
             --set gradient_accumulation_steps=4 --set steps_per_print=1)
  name="nccl-2proc-pipeline"
  python3 -m torch.distributed.run --standalone --nproc-per-node 2 --no-python \
    build-gpu/examples/zero-train "${pp_common[@]}" \
    --set trainer.metrics_file="$out/$name.jsonl" > "$out/$name.log" 2>&1 \
    || { tail -20 "$out/$name.log"; echo "gpu-check: $name failed"; }
  stamp "$name"
  # The interleaved schedule over NCCL (never run on NCCL before): the same run with 2 chunks
  # per stage, the last stage's activations going back to stage 0 on the second group. The
  # same layers, batches and accumulation order as the 1F1B run above, so its losses must be
  # the 1F1B run's to bf16 rounding.
  name="nccl-2proc-pipeline-interleaved"
  python3 -m torch.distributed.run --standalone --nproc-per-node 2 --no-python \
    build-gpu/examples/zero-train "${pp_common[@]}" \
    --set pipeline.schedule=interleaved --set pipeline.virtual_stages=2 \
    --set trainer.metrics_file="$out/$name.jsonl" > "$out/$name.log" 2>&1 \
    || { tail -20 "$out/$name.log"; echo "gpu-check: $name failed"; }
  stamp "$name"
  # Tensor parallelism over NCCL (never run on NCCL before; its backward overlaps the input
  # gradient's all-reduce, or the all-gather and reduce-scatter under sequence parallelism,
  # with the weight gradients' products, which only NCCL's stream ordering makes safe): tp 2 x
  # dp 1 without and with sequence parallelism, fp32, against one GPU at tp 1 with the same
  # batches. fp32 so that the comparison can be tight: a buffer reused before its collective
  # finished would move the loss far more than the reduction order's 1e-6.
  tp_common=(--config configs/zero2.yaml --set trainer.device=cuda --set trainer.model=gpt-25m
    --set trainer.steps=10 --set scheduler.params.total_num_steps=10
    --set scheduler.params.warmup_num_steps=2 --set zero_optimization.stage=1
    --set gradient_clipping=0 --set steps_per_print=1)
  name="tp-reference-1gpu"
  build-gpu/examples/zero-train "${tp_common[@]}" --set trainer.metrics_file="$out/$name.jsonl" \
    --summary-json "$out/$name.json" > "$out/$name.log" 2>&1 \
    || { tail -20 "$out/$name.log"; echo "gpu-check: $name failed"; }
  stamp "$name"
  for sp in false true; do
    name="nccl-2proc-tp2"
    [[ $sp == true ]] && name="nccl-2proc-tp2-sp"
    python3 -m torch.distributed.run --standalone --nproc-per-node 2 --no-python \
      build-gpu/examples/zero-train "${tp_common[@]}" --set tensor_parallel.autotp_size=2 \
      --set tensor_parallel.sequence_parallel=$sp --set trainer.metrics_file="$out/$name.jsonl" \
      --summary-json "$out/$name.json" > "$out/$name.log" 2>&1 \
      || { tail -20 "$out/$name.log"; echo "gpu-check: $name failed"; }
    stamp "$name"
  done
  # compare_losses A B TOLERANCE: every step's loss of run B against run A's, relative.
  compare_losses() {
    python3 - "$out" "$@" <<'PY' 2>&1 | tee -a "$out/nccl-compare.log" | tail -1 | tee -a "$out/progress.log"
import json, os, re, sys
out, a, b, tol = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
def losses(n):
    # The metrics writer prints a NaN loss as `nan`, which JSON does not have: read it as NaN
    # (a FAILED line below), never as a parse error that would end gpu-check here.
    p = os.path.join(out, n + ".jsonl")
    rows = [json.loads(re.sub(r"(?<=[:\[,])\s*(-?)(nan|inf)\b",
                              lambda m: m.group(1) + ("NaN" if m.group(2) == "nan" else "Infinity"), l))
            for l in open(p)] if os.path.exists(p) else []
    return {r["step"]: r["loss"] for r in rows}
x, y = losses(a), losses(b)
if not x or sorted(x) != sorted(y):
    print(f"gpu-check: {b} vs {a}: FAILED, steps {sorted(y)} against {sorted(x)}"); sys.exit(0)
worst = max(abs(x[s] - y[s]) / abs(x[s]) for s in x)
worst = float("nan") if any(v != v for v in list(x.values()) + list(y.values())) else worst
for s in sorted(x):
    print(f"step {s}: {a} {x[s]:.7f}  {b} {y[s]:.7f}")
print(f"gpu-check: {b} vs {a}: max rel diff {worst:.1e} over {len(x)} steps "
      f"(tolerance {tol:g}): {'ok' if worst <= tol else 'FAILED'}")
PY
  }
  compare_losses nccl-2proc-pipeline nccl-2proc-pipeline-interleaved 1e-2
  compare_losses tp-reference-1gpu nccl-2proc-tp2 1e-4
  compare_losses tp-reference-1gpu nccl-2proc-tp2-sp 1e-4
  # Exposed communication with and without each overlap (issue 34, N3c), switched from the
  # config: pipeline.overlap_p2p_comm (receives posted early) on P2 1F1B with 8 micro-batches,
  # tensor_parallel.overlap_comm (the column-parallel backward) on T2 without and with SP;
  # gpt-100m, bf16, sequence 1024, on/off runs in pairs. Each run's step-time median and the
  # median on/off ratio per layout, the pipeline stages' communication time (host time: on a GPU
  # read the step times) go to overlap-ab/overlap_ab.md and the end of gpu_check.md.
  ab_steps=12 ab_pairs=3
  ((quick)) && ab_steps=8 ab_pairs=2
  AB_DEVICE=cuda AB_MODEL=gpt-100m AB_SEQ=1024 AB_STEPS=$ab_steps AB_PAIRS=$ab_pairs \
    AB_TORCHRUN="python3 -m torch.distributed.run" \
    bench/overlap_ab.sh build-gpu/examples/zero-train "$out/overlap-ab" --set bf16.enabled=true \
    > "$out/overlap-ab.log" 2>&1 || echo "gpu-check: overlap A/B: a run failed (see overlap-ab.log)" \
    | tee -a "$out/progress.log"
  stamp "overlap A/B"
else
  echo "gpu-check: $ngpu GPU: the 2-process NCCL runs (data parallel, pipeline, interleaved pipeline, tensor parallel) need 2" | tee -a "$out/progress.log"
  mkdir -p "$out/overlap-ab"
  echo "gpu-check: $ngpu GPU: overlap A/B (pipeline.overlap_p2p_comm, tensor_parallel.overlap_comm) skipped: it needs 2 GPUs (NCCL refuses two ranks on one device)" \
    | tee -a "$out/progress.log" > "$out/overlap-ab/overlap_ab.md"
fi

# 4. Benchmarks: gpt-1.3b, bf16, seq 2048, micro-batch 1, world size 1.
train=build-gpu/examples/zero-train
steps=${GPU_CHECK_STEPS:-8}
ckpts=(false true)
((quick)) && ckpts=(false)
for stage in 0 2; do
  for ckpt in "${ckpts[@]}"; do
    name="zero-s${stage}-ckpt-${ckpt}"
    "$train" --config configs/zero2.yaml --set trainer.model=gpt-1.3b --set trainer.seq_len=2048 \
      --set trainer.steps="$steps" --set scheduler.params.total_num_steps="$steps" \
      --set scheduler.params.warmup_num_steps=2 --set train_micro_batch_size_per_gpu=1 \
      --set gradient_accumulation_steps=1 --set bf16.enabled=true --set trainer.device=cuda \
      --set zero_optimization.stage=$stage --set zero_optimization.reduce_bucket_size=5e7 \
      --set trainer.activation_checkpointing=$ckpt --set steps_per_print=1 \
      --set trainer.metrics_file="$out/$name.jsonl" --summary-json "$out/$name.json" \
      > "$out/$name.log" 2>&1 || { tail -20 "$out/$name.log"; echo "gpu-check: $name failed"; }
    stamp "$name"
  done
done
# ZeRO-Offload (issue 13): the same stage-2 run with the optimizer on the host (pinned buffers,
# CPU AdamW): step time, device peak and host bytes against zero-s2-ckpt-false above.
name="zero-s2-offload"
"$train" --config configs/zero2.yaml --set trainer.model=gpt-1.3b --set trainer.seq_len=2048 \
  --set trainer.steps="$steps" --set scheduler.params.total_num_steps="$steps" \
  --set scheduler.params.warmup_num_steps=2 --set train_micro_batch_size_per_gpu=1 \
  --set gradient_accumulation_steps=1 --set bf16.enabled=true --set trainer.device=cuda \
  --set zero_optimization.stage=2 --set zero_optimization.reduce_bucket_size=5e7 \
  --set trainer.activation_checkpointing=false --set zero_optimization.offload_optimizer.device=cpu \
  --set zero_optimization.offload_optimizer.pin_memory=true --set steps_per_print=1 \
  --set trainer.metrics_file="$out/$name.jsonl" --summary-json "$out/$name.json" \
  > "$out/$name.log" 2>&1 || { tail -20 "$out/$name.log"; echo "gpu-check: $name failed"; }
stamp "$name"
# 4b. LLaMA-3.2-3B's shapes on one GPU (issue 21): bf16, the default buckets (reduce_bucket_size
# 5e8), activation checkpointing, 3 steps. The flat buffer holds 3.2 G elements (> 2^31: every
# fused call and index over it), step 1 is the checkpointed first pass (late gradients), the
# buckets are re-ordered after it, and the summary's per-phase peaks come from the allocator.
# Then the same with the optimizer offloaded (host step, pinned shards, copy stream).
for variant in device offload; do
  name="llama3b-$variant"
  extra=()
  [[ $variant == offload ]] && extra=(--set zero_optimization.offload_optimizer.device=cpu
    --set zero_optimization.offload_optimizer.pin_memory=true)
  "$train" --config configs/zero2.yaml --set trainer.model=llama-3b --set trainer.seq_len=2048 \
    --set trainer.steps=3 --set scheduler.params.total_num_steps=3 \
    --set scheduler.params.warmup_num_steps=1 --set train_micro_batch_size_per_gpu=1 \
    --set gradient_accumulation_steps=1 --set bf16.enabled=true --set trainer.device=cuda \
    --set trainer.activation_checkpointing=true --set steps_per_print=1 "${extra[@]}" \
    --summary-json "$out/$name.json" > "$out/$name.log" 2>&1 \
    || { tail -20 "$out/$name.log"; echo "gpu-check: $name failed"; }
  stamp "$name"
done
eager_runs=("" --checkpointing)
((quick)) && eager_runs=()
for ckpt in "${eager_runs[@]}"; do
  name="eager${ckpt:+-ckpt}"
  python3 bench/torch_eager_gpt.py --dim 2048 --layers 24 --heads 16 --vocab 32000 \
    --seq-len 2048 --micro-batch 1 --steps "$steps" $ckpt --out "$out/$name.json" \
    > "$out/$name.log" 2>&1 || { tail -20 "$out/$name.log"; echo "gpu-check: $name failed"; }
  stamp "$name"
done

# 5. The planner's time model for the same runs (issue 16), for predicted vs measured below.
gpu_kind=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | tr 'A-Z' 'a-z' \
  | grep -o -E 'a100|h100|h200' | head -1 || true)
for ckpt in none checkpoint; do
  build-gpu/tools/zero-memory --model gpt-1.3b --gpus 1 --micro-batch 1 --seq-len 2048 \
    --bucket-size 5e7 --gpu "${gpu_kind:-h100}" --recompute $ckpt > "$out/time-model-$ckpt.txt" 2>&1 \
    || echo "gpu-check: zero-memory --recompute $ckpt failed"
done
stamp "time model"

python3 - "$out" <<'PY' | tee "$out/gpu_check.md"
import json, os, sys
out = sys.argv[1]
def load(n):
    p = os.path.join(out, n + ".json")
    return json.load(open(p)) if os.path.exists(p) else None
print("| implementation | ZeRO stage | checkpointing | tokens/s | MFU | peak allocated (GiB) | vs eager |")
print("|---|---|---|---|---|---|---|")
eager = {c: load("eager" + ("-ckpt" if c else "")) for c in (False, True)}
for stage in (0, 2):
    for ckpt in (False, True):
        s = load(f"zero-s{stage}-ckpt-{'true' if ckpt else 'false'}")
        if not s:
            print(f"| zero | {stage} | {ckpt} | failed | | | |"); continue
        e = eager[ckpt]
        tps = s["tokens_per_s_mean"]
        ratio = f"{tps / e['tokens_per_s']:.2f}x" if e else "n/a"
        print(f"| zero | {stage} | {ckpt} | {tps:.0f} | {100 * s.get('mfu_mean', 0):.1f}% | "
              f"{s.get('device_peak_allocated_bytes', 0) / 2**30:.1f} | {ratio} |")
for ckpt, e in eager.items():
    if e:
        print(f"| PyTorch eager | - | {ckpt} | {e['tokens_per_s']:.0f} | {100 * e['mfu']:.1f}% | "
              f"{e['peak_allocated_bytes'] / 2**30:.1f} | 1.00x |")
def predicted(ckpt, stage):
    # The "= step" row of zero-memory's time table: seconds per step at stages 0, 1, 2.
    p = os.path.join(out, f"time-model-{'checkpoint' if ckpt else 'none'}.txt")
    if not os.path.exists(p):
        return None
    for line in open(p):
        if line.strip().startswith("= step"):
            return float(line.split()[2 + stage])
    return None
print()
print("| ZeRO stage | checkpointing | predicted step (s) | measured median step (s) | error |")
print("|---|---|---|---|---|")
for stage in (0, 2):
    for ckpt in (False, True):
        s = load(f"zero-s{stage}-ckpt-{'true' if ckpt else 'false'}")
        p = predicted(ckpt, stage)
        m = s.get("step_seconds_median") if s else None
        err = f"{100 * (p - m) / m:+.0f}%" if p and m else "n/a"
        print(f"| {stage} | {ckpt} | {p if p else 'n/a'} | {m if m else 'n/a'} | {err} |")
# ZeRO-Offload against the same stage-2 run on the device (both without checkpointing): the
# step time it costs, the device memory it saves, and the host bytes it holds per rank (the
# engine's report, beside the process's peak RSS, which the allocator and not the engine saw).
print()
print("| ZeRO-2 gpt-1.3b | median step (s) | optimizer (s) | device peak (GiB) | host measured / "
      "predicted (GiB) | peak RSS (GiB) |")
print("|---|---|---|---|---|---|")
for label, name in (("on the device", "zero-s2-ckpt-false"), ("optimizer offload", "zero-s2-offload")):
    s = load(name)
    if not s:
        print(f"| {label} | failed | | | | |"); continue
    mem = s.get("memory") or [{}]
    host = max(m.get("host_measured", 0) for m in mem)
    host_p = max(m.get("host_predicted", 0) for m in mem)
    print(f"| {label} | {s.get('step_seconds_median', float('nan')):.3f} | "
          f"{s.get('optimizer_s_mean', float('nan')):.3f} | "
          f"{s.get('device_peak_allocated_bytes', 0) / 2**30:.2f} | "
          f"{host / 2**30:.2f} / {host_p / 2**30:.2f} | {s.get('peak_rss_bytes', 0) / 2**30:.2f} |")
print()
print("| LLaMA-3B shapes, 1 GPU, bf16, checkpointing | median step (s) | device peak (GiB) | "
      "phase peaks, measured / predicted (GiB) |")
print("|---|---|---|---|")
for name in ("llama3b-device", "llama3b-offload"):
    s = load(name)
    if not s:
        print(f"| {name} | failed (see {name}.log) | | |"); continue
    phases = "; ".join(
        f"{k}: {(v.get('measured') or 0) / 2**30:.1f} / {(v.get('predicted') or 0) / 2**30:.1f}"
        for k, v in (s.get("phase_peaks") or {}).items())
    print(f"| {name} | {s.get('step_seconds_median', float('nan')):.3f} | "
          f"{s.get('device_peak_allocated_bytes', 0) / 2**30:.1f} | {phases} |")
on, off = load("zero-s2-offload"), load("zero-s2-ckpt-false")
if on and off and off.get("step_seconds_median") and off.get("device_peak_allocated_bytes"):
    print(f"\noffload/device: step time {on['step_seconds_median'] / off['step_seconds_median']:.2f}x, "
          f"device peak {on['device_peak_allocated_bytes'] / off['device_peak_allocated_bytes']:.2f}x")
PY
# The overlap A/B's table (or the line saying why it was skipped), after the benchmarks'.
if [[ -f $out/overlap-ab/overlap_ab.md ]]; then
  { echo; echo "Overlap A/B (bench/overlap_ab.sh, 2 processes on NCCL):"; cat "$out/overlap-ab/overlap_ab.md"; } \
    | tee -a "$out/gpu_check.md"
fi
stamp "done"
