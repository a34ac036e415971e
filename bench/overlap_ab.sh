#!/usr/bin/env bash
# The two communication overlaps switched from zero-train's config, A/B on 2 processes: for each
# layout, runs with the overlap on and off in pairs (on, off, on, off, ...: the machine's drift
# falls on both), each run's step-time median from its --summary-json, and one markdown row: the
# median of the runs' medians on and off, the median of the pairs' ratios (on / off; below 1:
# the overlap hides communication), and the exposed communication zero-train reports where it
# has one, and whether each pair ended with the same final loss and parameter checksum (it should
# on the CPU: the overlaps reorder waits, not arithmetic; on a GPU cuBLAS may pick other kernels
# for the TP weight gradient, so the last bits may differ there).
#
#   layout     what         switch
#   p2-1f1b-m8 P2 x D1, 1F1B, 8 micro-batches  pipeline.overlap_p2p_comm (receives posted early)
#   t2         T2 x D1                         tensor_parallel.overlap_comm (column backward)
#   t2-sp      T2 x D1, sequence parallelism   tensor_parallel.overlap_comm
#
# Exposed communication: a pipeline run's summary has each stage's pipeline_comm_s_mean (the
# host time its stage spent in sends and receives per step, the waits included); zero-train
# does not time the tensor-parallel collectives' waits (bench/tp-overlap does, in-process), so
# the t2 rows have none. On a GPU the host time of a receive is not the device's (kernels run
# asynchronously): read the step times there.
#
#   bench/overlap_ab.sh build/examples/zero-train OUT_DIR [--set key=value ...]
# Environment: AB_DEVICE (cpu; cuda: NCCL, one GPU per process), AB_MODEL (tiny), AB_SEQ (64),
# AB_STEPS (6), AB_PAIRS (3), AB_LAYOUTS ("p2-1f1b-m8 t2 t2-sp"), AB_PORT (36100), AB_TORCHRUN
# (torchrun; e.g. "python3 -m torch.distributed.run" where torchrun is not on the PATH). Extra
# arguments go to every run (e.g. --set bf16.enabled=true). Writes OUT_DIR/overlap_ab.md (the
# table), OUT_DIR/ab-<layout>-<on|off>-<i>.{log,json}; exit 1 if a run failed (its log named).
set -euo pipefail
train=$1
out=$2
shift 2
src=$(cd "$(dirname "$0")/.." && pwd)
device=${AB_DEVICE:-cpu}
model=${AB_MODEL:-tiny}
seq=${AB_SEQ:-64}
steps=${AB_STEPS:-6}
pairs=${AB_PAIRS:-3}
layouts=${AB_LAYOUTS:-p2-1f1b-m8 t2 t2-sp}
port=${AB_PORT:-36100}
read -r -a launch <<< "${AB_TORCHRUN:-torchrun}"
mkdir -p "$out"

# The first step pays for connection set-up and allocations: the summary's median covers the
# steps, so steps >= 4 keep it off the figure.
common=(--config "$src/configs/zero2.yaml" --set trainer.device="$device"
        --set trainer.model="$model" --set trainer.seq_len="$seq" --set trainer.steps="$steps"
        --set scheduler.params.total_num_steps="$steps" --set scheduler.params.warmup_num_steps=1
        --set zero_optimization.stage=1 --set steps_per_print="$steps"
        --set train_micro_batch_size_per_gpu=2)
layout_args() {
  case $1 in
    p2-1f1b-m8) echo "--set pipeline.stages=2 --set pipeline.schedule=1f1b --set gradient_accumulation_steps=8" ;;
    t2) echo "--set tensor_parallel.autotp_size=2 --set tensor_parallel.sequence_parallel=false --set gradient_accumulation_steps=1" ;;
    t2-sp) echo "--set tensor_parallel.autotp_size=2 --set tensor_parallel.sequence_parallel=true --set gradient_accumulation_steps=1" ;;
    *) echo "overlap_ab: unknown layout '$1' (p2-1f1b-m8, t2, t2-sp)" >&2; return 2 ;;
  esac
}
switch_key() { [[ $1 == p2-* ]] && echo pipeline.overlap_p2p_comm || echo tensor_parallel.overlap_comm; }

failed=0
load_start=$(cut -d' ' -f1-3 /proc/loadavg)
for layout in $layouts; do
  read -r -a largs <<< "$(layout_args "$layout")"
  key=$(switch_key "$layout")
  for ((i = 0; i < pairs; ++i)); do
    for mode in on off; do
      name="ab-$layout-$mode-$i"
      val=true
      [[ $mode == off ]] && val=false
      timeout 600 "${launch[@]}" --no-python --standalone --nproc-per-node 2 --master-port $((port++)) \
        "$train" "${common[@]}" "${largs[@]}" --set "$key=$val" "$@" \
        --summary-json "$out/$name.json" > "$out/$name.log" 2>&1 \
        || { failed=1; echo "overlap_ab: $name failed (see $out/$name.log)" >&2; tail -5 "$out/$name.log" >&2; }
    done
  done
done
load_end=$(cut -d' ' -f1-3 /proc/loadavg)

python3 - "$out" "$pairs" "$load_start" "$load_end" "$device" "$model" "$seq" "$steps" $layouts <<'PY' | tee "$out/overlap_ab.md"
import json, os, statistics, sys
out, pairs, l0, l1, device, model, seq, steps = sys.argv[1:9]
layouts = sys.argv[9:]
pairs = int(pairs)
def load(n):
    p = os.path.join(out, n + ".json")
    try:
        return json.load(open(p))
    except (OSError, ValueError):
        return None
med = lambda xs: statistics.median(xs) if xs else float("nan")
print(f"{device}, {model}, seq {seq}, {steps} steps per run, {pairs} on/off pairs per layout; "
      f"load average (1, 5, 15 min) {l0} at the start, {l1} at the end")
print()
print("| layout | switch | median step on (s) | median step off (s) | on/off (median of pairs) | "
      "exposed comm on / off (s per step) | final loss, checksum on = off |")
print("|---|---|---|---|---|---|---|")
for layout in layouts:
    key = "pipeline.overlap_p2p_comm" if layout.startswith("p2") else "tensor_parallel.overlap_comm"
    t = {"on": [], "off": []}
    comm = {"on": [], "off": []}
    ratios = []
    same = []  # each pair: the final loss and the parameter checksum equal on and off
    for i in range(pairs):
        s = {m: load(f"ab-{layout}-{m}-{i}") for m in ("on", "off")}
        for m in ("on", "off"):
            if s[m] and s[m].get("step_seconds_median") is not None:
                t[m].append(s[m]["step_seconds_median"])
                st = s[m].get("stages")
                if st:
                    comm[m].append([x.get("pipeline_comm_s_mean", float("nan")) for x in st])
        if s["on"] and s["off"]:
            same.append(all(s["on"].get(k) == s["off"].get(k) for k in ("final_loss", "param_checksum")))
        if all(s[m] and s[m].get("step_seconds_median") for m in ("on", "off")):
            ratios.append(s["on"]["step_seconds_median"] / s["off"]["step_seconds_median"])
    def exposed(m):
        if not comm[m]:
            return "n/a"
        per_stage = zip(*comm[m])
        return "/".join(f"{med(list(v)):.4f}" for v in per_stage)
    ex = ("n/a (zero-train does not time the TP waits)" if not layout.startswith("p2") else
          f"stages {exposed('on')} / {exposed('off')}")
    rng = f" ({min(ratios):.3f}-{max(ratios):.3f})" if ratios else ""
    print(f"| {layout} | {key} | {med(t['on']):.4f} | {med(t['off']):.4f} | "
          f"{med(ratios):.3f}{rng} | {ex} | {sum(same)} of {len(same)} pairs |")
PY
exit $failed
